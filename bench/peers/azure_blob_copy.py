"""The Azure SDK for Python (azure-storage-blob): list, then a thread pool
of C workers, one blob each, every blob itself split across the SDK's own
`max_concurrency` ranges or blocks when few blobs share the budget."""

import os
from concurrent.futures import ThreadPoolExecutor

from azure.storage.blob import ContainerClient
from common import ENDPOINT, arguments, local_files, target_path


def main():
    args = arguments()
    container = ContainerClient(ENDPOINT, args.bucket, credential={
        "account_name": os.environ["AZURE_STORAGE_ACCOUNT"], "account_key": os.environ["AZURE_STORAGE_KEY"]})

    def download(name):
        with open(target_path(args.local, args.prefix, name), "wb") as f:
            container.download_blob(name, max_concurrency=per_blob).readinto(f)

    def upload(item):
        rel, path = item
        with open(path, "rb") as f:
            container.upload_blob(args.prefix + rel, f, overwrite=True, max_concurrency=per_blob)

    if args.direction == "download":
        work, action = [b.name for b in container.list_blobs(name_starts_with=args.prefix)], download
    else:
        work, action = list(local_files(args.local)), upload
    # The concurrency budget is shared: C blobs at once, or fewer blobs
    # with C / blobs requests each.
    per_blob = max(1, args.concurrency // max(1, min(len(work), args.concurrency)))
    with ThreadPoolExecutor(args.concurrency) as pool:
        list(pool.map(action, work))


if __name__ == "__main__":
    main()
