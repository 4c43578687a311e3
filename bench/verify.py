"""What verification costs on large objects: ferry-stager at `--verify
checksum` (its default) and at `--verify size`, beside s5cmd, rclone and the
AWS CRT client, on the same objects in one local MinIO.

Three shapes of 1 GiB each, one per kind of checksum a store keeps for large
objects:

  crc-full-object   16 x 64 MiB, single PUTs with a full-object CRC32 (what
                    boto3 and the AWS CLI send by default)
  md5-single-part   16 x 64 MiB, single PUTs without a checksum: the ETag,
                    the content's MD5, is the only one
  multipart-etag    4 x 256 MiB, multipart uploads in 16 MiB parts without
                    checksums: an MD5 of the parts' MD5s (s5cmd, rclone,
                    older SDKs)

Runs alternate between the tools, `--reps` rounds, each into an empty
directory after the previous run's writes are flushed (`sync`), so one run's
dirty pages are not the next one's write-back. Each run's wall time, user
and system CPU seconds and peak RSS are measured by bench/measure; the
report gives medians and ratios, and ferry-stager's own summary says what it
verified and what that cost (`verify_cost`).

    bench/run --verify [--reps 5] [--shapes crc-full-object,...] [--report FILE]
"""

import argparse
import io
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import ACCESS_KEY, BUCKET, MIB, SECRET_KEY, Minio, commands, peer_env, tool  # noqa: E402

SHAPES = {
    "crc-full-object": (16, 64 * MIB),
    "md5-single-part": (16, 64 * MIB),
    "multipart-etag": (4, 256 * MIB),
}
SMOKE = {"crc-full-object": (2, 9 * MIB), "md5-single-part": (2, 9 * MIB), "multipart-etag": (1, 33 * MIB)}
# (label, tool name for bench.commands, extra ferry-stager arguments)
RUNNERS = [
    ("ferry (checksum)", "ferry", ["--verify", "checksum"]),
    ("ferry (size)", "ferry", ["--verify", "size"]),
    ("s5cmd", "s5cmd", []),
    ("rclone", "rclone", []),
    ("aws-crt", "aws-crt", []),
]
# What ferry-stager's summary must say it verified each shape against.
KIND = {"crc-full-object": "crc32", "md5-single-part": "md5", "multipart-etag": "etag_multipart"}


def client(minio, checksums):
    """A boto3 client; `checksums=False` sends none unless the API requires one."""
    config = Config(s3={"addressing_style": "path"}, max_pool_connections=16,
                    request_checksum_calculation="when_supported" if checksums else "when_required")
    return boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=ACCESS_KEY,
                        aws_secret_access_key=SECRET_KEY, region_name="us-east-1", config=config)


def body(shape, index, size):
    """Reproducible random bytes of one object."""
    rng = random.Random(f"{shape}-{index}")
    # In pieces: one call's bit count must fit a C int.
    return b"".join(rng.randbytes(min(16 * MIB, size - at)) for at in range(0, size, 16 * MIB))


def upload(minio, shape, count, size):
    """Puts one shape's objects as its kind of writer does."""
    if shape == "crc-full-object":
        s3, kind = client(minio, True), {"ChecksumAlgorithm": "CRC32"}
    else:
        s3, kind = client(minio, False), {}
    for i in range(count):
        key, data = f"{shape}/obj-{i:02d}.bin", body(shape, i, size)
        if shape == "multipart-etag":
            config = TransferConfig(multipart_threshold=16 * MIB, multipart_chunksize=16 * MIB)
            s3.upload_fileobj(io.BytesIO(data), BUCKET, key, Config=config)
        else:
            s3.put_object(Bucket=BUCKET, Key=key, Body=data, **kind)


def run(cmd, env, log):
    """One measured run: wall, user, system seconds, peak RSS bytes, exit code."""
    with tempfile.NamedTemporaryFile("r", suffix=".measure") as result:
        subprocess.run([tool("measure"), "-t", "300", result.name] + cmd, env=env, stdout=log, stderr=log, check=True)
        wall, _, rss_kib, code, timed_out, user, system = result.read().split()
    return {"wall": float(wall), "user": float(user), "sys": float(system), "rss": int(rss_kib) * 1024,
            "ok": code == "0" and timed_out == "0"}


def same_tree(a, b):
    files = lambda root: sorted(p.relative_to(root) for p in Path(root).rglob("*")
                                if p.is_file() and ".ferry" not in p.parts)
    left, right = files(a), files(b)
    return left == right and all(Path(a, p).read_bytes() == Path(b, p).read_bytes() for p in left)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--tools", default=",".join(label for label, _, _ in RUNNERS))
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=32, help="the peers' concurrency (ferry: its default)")
    parser.add_argument("--smoke", action="store_true", help="tiny objects, one round: proves the harness works")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    parser.add_argument("--report", default=None)
    args = parser.parse_args()
    shapes = {name: (SMOKE if args.smoke else SHAPES)[name] for name in args.shapes.split(",") if name}
    runners = [r for r in RUNNERS if r[0] in args.tools.split(",")]
    reps = 1 if args.smoke else args.reps
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / "verify-runs.log", "wb")
    work = Path(tempfile.mkdtemp(prefix="ferry-verify-"))
    store = Path(tempfile.mkdtemp(prefix="ferry-verify-minio-", dir="/dev/shm"))
    minio = Minio(store, out / "verify-minio.log")
    results = []
    try:
        env = peer_env(minio)
        client(minio, False).create_bucket(Bucket=BUCKET)
        for shape, (count, size) in shapes.items():
            upload(minio, shape, count, size)
            reference = work / "reference"
            print(f"== {shape}: {count} x {size // MIB} MiB", flush=True)
            for rep in range(reps):
                # Rounds start with a different tool each time, so that no
                # tool always runs first (or after the same other one).
                order = runners[rep % len(runners):] + runners[:rep % len(runners)]
                for label, name, extra in order:
                    dest = work / "dest"
                    shutil.rmtree(dest, ignore_errors=True)
                    dest.mkdir()
                    os.sync()
                    cmd = commands(name, "download", shape, str(dest), None if name == "ferry" else args.concurrency,
                                   minio.endpoint)
                    summary = work / "summary.json"
                    if name == "ferry":
                        cmd += extra + ["--summary-file", str(summary)]
                    measured = run(cmd, env, log)
                    if name == "ferry" and measured["ok"]:
                        done = json.loads(summary.read_text())
                        measured["verified"] = done["verified"]
                        measured["verify_cost"] = done.get("verify_cost", {})
                        want = KIND[shape] if "checksum" in extra else "size_only"
                        if done["verified"].get(want) != count:
                            raise SystemExit(f"{label} on {shape} verified {done['verified']}, not {count} {want}")
                    if not reference.exists():
                        dest.rename(reference)
                    elif not same_tree(reference, dest):
                        raise SystemExit(f"{label} on {shape} did not copy the same bytes")
                    results.append(dict(measured, shape=shape, tool=label, rep=rep))
                    cost = measured.get("verify_cost", {})
                    print(f"  {label:17} {measured['wall']:6.2f} s  user {measured['user']:5.2f}  "
                          f"sys {measured['sys']:5.2f}  RSS {measured['rss'] / MIB:6.0f} MiB"
                          + (f"  hashing {cost['cpu_seconds']:.2f} CPU s" if cost else ""), flush=True)
            shutil.rmtree(reference, ignore_errors=True)
    finally:
        minio.stop()
        shutil.rmtree(store, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    report = markdown(results, shapes, reps, sys.argv[1:])
    (out / "verify.json").write_text(json.dumps(results, indent=2))
    (out / "verify.md").write_text(report)
    if args.report:
        Path(args.report).write_text(report)
    print(report)
    return 0 if all(r["ok"] for r in results) else 1


def markdown(results, shapes, reps, argv):
    """The table: medians per shape and tool, and ferry's ratios."""
    median = lambda rows, key: statistics.median(r[key] for r in rows)
    lines = [f"`bench/run --verify {' '.join(argv)}`: medians of {reps} alternating runs, MinIO in RAM, "
             "destination on disk, `sync` before each run.", "",
             "| shape | tool | wall s | user s | system s | peak RSS MiB | hashing CPU s | "
             "ferry (checksum) speed-up |", "|---|---|---|---|---|---|---|---|"]
    for shape, (count, size) in shapes.items():
        rows = [r for r in results if r["shape"] == shape and r["ok"]]
        tools = list(dict.fromkeys(r["tool"] for r in rows))
        ferry = [r for r in rows if r["tool"] == "ferry (checksum)"]
        for t in tools:
            mine = [r for r in rows if r["tool"] == t]
            hashing = [r["verify_cost"].get("cpu_seconds", 0.0) for r in mine if r.get("verify_cost")]
            ratio = f"{median(mine, 'wall') / median(ferry, 'wall'):.2f}x" if ferry else ""
            lines.append(f"| {shape} ({count} x {size // MIB} MiB) | {t} | {median(mine, 'wall'):.2f} | "
                         f"{median(mine, 'user'):.2f} | {median(mine, 'sys'):.2f} | "
                         f"{max(r['rss'] for r in mine) / MIB:.0f} | "
                         f"{f'{statistics.median(hashing):.2f}' if hashing else ''} | {ratio} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
