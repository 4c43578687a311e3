"""Saving checkpoints to object storage while training goes on.

Each checkpoint is a directory of named tensors (here: bytes standing in for
them) written as objects under ``URI/step-NNNNNN/``, and an ``index.json``
written last: a reader that finds the index knows every tensor it lists is
complete. The writes are awaitables; the bytes move on Ferry's own threads
with the GIL released, so the training loop keeps computing while a
checkpoint uploads, and only waits if the previous one is still in flight.

    AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... \\
    python checkpoint_async.py s3://bucket/run-1 --endpoint-url http://127.0.0.1:9000
"""

import argparse
import asyncio
import hashlib
import json
import random
import time

import ferry


def training_step(step, state):
    """Stands in for a forward and backward pass: CPU work in Python that
    changes the model's state."""
    digest = hashlib.sha256(step.to_bytes(8, "little"))
    for _ in range(2000):
        digest = hashlib.sha256(digest.digest())
    state["step"] = step
    state["seed"] = digest.hexdigest()


def tensors_of(state, size):
    """The state as named blobs, as a state dict's tensors would be."""
    rng = random.Random(state["seed"])
    return {f"layer-{i}.weight": rng.randbytes(size) for i in range(4)}


async def save_checkpoint(uri, step, tensors, **options):
    """Writes every tensor, then the index that makes the checkpoint valid."""
    prefix = f"{uri.rstrip('/')}/step-{step:06}"
    await asyncio.gather(*(ferry.write_async(f"{prefix}/{name}", blob, **options) for name, blob in tensors.items()))
    index = {"step": step, "tensors": {name: len(blob) for name, blob in tensors.items()}}
    await ferry.write_async(f"{prefix}/index.json", json.dumps(index).encode(), **options)
    return prefix


async def train(uri, steps=12, every=4, tensor_size=4 << 20, **options):
    state = {}
    in_flight = None
    saved = []
    started = time.monotonic()
    for step in range(1, steps + 1):
        training_step(step, state)
        if step % every == 0:
            if in_flight is not None:
                saved.append(await in_flight)  # at most one checkpoint uploading
            in_flight = asyncio.ensure_future(save_checkpoint(uri, step, tensors_of(state, tensor_size), **options))
        await asyncio.sleep(0)  # let finished awaitables resolve; the bytes move regardless
    if in_flight is not None:
        saved.append(await in_flight)
    return saved, time.monotonic() - started


def load_checkpoint(prefix, **options):
    """Reads a checkpoint back: the index, then every tensor it lists."""
    index = json.loads(bytes(ferry.read(f"{prefix}/index.json", **options)))
    names = list(index["tensors"])
    blobs = ferry.read_many([f"{prefix}/{name}" for name in names], **options)
    return index, dict(zip(names, blobs))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("uri", help="where checkpoints go, e.g. s3://bucket/run-1")
    parser.add_argument("--endpoint-url", help="an S3-compatible endpoint, e.g. MinIO's")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--every", type=int, default=4)
    args = parser.parse_args()
    options = {"endpoint_url": args.endpoint_url} if args.endpoint_url else {}
    saved, seconds = asyncio.run(train(args.uri, steps=args.steps, every=args.every, **options))
    index, tensors = load_checkpoint(saved[-1], **options)
    print(f"{len(saved)} checkpoints in {seconds:.1f}s; the last, step {index['step']}, "
          f"holds {sum(len(t) for t in tensors.values())} bytes in {len(tensors)} tensors")


if __name__ == "__main__":
    main()
