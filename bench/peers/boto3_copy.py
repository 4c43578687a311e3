"""boto3's transfer managers: the AWS CRT client (awscrt through s3transfer)
or the classic thread-pool one, copying a whole prefix."""

import boto3
from botocore.config import Config
from common import ACCESS_KEY, ENDPOINT, REGION, SECRET_KEY, arguments, local_files, target_path


def main():
    args = arguments(lambda p: p.add_argument("--client", choices=["crt", "classic"], required=True))
    session = boto3.session.Session(aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
                                     region_name=REGION)
    config = Config(max_pool_connections=args.concurrency, s3={"addressing_style": "path"},
                    retries={"max_attempts": 3})
    client = session.client("s3", endpoint_url=ENDPOINT, config=config)
    manager = crt_manager(session, args) if args.client == "crt" else classic_manager(client, args)
    futures = []
    with manager:
        if args.direction == "download":
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=args.bucket, Prefix=args.prefix):
                for obj in page.get("Contents", []):
                    path = target_path(args.local, args.prefix, obj["Key"])
                    futures.append(manager.download(args.bucket, obj["Key"], str(path)))
        else:
            for rel, path in local_files(args.local):
                futures.append(manager.upload(str(path), args.bucket, args.prefix + rel))
        for future in futures:
            future.result()


def classic_manager(client, args):
    from s3transfer.manager import TransferConfig, TransferManager
    return TransferManager(client, TransferConfig(max_request_concurrency=args.concurrency))


def crt_manager(session, args):
    from s3transfer.crt import (BotocoreCRTCredentialsWrapper, BotocoreCRTRequestSerializer,
                                CRTTransferManager, create_s3_crt_client)
    credentials = BotocoreCRTCredentialsWrapper(session.get_credentials()).to_crt_credentials_provider()
    # The CRT client sizes its connection pool from a throughput target, not a
    # request count; 10 Gbps keeps it from being the limit on one machine.
    crt = create_s3_crt_client(REGION, crt_credentials_provider=credentials, target_throughput=10e9 / 8,
                               use_ssl=ENDPOINT.startswith("https://"))
    serializer = BotocoreCRTRequestSerializer(session._session, client_kwargs={
        "endpoint_url": ENDPOINT, "region_name": REGION, "config": Config(s3={"addressing_style": "path"})})
    return CRTTransferManager(crt, serializer)


if __name__ == "__main__":
    main()
