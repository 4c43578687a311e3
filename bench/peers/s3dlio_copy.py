"""s3dlio (Rust, AWS SDK underneath): its download and upload of a prefix."""

import os

import s3dlio
from common import ENDPOINT, REGION, arguments, local_files


def main():
    args = arguments()
    s3dlio.configure_s3(endpoint_url=ENDPOINT, region=REGION)
    uri = f"s3://{args.bucket}/{args.prefix}"
    if args.direction == "download":
        s3dlio.download(uri, os.path.abspath(args.local), max_in_flight=args.concurrency, recursive=True)
    else:
        # upload() takes file patterns and flattens them under the prefix, so
        # each subdirectory is uploaded to its own sub-prefix.
        by_dir = {}
        for rel, path in local_files(args.local):
            by_dir.setdefault(os.path.dirname(rel), []).append(str(path))
        for rel_dir, paths in sorted(by_dir.items()):
            dest = uri + (rel_dir + "/" if rel_dir else "")
            s3dlio.upload(paths, dest, max_in_flight=args.concurrency)


if __name__ == "__main__":
    main()
