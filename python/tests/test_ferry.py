"""The `ferry` package against real servers (MinIO, fake-gcs-server,
Azurite, distribution's registry, olah): round trips, verification, errors,
threads, asyncio and cancellation."""

import asyncio
import hashlib
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import ferry
from corrupting_proxy import MARKER, CorruptingProxy

MiB = 1 << 20


def data(size, seed=0):
    return random.Random(seed).randbytes(size)


# --- round trips -------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 64 << 10, 5 * MiB + 3, 21 * MiB + 7])
def test_what_is_written_reads_back_byte_for_byte(s3, size):
    bucket, options = s3
    payload = data(size, seed=size)
    uri = f"s3://{bucket}/objects/{size}.bin"
    # Small parts, so the larger sizes are multipart uploads and ranged reads.
    ferry.write(uri, payload, part_size="5MiB", **options)
    read = ferry.read(uri, part_size="5MiB", **options)
    assert len(read) == size
    assert read == payload
    assert bytes(read) == payload
    assert hashlib.sha256(memoryview(read)).digest() == hashlib.sha256(payload).digest()


def test_a_buffer_is_read_only_and_shares_its_bytes(s3):
    bucket, options = s3
    ferry.write(f"s3://{bucket}/k", b"abc", **options)
    buffer = ferry.read(f"s3://{bucket}/k", **options)
    view = memoryview(buffer)
    assert view.readonly and view.tobytes() == b"abc" and view.format == "B"
    with pytest.raises(TypeError):
        view[0] = 1
    assert "3 bytes" in repr(buffer)


def test_bytearray_memoryview_and_slices_are_written_as_they_are(s3):
    bucket, options = s3
    payload = data(3 * MiB, seed=7)
    sources = {"bytearray": bytearray(payload), "memoryview": memoryview(payload), "slice": memoryview(payload)[::1]}
    for name, source in sources.items():
        ferry.write(f"s3://{bucket}/{name}", source, **options)
        assert ferry.read(f"s3://{bucket}/{name}", **options) == payload, name
    # A non-contiguous view is copied, not refused.
    ferry.write(f"s3://{bucket}/strided", memoryview(payload)[::2], **options)
    assert ferry.read(f"s3://{bucket}/strided", **options) == payload[::2]


def test_ranged_reads_return_exactly_the_range(s3):
    bucket, options = s3
    payload = data(12 * MiB + 5, seed=3)
    uri = f"s3://{bucket}/ranged"
    ferry.write(uri, payload, **options)
    for start, end in [(0, 1), (5, 5), (MiB - 1, 3 * MiB + 2), (len(payload) - 10, len(payload))]:
        assert ferry.read(uri, range=(start, end), part_size="5MiB", **options) == payload[start:end]
    with pytest.raises(ValueError, match="range"):
        ferry.read(uri, range=(10, 5), **options)


def test_read_many_returns_buffers_in_the_order_asked(s3):
    bucket, options = s3
    payloads = {f"s3://{bucket}/many/{i:03}": data(1000 + i, seed=i) for i in range(200)}
    for uri, payload in payloads.items():
        ferry.write(uri, payload, **options)
    uris = list(payloads)
    random.Random(1).shuffle(uris)
    buffers = ferry.read_many(uris, concurrency=16, **options)
    assert [bytes(b) for b in buffers] == [payloads[u] for u in uris]
    # Adaptive concurrency (the default) by name and by None reads the same.
    for concurrency in ("auto", None):
        buffers = ferry.read_many(uris, concurrency=concurrency, **options)
        assert [bytes(b) for b in buffers] == [payloads[u] for u in uris]


def test_write_file_sends_a_file_in_parts(s3, tmp_path):
    bucket, options = s3
    payload = data(11 * MiB + 1, seed=11)
    path = tmp_path / "checkpoint.bin"
    path.write_bytes(payload)
    ferry.write_file(path, f"s3://{bucket}/ckpt/checkpoint.bin", part_size="5MiB", **options)
    assert ferry.read(f"s3://{bucket}/ckpt/checkpoint.bin", **options) == payload


def test_pull_and_push_a_directory_with_a_summary_and_progress(s3, tmp_path):
    bucket, options = s3
    source = tmp_path / "source"
    files = {f"shard-{i}/part.bin": data(i * 100_000 + 1, seed=i) for i in range(12)}
    for name, payload in files.items():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes(payload)
    seen = []
    pushed = ferry.push(source, f"s3://{bucket}/dataset", progress=seen.append, **options)
    assert pushed.complete and pushed["objects"]["transferred"] == 12, pushed
    destination = tmp_path / "destination"
    pulled = ferry.pull(f"s3://{bucket}/dataset", destination, progress=seen.append, **options)
    assert pulled.complete and pulled.objects["transferred"] == 12, pulled
    # The default concurrency adapts, within its bounds, and says so.
    assert pulled.concurrency["adaptive"] is True, pulled
    assert 4 <= pulled.concurrency["last"] <= pulled.concurrency["peak"] <= 256, pulled
    assert pulled.requests >= 12, pulled
    for name, payload in files.items():
        assert (destination / name).read_bytes() == payload, name
    assert seen and all(isinstance(p, ferry.Progress) for p in seen)
    # Again: nothing to copy.
    again = ferry.pull(f"s3://{bucket}/dataset", destination, **options)
    assert again.objects["transferred"] == 0 and again.objects["skipped"] == 12, again
    # A reserve is a size or a share of the volume; one no volume leaves is refused.
    for reserve in (0, "0", "1%", 1 << 20):
        ferry.pull(f"s3://{bucket}/dataset", tmp_path / "reserve", capacity_reserve=reserve, **options)
    with pytest.raises(ferry.InsufficientCapacity, match="reserve, 999999T"):
        ferry.pull(f"s3://{bucket}/dataset", tmp_path / "refused", capacity_reserve="999999T", **options)
    # A quota on the dataset: what fits stages, what does not writes nothing.
    size = sum(len(payload) for payload in files.values())
    ferry.pull(f"s3://{bucket}/dataset", tmp_path / "fits", dataset_quota=size, **options)
    with pytest.raises(ferry.QuotaExceeded, match="more than its quota") as refused:
        ferry.pull(f"s3://{bucket}/dataset", tmp_path / "over", dataset_quota=size - 1, **options)
    assert refused.value.reason == "QuotaExceeded"
    assert not (tmp_path / "over").exists() or not any(p.is_file() for p in (tmp_path / "over").iterdir())
    # Two directories sharing objects: the second links what the first fetched.
    shared = str(tmp_path / ".shared")
    ferry.pull(f"s3://{bucket}/dataset", tmp_path / "one", shared_objects=shared, **options)
    linked = ferry.pull(f"s3://{bucket}/dataset", tmp_path / "two", shared_objects=shared, **options)
    assert linked.shared == {"objects": 12, "bytes": size} and linked.bytes["transferred"] == 0, linked
    for name in files:
        assert (tmp_path / "one" / name).stat().st_ino == (tmp_path / "two" / name).stat().st_ino, name


def test_gcs_round_trip_through_the_emulator(gcs, tmp_path):
    bucket = gcs.bucket()
    options = {"endpoint_url": gcs.endpoint, "anonymous": True}
    payload = data(300_000, seed=5)
    ferry.write(f"gs://{bucket}/a/b.bin", payload, **options)
    assert ferry.read(f"gs://{bucket}/a/b.bin", **options) == payload
    pulled = ferry.pull(f"gs://{bucket}/a", tmp_path, **options)
    assert pulled.complete and (tmp_path / "b.bin").read_bytes() == payload


def test_azure_round_trip_through_azurite(azurite, tmp_path):
    container = azurite.bucket()
    options = {"endpoint_url": azurite.endpoint}
    payload = data(11 * MiB + 5, seed=8)
    # 5 MiB parts: a block list of three blocks, committed at once.
    ferry.write(f"az://{container}/model/weights.bin", payload, part_size="5MiB", **options)
    assert ferry.read(f"az://{container}/model/weights.bin", **options) == payload
    assert ferry.read(f"az://{container}/model/weights.bin", range=(MiB, MiB + 7), **options) == payload[MiB:MiB + 7]
    (tmp_path / "up").mkdir()
    (tmp_path / "up" / "config.json").write_bytes(b"{}")
    pushed = ferry.push(tmp_path / "up", f"az://{container}/model", **options)
    assert pushed.complete
    pulled = ferry.pull(f"az://{container}/model", tmp_path / "down", **options)
    assert pulled.complete and pulled["verified"]["checksum"] == 2
    assert (tmp_path / "down" / "weights.bin").read_bytes() == payload
    assert (tmp_path / "down" / "config.json").read_bytes() == b"{}"
    with pytest.raises(ferry.BucketNotFound):
        ferry.read("az://no-such-container/k", **options)
    with pytest.raises(ferry.ObjectNotFound):
        ferry.read(f"az://{container}/nothing-here", **options)


def test_an_oci_artifact_is_pulled_layer_by_layer_and_a_push_to_it_is_refused(registry, tmp_path):
    source = tmp_path / "artifact"
    (source / "shards").mkdir(parents=True)
    shard = data(3 * MiB + 1, seed=9)
    (source / "shards" / "0.safetensors").write_bytes(shard)
    (source / "config.json").write_bytes(b'{"layers": 1}')
    reference = registry.push(source, "models/tiny", "v1", ["shards/0.safetensors", "config.json"])
    options = {"endpoint_url": registry.endpoint, "anonymous": True}
    pulled = ferry.pull(f"oci://{reference}", tmp_path / "down", **options)
    # Every layer is verified against its digest (SHA-256).
    assert pulled.complete and pulled["verified"]["checksum"] == 2
    assert (tmp_path / "down" / "shards" / "0.safetensors").read_bytes() == shard
    assert (tmp_path / "down" / "config.json").read_bytes() == b'{"layers": 1}'
    # Refused before anything is read, like every invalid argument.
    with pytest.raises(ValueError, match="does not write"):
        ferry.push(tmp_path / "down", f"oci://{reference}", **options)


def test_a_hub_repository_is_pulled_as_hf_download_writes_it_and_a_push_to_it_is_refused(hub, tmp_path):
    files = {
        "config.json": b'{"hidden_size": 64}',
        "tokenizer/vocab.txt": data(300 << 10, seed=11),
        "model.safetensors": data(3 * MiB + 5, seed=12),
        "empty.txt": b"",
    }
    commit = hub.repository("ferry/tiny", files)
    # Files whole (see conftest.Hub): a part size above the largest file.
    options = {"endpoint_url": hub.endpoint, "part_size": "8MiB"}
    pulled = ferry.pull("hf://ferry/tiny", tmp_path / "down", **options)
    # Every file is verified against what the Hub lists: the LFS file's
    # SHA-256, the others' git blob ids.
    assert pulled.complete and pulled["verified"]["sha"] == len(files)
    assert pulled["snapshot"]["revision"] == commit
    hub.hf_download("ferry/tiny", str(tmp_path / "hf"))
    for path, content in files.items():
        assert (tmp_path / "down" / path).read_bytes() == content
        assert (tmp_path / "hf" / path).read_bytes() == content
    # The same files, each tool's bookkeeping aside (Ferry's .ferry, the
    # Hub client's .cache/huggingface).
    def listed(root, own):
        return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                      if p.is_file() and not str(p.relative_to(root)).startswith(own))
    assert listed(tmp_path / "down", (".ferry",)) == listed(tmp_path / "hf", (".cache", ".hf-home")) == sorted(files)
    with pytest.raises(ValueError, match="does not write"):
        ferry.push(tmp_path / "down", "hf://ferry/tiny", **options)


# --- verification --------------------------------------------------------------


def test_bytes_changed_on_the_way_raise_checksum_mismatch_for_every_size(s3, minio):
    bucket, options = s3
    proxy = CorruptingProxy(minio.port)
    try:
        for size in [10, 200_000, 9 * MiB]:
            uri = f"s3://{bucket}/{MARKER}-{size}"
            ferry.write(uri, data(size), **options)
            with pytest.raises(ferry.ChecksumMismatch) as raised:
                ferry.read(uri, endpoint_url=proxy.endpoint, part_size="5MiB")
            assert raised.value.reason == "ChecksumMismatch"
            assert isinstance(raised.value, ferry.FerryError)
            # The same object through the store directly is fine.
            assert ferry.read(uri, **options) == data(size)
    finally:
        proxy.stop()


def test_a_pull_through_a_corrupting_path_keeps_no_corrupted_file(s3, minio, tmp_path):
    bucket, options = s3
    ferry.write(f"s3://{bucket}/set/{MARKER}.bin", data(100_000), **options)
    ferry.write(f"s3://{bucket}/set/fine.bin", data(1000, seed=2), **options)
    proxy = CorruptingProxy(minio.port)
    try:
        with pytest.raises(ferry.TransferIncomplete) as raised:
            ferry.pull(f"s3://{bucket}/set", tmp_path, endpoint_url=proxy.endpoint)
    finally:
        proxy.stop()
    summary = raised.value.summary
    assert summary.objects["failed"] == 1, summary
    assert not (tmp_path / f"{MARKER}.bin").exists()
    assert (tmp_path / "fine.bin").read_bytes() == data(1000, seed=2)


# --- errors ----------------------------------------------------------------------


def test_store_failures_raise_the_reason_as_a_class(s3, minio):
    bucket, options = s3
    with pytest.raises(ferry.ObjectNotFound) as missing:
        ferry.read(f"s3://{bucket}/nothing-here", **options)
    assert missing.value.reason == "ObjectNotFound" and "nothing-here" in missing.value.message
    with pytest.raises(ferry.BucketNotFound):
        ferry.read("s3://no-such-bucket-for-ferry/k", **options)
    saved = os.environ["AWS_SECRET_ACCESS_KEY"]
    os.environ["AWS_SECRET_ACCESS_KEY"] = "not-the-secret"
    try:
        with pytest.raises(ferry.AccessDenied):
            # Options nobody used before: a fresh engine, with these credentials.
            ferry.read(f"s3://{bucket}/k", max_attempts=2, **options)
    finally:
        os.environ["AWS_SECRET_ACCESS_KEY"] = saved
    with pytest.raises(ferry.EndpointUnreachable):
        ferry.read(f"s3://{bucket}/k", endpoint_url="http://127.0.0.1:9", max_attempts=1, connect_timeout=1)


def test_bad_arguments_name_the_argument(s3):
    bucket, options = s3
    with pytest.raises(TypeError, match="part_sise"):
        ferry.read(f"s3://{bucket}/k", part_sise="8MiB", **options)
    with pytest.raises(ValueError, match="part_size"):
        ferry.read(f"s3://{bucket}/k", part_size="eight", **options)
    with pytest.raises(ValueError, match="concurrency"):
        ferry.read(f"s3://{bucket}/k", concurrency=0, **options)
    # A string is a kind of concurrency ("auto"), so another word is a bad value.
    with pytest.raises(ValueError, match="concurrency"):
        ferry.read(f"s3://{bucket}/k", concurrency="many", **options)
    with pytest.raises(TypeError, match="concurrency"):
        ferry.read(f"s3://{bucket}/k", concurrency=2.5, **options)
    with pytest.raises(ValueError, match="verify"):
        ferry.read(f"s3://{bucket}/k", verify="maybe", **options)
    with pytest.raises(ValueError, match="capacity_reserve: '100%' is not a capacity reserve"):
        ferry.pull(f"s3://{bucket}/k", "/tmp/x", capacity_reserve="100%", **options)
    with pytest.raises(TypeError, match="summary_file"):
        ferry.pull(f"s3://{bucket}/k", "/tmp/x", summary_file="/tmp/s.json", **options)
    with pytest.raises(ValueError, match="uri"):
        ferry.read("http://example.com/k", **options)
    with pytest.raises(ValueError, match="names a bucket"):
        ferry.read(f"s3://{bucket}", **options)
    with pytest.raises(TypeError, match="data"):
        ferry.write(f"s3://{bucket}/k", "a str is not bytes", **options)
    with pytest.raises(ValueError, match="5MiB"):
        ferry.push("/tmp", f"s3://{bucket}/p", part_size="1MiB", **options)


# --- threads, asyncio, cancellation ---------------------------------------------


def test_many_python_threads_share_the_engine_and_each_gets_its_own_bytes(s3):
    bucket, options = s3

    def round_trip(i):
        payload = data(50_000 + i, seed=i)
        uri = f"s3://{bucket}/threads/{i}"
        ferry.write(uri, payload, **options)
        return ferry.read(uri, **options) == payload

    with ThreadPoolExecutor(32) as pool:
        assert all(pool.map(round_trip, range(256)))


def test_the_gil_is_released_while_bytes_move(s3):
    bucket, options = s3
    uri = f"s3://{bucket}/slow"
    ferry.write(uri, data(4 * MiB), **options)
    ticks = 0
    done = threading.Event()

    def count():
        nonlocal ticks
        while not done.is_set():
            ticks += 1

    counter = threading.Thread(target=count)
    counter.start()
    started = time.monotonic()
    # Paced to about a second, so a held GIL would stop the counter for it.
    ferry.read(uri, max_bandwidth="4MiB", **options)
    elapsed = time.monotonic() - started
    done.set()
    counter.join()
    assert elapsed > 0.5
    assert ticks > 10_000, f"the counter thread ran {ticks} times in {elapsed:.2f}s"


def test_async_calls_run_together_under_asyncio(s3, tmp_path):
    bucket, options = s3

    async def main():
        payloads = {f"s3://{bucket}/async/{i}": data(10_000 + i, seed=i) for i in range(64)}
        await asyncio.gather(*(ferry.write_async(u, p, **options) for u, p in payloads.items()))
        reads = await asyncio.gather(*(ferry.read_async(u, **options) for u in payloads))
        assert [bytes(r) for r in reads] == list(payloads.values())
        many = await ferry.read_many_async(list(payloads), **options)
        assert [bytes(r) for r in many] == list(payloads.values())
        summary = await ferry.pull_async(f"s3://{bucket}/async", tmp_path / "pulled", **options)
        assert summary.objects["transferred"] == 64
        (tmp_path / "up").mkdir()
        (tmp_path / "up" / "f").write_bytes(b"x" * 10)
        pushed = await ferry.push_async(tmp_path / "up", f"s3://{bucket}/up", **options)
        assert pushed.complete
        path = tmp_path / "up" / "f"
        await ferry.write_file_async(path, f"s3://{bucket}/single", **options)
        assert await ferry.read_async(f"s3://{bucket}/single", **options) == b"x" * 10
        with pytest.raises(ferry.ObjectNotFound):
            await ferry.read_async(f"s3://{bucket}/absent", **options)

    asyncio.run(main())


def test_a_cancelled_pull_leaves_no_partial_file_and_the_next_pull_completes(s3, tmp_path):
    bucket, options = s3
    files = {f"s3://{bucket}/big/{i}.bin": data(3 * MiB, seed=i) for i in range(8)}
    for uri, payload in files.items():
        ferry.write(uri, payload, **options)
    destination = tmp_path / "destination"

    async def pull_then_cancel():
        task = asyncio.ensure_future(
            ferry.pull_async(f"s3://{bucket}/big", destination, max_bandwidth="8MiB", **options))
        await asyncio.sleep(1.0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(pull_then_cancel())
    # Let the engine's tasks see the cancellation.
    time.sleep(0.5)
    finals = [p for p in destination.iterdir() if p.suffix == ".bin"] if destination.exists() else []
    assert len(finals) < len(files), "the pull was not cancelled mid-way"
    for path in finals:
        assert path.read_bytes() == files[f"s3://{bucket}/big/{path.name}"], f"{path} is partial"
    summary = ferry.pull(f"s3://{bucket}/big", destination, **options)
    assert summary.complete
    for i in range(8):
        assert (destination / f"{i}.bin").read_bytes() == files[f"s3://{bucket}/big/{i}.bin"]


def test_a_web_identity_is_exchanged_at_the_stores_sts_instead_of_the_keys_in_the_environment(s3, tmp_path):
    bucket, options = s3
    identity = {"role_arn": "arn:minio:iam:::role/none", "sts_endpoint": options["endpoint_url"], "max_attempts": 1}
    # The keys in the environment are not used: the token file is.
    with pytest.raises(ferry.NoCredentials, match="cannot read the web identity token"):
        ferry.read(f"s3://{bucket}/k", web_identity_token_file=str(tmp_path / "missing"), **identity, **options)
    # This MinIO trusts no identity provider: its STS refuses the exchange.
    token = tmp_path / "token"
    token.write_text("not.a.jwt")
    with pytest.raises(ferry.AccessDenied, match="STS refused the web identity token"):
        ferry.read(f"s3://{bucket}/k", web_identity_token_file=str(token), **identity, **options)
