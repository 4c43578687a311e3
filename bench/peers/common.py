"""Shared by the peer scripts: arguments and walking a local tree."""

import argparse
import os
from pathlib import Path

ENDPOINT = os.environ["BENCH_ENDPOINT"]
# S3 peers only (bench/stores.py runs Azure peers without them).
ACCESS_KEY = os.environ.get("AWS_ACCESS_KEY_ID", "")
SECRET_KEY = os.environ.get("AWS_SECRET_ACCESS_KEY", "")
REGION = os.environ.get("AWS_REGION", "us-east-1")


def arguments(extra=None):
    """direction bucket prefix local --concurrency C"""
    parser = argparse.ArgumentParser()
    parser.add_argument("direction", choices=["download", "upload"])
    parser.add_argument("bucket")
    parser.add_argument("prefix")
    parser.add_argument("local")
    parser.add_argument("--concurrency", type=int, default=32)
    if extra:
        extra(parser)
    args = parser.parse_args()
    args.prefix = args.prefix.rstrip("/") + "/"
    return args


def local_files(root):
    """(relative key, path) of every file below root."""
    root = Path(root)
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if not rel.startswith(".") and "/." not in rel:
                yield rel, path


def target_path(local, prefix, key):
    path = Path(local) / key[len(prefix):]
    path.parent.mkdir(parents=True, exist_ok=True)
    return path
