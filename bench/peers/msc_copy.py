"""NVIDIA multi-storage-client with its Rust client: msc.sync of a prefix.

With the Rust client on one side and a local directory on the other, MSC
runs one process and MSC_NUM_THREADS_PER_PROCESS worker threads; the Rust
client's own request concurrency is `max_concurrency`.
"""

import json
import os
import tempfile

from common import ACCESS_KEY, ENDPOINT, REGION, SECRET_KEY, arguments


def main():
    args = arguments()
    config = {"profiles": {"bench": {
        "storage_provider": {"type": "s3", "options": {
            "base_path": args.bucket, "endpoint_url": ENDPOINT, "region_name": REGION,
            "max_concurrency": args.concurrency, "max_pool_connections": args.concurrency,
            # The Rust client refuses plain http unless told (a local MinIO).
            "rust_client": {"allow_http": ENDPOINT.startswith("http://")},
        }},
        "credentials_provider": {"type": "S3Credentials",
                                 "options": {"access_key": ACCESS_KEY, "secret_key": SECRET_KEY}},
    }}}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(config, f)
    os.environ["MSC_CONFIG"] = f.name
    os.environ.setdefault("MSC_NUM_THREADS_PER_PROCESS", str(args.concurrency))
    import multistorageclient as msc  # reads MSC_CONFIG

    remote = f"msc://bench/{args.prefix}"
    local = os.path.abspath(args.local)
    if args.direction == "download":
        msc.sync(remote, local)
    else:
        msc.sync(local, remote)
    os.unlink(f.name)


if __name__ == "__main__":
    main()
