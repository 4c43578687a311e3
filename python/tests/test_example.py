"""examples/python/checkpoint_async.py runs against MinIO and its
checkpoints read back as written."""

import asyncio
import importlib.util
import os

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "..", "examples", "python", "checkpoint_async.py")


def load_example():
    spec = importlib.util.spec_from_file_location("checkpoint_async", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_checkpoints_saved_while_training_read_back_as_written(s3):
    bucket, options = s3
    example = load_example()
    uri = f"s3://{bucket}/run-1"
    saved, _ = asyncio.run(example.train(uri, steps=8, every=4, tensor_size=1 << 20, **options))
    assert [p.rsplit("/", 1)[1] for p in saved] == ["step-000004", "step-000008"]
    for prefix in saved:
        index, tensors = example.load_checkpoint(prefix, **options)
        state = {}
        example.training_step(index["step"], state)
        expected = example.tensors_of(state, 1 << 20)
        assert {name: bytes(blob) for name, blob in tensors.items()} == expected
