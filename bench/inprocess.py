#!/usr/bin/env python3
"""In-process benchmark: Python object-storage clients reading objects into
memory and writing them from memory, on the same data from one local MinIO.

Tools: ferry (the `ferry` Python package), NVIDIA multi-storage-client's Rust
client, s3dlio, obstore and boto3. Workloads: read and write the small
(10,000 x 64 KiB) and large (2 x 1 GiB) objects of bench.py, each at 1, 8 and
32 calling Python threads (a ThreadPoolExecutor whose workers each call the
client's single-object read or write), plus one `ferry.read_many` call with
every key for ferry's reads.

Every tool runs in a subprocess of its own (`inprocess.py --worker TOOL`, one
per tool, workload and repetition), so its CPU time and peak RSS are its own;
the parent drives it over a pipe one thread count at a time and checks each
write before the next. Tool order alternates between repetitions.

Run through `bench/run --inprocess`, which installs MinIO, s5cmd and the
pinned Python peers first.
"""

import argparse
import asyncio
import gc
import io
import json
import os
import platform
import random
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import bench as suite  # noqa: E402  (its helpers; bench.py's main only runs as a script)

MIB, GIB = suite.MIB, suite.GIB
BUCKET = suite.BUCKET
TOOLS = ["ferry", "msc", "s3dlio", "obstore", "boto3"]
# The objects of bench.py's workloads of the same names, at scale 1.
SIZES = {name: suite.WORKLOADS[name] for name in ("small", "large")}
SMOKE = {"small": (200, 64 << 10), "large": (2, 16 * MIB)}
DIRECTIONS = ("read", "write")
# What each tool's worker imports: checked once up front, so a missing
# package is one clear message rather than a failed run per row.
MODULES = {
    "ferry": ["ferry"],
    "msc": ["multistorageclient_rust", "multistorageclient.providers.s3"],
    "s3dlio": ["s3dlio"],
    "obstore": ["obstore"],
    "boto3": ["boto3"],
}
DISTRIBUTIONS = {
    "ferry": ["ferry"], "msc": ["multi-storage-client"], "s3dlio": ["s3dlio"], "obstore": ["obstore"],
    "boto3": ["boto3", "botocore", "s3transfer"],
}
READ_MANY = "read_many"


# ---------------------------------------------------------------------------
# The clients, each in its best in-memory configuration. A worker builds one
# per row (thread count): `read(key)` returns a buffer-protocol object,
# `write(key, data)` stores bytes; `large` selects the tool's API for large
# objects where it has one (parallel ranged GETs, multipart uploads).
# ---------------------------------------------------------------------------


class Ferry:
    """ferry.read / ferry.write (GIL-free), ferry.read_many for a whole batch.
    Ferry's own defaults; `--ferry-opt KEY=VALUE` adds options."""

    def __init__(self, ctx, large, threads):
        import ferry
        self.ferry = ferry
        self.opts = dict(endpoint_url=ctx["endpoint"], **ctx["ferry_opts"])
        self.base = f"s3://{ctx['bucket']}/"

    def read(self, key):
        return self.ferry.read(self.base + key, **self.opts)

    def read_many(self, keys):
        return self.ferry.read_many([self.base + k for k in keys], **self.opts)

    def write(self, key, data):
        self.ferry.write(self.base + key, data, **self.opts)


class Msc:
    """multi-storage-client's Rust client (multistorageclient_rust.RustClient,
    what MSC's S3 provider builds from a `rust_client` profile like
    peers/msc_copy.py's): get / put for small objects,
    download_multipart_to_bytes / upload_multipart_from_bytes (parallel
    parts) for large ones. Its methods are coroutines: each calling thread
    keeps one event loop and runs them to completion on it (MSC's own sync
    path, run_async_rust_client_method, starts a new loop per call)."""

    def __init__(self, ctx, large, threads):
        from multistorageclient.providers.s3 import StaticS3CredentialsProvider
        from multistorageclient_rust import RustClient
        self.large, self.part, self.parts = large, ctx["part_size"], ctx["part_concurrency"]
        connections = max(32, threads * (self.parts if large else 1))
        self.client = RustClient(provider="s3", configs={
            "bucket": ctx["bucket"], "endpoint_url": ctx["endpoint"], "region_name": ctx["region"],
            "allow_http": ctx["endpoint"].startswith("http://"), "max_concurrency": self.parts,
            "max_pool_connections": connections, "multipart_chunksize": self.part,
        }, credentials_provider=StaticS3CredentialsProvider(ctx["access_key"], ctx["secret_key"]))
        self.local = threading.local()
        self.loops = []
        self.lock = threading.Lock()

    def thread_init(self):
        if getattr(self.local, "loop", None) is None:
            self.local.loop = asyncio.new_event_loop()
            with self.lock:
                self.loops.append(self.local.loop)
        return self.local.loop

    def call(self, method, *args, **kwargs):
        async def run():
            return await getattr(self.client, method)(*args, **kwargs)
        return self.thread_init().run_until_complete(run())

    def read(self, key):
        if self.large:
            return self.call("download_multipart_to_bytes", key, multipart_chunksize=self.part,
                             max_concurrency=self.parts)
        return self.call("get", key)

    def write(self, key, data):
        if self.large:
            self.call("upload_multipart_from_bytes", key, data, multipart_chunksize=self.part,
                      max_concurrency=self.parts)
        else:
            self.call("put", key, data)

    def close(self):
        for loop in self.loops:
            loop.close()


class S3dlio:
    """s3dlio.get (concurrent ranged GETs above its 32 MiB threshold, on by
    default) and s3dlio.put_bytes (one PUT, zero-copy); large writes through
    its MultipartUploadWriter (zero-copy parts, `max_in_flight` at once),
    since put_bytes sends even a 1 GiB object as one signed PUT."""

    configured = False

    def __init__(self, ctx, large, threads):
        import s3dlio
        self.s3dlio, self.large = s3dlio, large
        self.part, self.parts = ctx["part_size"], ctx["part_concurrency"]
        if not S3dlio.configured:  # process-wide, before the first request
            s3dlio.configure_s3(endpoint_url=ctx["endpoint"], region=ctx["region"])
            S3dlio.configured = True
        self.base = f"s3://{ctx['bucket']}/"

    def read(self, key):
        return self.s3dlio.get(self.base + key)

    def write(self, key, data):
        if self.large:
            writer = self.s3dlio.MultipartUploadWriter.from_uri(self.base + key, part_size=self.part,
                                                                max_in_flight=self.parts)
            writer.write(data)
            writer.close()
        else:
            self.s3dlio.put_bytes(self.base + key, data)


class Obstore:
    """obstore's synchronous get(...).bytes() (one GET: obstore has no
    parallel read of one object; get_ranges coalesces adjacent ranges into
    one request) and put, which uploads parts of `chunk_size` bytes,
    `max_concurrency` at once, above chunk_size and one PUT below."""

    def __init__(self, ctx, large, threads):
        import obstore
        from obstore.store import S3Store
        self.obstore = obstore
        self.part, self.parts = ctx["part_size"], ctx["part_concurrency"]
        self.store = S3Store(ctx["bucket"], endpoint=ctx["endpoint"], access_key_id=ctx["access_key"],
                             secret_access_key=ctx["secret_key"], region=ctx["region"],
                             virtual_hosted_style_request=False,
                             # The default 30 s request timeout covers a whole
                             # body: a 1 GiB GET on a loaded machine can take longer.
                             client_options={"allow_http": True, "timeout": "600s"})

    def read(self, key):
        return self.obstore.get(self.store, key).bytes()

    def write(self, key, data):
        self.obstore.put(self.store, key, data, chunk_size=self.part, max_concurrency=self.parts)


class Boto3:
    """One thread-safe boto3 client shared by the calling threads, its
    connection pool as large as the requests they can have in flight:
    get_object / put_object for small objects; for large ones s3transfer's
    download_fileobj / upload_fileobj through a BytesIO (parallel ranged
    GETs, multipart upload; the classic transfer client, the CRT is not
    this tool)."""

    def __init__(self, ctx, large, threads):
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config
        self.large, self.bucket = large, ctx["bucket"]
        parts = ctx["part_concurrency"]
        session = boto3.session.Session(aws_access_key_id=ctx["access_key"], aws_secret_access_key=ctx["secret_key"],
                                        region_name=ctx["region"])
        config = Config(max_pool_connections=max(10, threads * (parts if large else 1)),
                        s3={"addressing_style": "path"}, retries={"max_attempts": 3})
        self.client = session.client("s3", endpoint_url=ctx["endpoint"], config=config)
        self.transfer = TransferConfig(multipart_threshold=ctx["part_size"], multipart_chunksize=ctx["part_size"],
                                       max_concurrency=parts, preferred_transfer_client="classic")

    def read(self, key):
        if self.large:
            buffer = io.BytesIO()
            self.client.download_fileobj(self.bucket, key, buffer, Config=self.transfer)
            return buffer.getbuffer()
        return self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()

    def write(self, key, data):
        if self.large:
            # BytesIO shares an immutable bytes object's memory: no copy.
            self.client.upload_fileobj(io.BytesIO(data), self.bucket, key, Config=self.transfer)
        else:
            self.client.put_object(Bucket=self.bucket, Key=key, Body=data)


CLIENTS = {"ferry": Ferry, "msc": Msc, "s3dlio": S3dlio, "obstore": Obstore, "boto3": Boto3}


# ---------------------------------------------------------------------------
# The worker: one tool, one workload, one repetition; rows on request.
# ---------------------------------------------------------------------------


def proc_status(field):
    """A size from /proc/self/status (VmRSS, VmHWM) in bytes, or None."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def release_memory():
    """Returns what the last row held to the system before the next one
    starts, so the next row's peak is its own."""
    gc.collect()
    try:
        import ctypes
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def reset_peak_rss():
    """Resets the process's peak RSS (VmHWM) to its current RSS; False where
    the kernel does not allow it (then the peak is the process's so far)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def nbytes(buffer):
    with memoryview(buffer) as view:
        return view.nbytes


def same_as_file(buffer, path):
    """Whether buffer holds exactly the file's bytes (compared 8 MiB at a time)."""
    with memoryview(buffer) as view, open(path, "rb") as f:
        view = view.cast("B")
        offset = 0
        while True:
            chunk = f.read(8 * MIB)
            if not chunk:
                return offset == view.nbytes
            if bytes(view[offset:offset + len(chunk)]) != chunk:
                return False
            offset += len(chunk)


def run_row(spec, ctx, objects, data, cmd):
    """One timed run: every object read (or written) once at `threads`
    calling threads, or with one read_many call."""
    tool, large, reading = spec["tool"], spec["large"], spec["direction"] == "read"
    threads = cmd["threads"]
    prefix = spec["read_prefix"] if reading else cmd["prefix"]
    keys = [prefix + rel for rel, _ in objects]
    result = {"ok": False, "error": None}
    release_memory()
    client = pool = None
    try:
        client = CLIENTS[tool](ctx, large, threads or 1)
        # Untimed: the client's first request (credentials, runtime, a
        # connection), and every calling thread started.
        client.read(spec["warmup_key"])
        if threads:
            pool = ThreadPoolExecutor(max_workers=threads)
            ready = threading.Barrier(threads + 1)

            def start():
                getattr(client, "thread_init", lambda: None)()
                ready.wait()
            started = [pool.submit(start) for _ in range(threads)]
            ready.wait()
            for f in started:
                f.result()
        release_memory()
        result["peak_rss_scope"] = "row" if reset_peak_rss() else "process"
        result["baseline_rss_bytes"] = proc_status("VmRSS")
        got = None
        wall0, cpu0 = time.perf_counter(), time.process_time()
        store0 = suite.process_cpu_seconds(spec["store_pid"])
        try:
            if reading and not threads:
                got = client.read_many(keys)
            elif reading:
                got = list(pool.map(client.read, keys))
            else:
                for _ in pool.map(client.write, keys, data):
                    pass
        except Exception as e:  # noqa: BLE001 - any client error is a failed run, reported
            result["error"] = f"{type(e).__name__}: {e}"
        result["seconds"] = time.perf_counter() - wall0
        result["cpu_seconds"] = time.process_time() - cpu0
        store1 = suite.process_cpu_seconds(spec["store_pid"])
        # The store's work for this client's requests (MinIO shares the CPUs).
        result["store_cpu_seconds"] = None if store0 is None or store1 is None else store1 - store0
        result["peak_rss_bytes"] = proc_status("VmHWM") or 0
        if result["peak_rss_scope"] == "process" or not result["peak_rss_bytes"]:
            import resource
            result["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        if reading and result["error"] is None:
            result["error"] = check_read(got, objects, spec, cmd)
        del got
        result["ok"] = result["error"] is None
    except Exception as e:  # noqa: BLE001 - set-up failed: the row failed
        result["error"] = f"{type(e).__name__}: {e}"
    finally:
        if pool:
            pool.shutdown(wait=True)
        if client is not None:
            getattr(client, "close", lambda: None)()
    return result


def check_read(got, objects, spec, cmd):
    """None when every object arrived whole, else what is wrong: each
    object's size against the manifest, and one object's bytes against the
    generated file."""
    if got is None or len(got) != len(objects):
        return f"{0 if got is None else len(got)} results for {len(objects)} objects"
    sizes = [nbytes(b) for b in got]
    wrong = [(rel, n, size) for (rel, size), n in zip(objects, sizes) if n != size]
    if wrong:
        rel, n, size = wrong[0]
        return f"{len(wrong)} objects with the wrong size (first: {rel}: {n} bytes, want {size})"
    index = cmd["check_index"] % len(objects)
    rel = objects[index][0]
    if not same_as_file(got[index], Path(spec["source"]) / rel):
        return f"content of {spec['read_prefix']}{rel} differs from the generated object"
    return None


def worker_main(args):
    spec = json.loads(Path(args.spec).read_text())
    # Results go to the parent on the real stdout; anything a library prints
    # goes to stderr (the run log) instead of into the protocol.
    results = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def send(obj):
        results.write(json.dumps(obj) + "\n")
        results.flush()

    sys.path.insert(0, str(HERE / "peers"))
    from common import ACCESS_KEY, ENDPOINT, REGION, SECRET_KEY  # the suite's endpoint and credentials
    # Clients that read the environment (ferry, s3dlio) see the same ones.
    os.environ.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY, AWS_REGION=REGION)
    ctx = {"endpoint": ENDPOINT, "bucket": spec["bucket"], "region": REGION, "access_key": ACCESS_KEY,
           "secret_key": SECRET_KEY, "part_size": spec["part_size"], "part_concurrency": spec["part_concurrency"],
           "ferry_opts": spec["ferry_opts"]}
    objects = spec["objects"]
    data = None
    if spec["direction"] == "write":  # the source bytes, in memory before any row
        data = [(Path(spec["source"]) / rel).read_bytes() for rel, _ in objects]
    send({"ready": True, "rss_bytes": proc_status("VmRSS")})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("exit"):
            break
        send(run_row(spec, ctx, objects, data, cmd))
    results.flush()
    # Every request has completed. obstore's runtime can abort while the
    # interpreter finalizes (see peers/obstore_copy.py): leave without it.
    os._exit(0)


# ---------------------------------------------------------------------------
# The parent: MinIO, data, workers, checks, figures.
# ---------------------------------------------------------------------------


class Worker:
    """A worker subprocess driven over its stdin and stdout, one JSON line each way."""

    def __init__(self, spec_path, tool, env, log):
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--worker", tool, "--spec", str(spec_path)],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, bufsize=0,
            start_new_session=True)
        self.buffer = b""

    def request(self, obj, timeout):
        if obj is not None:
            self.proc.stdin.write((json.dumps(obj) + "\n").encode())
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no answer in {timeout:g} s")
            if select.select([self.proc.stdout], [], [], left)[0]:
                chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
                if not chunk:
                    raise EOFError(f"worker exited ({self.proc.wait()})")
                self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def close(self):
        try:
            self.proc.stdin.write(b'{"exit": true}\n')
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.kill()

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


def probe(tools):
    """Starts checking whether the bench Python can import what each tool's
    worker imports (one subprocess for all, beside MinIO's start-up and the
    seeding); the returned function waits for {tool: {"ok", "version", "error"}}."""
    code = f"""
import importlib, importlib.metadata, json, sys
out = {{}}
for tool, modules in {MODULES!r}.items():
    if tool not in {tools!r}:
        continue
    try:
        for m in modules:
            importlib.import_module(m)
    except Exception as e:
        out[tool] = {{"ok": False, "error": f"{{type(e).__name__}}: {{e}}"}}
        continue
    versions = []
    for dist in {DISTRIBUTIONS!r}[tool]:
        try:
            versions.append(f"{{dist}} {{importlib.metadata.version(dist)}}")
        except importlib.metadata.PackageNotFoundError:
            version = getattr(sys.modules.get(modules[0]), "__version__", None)
            versions.append(f"{{dist}} {{version or 'unknown'}}")
    out[tool] = {{"ok": True, "version": ", ".join(versions)}}
print(json.dumps(out))
"""
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def wait():
        stdout, stderr = proc.communicate(timeout=300)
        if proc.returncode != 0:
            raise SystemExit(f"cannot probe the Python packages: {stderr.strip()}")
        return json.loads(stdout.strip().splitlines()[-1])
    return wait


def manifest(source):
    """[(relative key, size)] of a generated workload, in key order."""
    return sorted((p.relative_to(source).as_posix(), p.stat().st_size)
                  for p in Path(source).rglob("*") if p.is_file())


class Checker:
    """Checks writes with a listing and one object's bytes, then removes them
    (plain boto3 in the parent, whatever tool wrote them)."""

    def __init__(self, minio):
        import boto3
        from botocore.config import Config
        self.minio = minio
        self.s3 = boto3.session.Session(aws_access_key_id=suite.ACCESS_KEY, aws_secret_access_key=suite.SECRET_KEY,
                                        region_name="us-east-1").client(
            "s3", endpoint_url=minio.endpoint, config=Config(s3={"addressing_style": "path"}))

    def listing(self, prefix):
        found = {}
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
            found.update((o["Key"], o["Size"]) for o in page.get("Contents", []))
        return found

    def check(self, prefix, objects, source, index):
        """None when the prefix holds exactly the objects at their sizes and
        the spot-checked object's bytes match, else what is wrong."""
        found = self.listing(prefix)
        want = {prefix + rel: size for rel, size in objects}
        missing = sorted(set(want) - set(found))
        extra = sorted(set(found) - set(want))
        wrong = sorted(k for k in set(want) & set(found) if want[k] != found[k])
        if missing or extra or wrong:
            return (f"listing: {len(missing)} missing, {len(extra)} unexpected, {len(wrong)} with the wrong size "
                    f"(of {len(want)}; found {sum(found.values())} bytes, want {sum(want.values())})")
        rel, size = objects[index % len(objects)]
        window = MIB
        if size <= 8 * MIB:
            spans = [(0, size)]
        else:  # both ends and two places between, 1 MiB each
            rng = random.Random(f"{prefix}{rel}")
            spans = [(0, window), (size - window, window)] + [(rng.randrange(size - window), window)
                                                               for _ in range(2)]
        with open(Path(source) / rel, "rb") as f:
            for offset, length in spans:
                f.seek(offset)
                expected = f.read(length)
                body = self.s3.get_object(Bucket=BUCKET, Key=prefix + rel,
                                          Range=f"bytes={offset}-{offset + length - 1}")["Body"].read()
                if body != expected:
                    return f"content of {prefix}{rel} at {offset}+{length} differs from the source"
        return None

    def remove(self, prefix):
        keys = list(self.listing(prefix))
        for i in range(0, len(keys), 1000):
            self.s3.delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": k} for k in keys[i:i + 1000]],
                                                          "Quiet": True})
        self.minio.empty_trash()


def row_label(threads):
    return READ_MANY if threads is None else str(threads)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tools", default=",".join(TOOLS), help="comma-separated subset of " + ",".join(TOOLS))
    parser.add_argument("--workloads", default="small,large", help="small (10,000 x 64 KiB), large (2 x 1 GiB)")
    parser.add_argument("--directions", default="read,write")
    parser.add_argument("--threads", default="1,8,32", help="calling Python threads, one row each")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply object counts (large: object size)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--part-size", type=int, default=16 * MIB,
                        help="large objects: the part size of every peer's multipart and ranged transfers")
    parser.add_argument("--part-concurrency", type=int, default=16,
                        help="large objects: the parts each peer has in flight for one object")
    parser.add_argument("--ferry-opt", action="append", default=[], metavar="KEY=VALUE",
                        help="an option for ferry.read/write/read_many (repeatable; default: ferry's defaults)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a worker may take for one row")
    parser.add_argument("--minio-store", choices=("auto", "ram", "disk"), default="auto",
                        help="where MinIO keeps objects (as bench.py)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes (200 x 64 KiB, 2 x 16 MiB), threads 1 and 8, one repetition")
    parser.add_argument("--work-dir", default=None, help="where the generated data lives (default: a temp dir)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "inprocess"))
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--spec", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker_main(args)

    tools = [t for t in args.tools.split(",") if t]
    unknown = sorted(set(tools) - set(TOOLS))
    if unknown:
        parser.error(f"unknown tools: {', '.join(unknown)}")
    directions = [d for d in args.directions.split(",") if d]
    if set(directions) - set(DIRECTIONS):
        parser.error("--directions takes read and write")
    sizes = {}
    for name in args.workloads.split(","):
        if name not in SIZES:
            parser.error(f"unknown workload {name!r}")
        count, size = (SMOKE if args.smoke else SIZES)[name]
        if name == "large":
            size = max(1, int(size * args.scale))
        else:
            count = max(1, int(count * args.scale))
        sizes[name] = (count, size)
    threads = [int(t) for t in ("1,8" if args.smoke and args.threads == "1,8,32" else args.threads).split(",")]
    reps = 1 if args.smoke else args.reps
    if args.smoke:
        args.part_size = min(args.part_size, 8 * MIB)  # so 16 MiB objects still go in parts
        args.timeout = min(args.timeout, 120.0)
    ferry_opts = {}
    for opt in args.ferry_opt:
        key, _, value = opt.partition("=")
        ferry_opts[key] = int(value) if value.isdigit() else {"true": True, "false": False}.get(value, value)

    started = time.monotonic()
    probed = probe(tools)
    skipped = {}

    # MinIO holds every workload's objects plus one write of the largest.
    need = sum(c * s for c, s in sizes.values()) + (max(c * s for c, s in sizes.values()) if "write" in directions
                                                    else 0)
    store = suite.minio_store(args.minio_store, need)
    base = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="ferry-inprocess-"))
    minio_root = suite.minio_dir(store, base)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / "runs.log", "wb")
    runs, workloads = [], []
    minio = None
    try:
        minio = suite.Minio(minio_root / "store", out / "minio.log")
        env = suite.peer_env(minio)
        s5cmd = [suite.tool("s5cmd"), "--endpoint-url", minio.endpoint]
        subprocess.run(s5cmd + ["mb", f"s3://{BUCKET}"], env=env, check=True, stdout=log, stderr=log)
        data = {}
        for name, (count, size) in [("warmup", (1, 4096))] + list(sizes.items()):
            # bench.py's generator and layout; the directory names the
            # parameters, so a reused --work-dir never serves stale objects.
            root = base / "data-inprocess" / f"seed{args.seed}-{count}x{size}"
            source = suite.generate(root, name, count, size, args.seed)
            subprocess.run(s5cmd + ["cp", f"{source}/", f"s3://{BUCKET}/{name}/"], env=env, check=True,
                           stdout=log, stderr=log)
            data[name] = (source, manifest(source))
        warmup_key = f"warmup/{data['warmup'][1][0][0]}"
        available = probed()
        for t in list(tools):
            if available[t]["ok"]:
                continue
            if t != "ferry":
                raise SystemExit(f"{t}: the bench Python ({sys.executable}) cannot import it: "
                                 f"{available[t]['error']} (hack/tools.sh install bench-python)")
            skipped[t] = f"`import ferry` fails in {sys.executable}: {available[t]['error']}"
            print(f"ferry: SKIPPED (not measured), the bench Python cannot import it: {available[t]['error']}",
                  flush=True)
            tools.remove(t)
        if not tools:
            raise SystemExit("no tool to run")
        checker = Checker(minio)
        for name, (count, size) in sizes.items():
            source, objects = data[name]
            if len(objects) != count or any(s != size for _, s in objects):
                raise SystemExit(f"generated {name} data in {source} is not {count} x {size} B")
            for direction in directions:
                workload = f"{name} {direction}"
                workloads.append({"workload": workload, "name": name, "direction": direction, "objects": count,
                                  "object_bytes": size, "bytes": count * size})
                print(f"== {workload}: {count} x {size} B = {count * size / MIB:.0f} MiB", flush=True)
                for rep in range(reps):
                    order = tools if rep % 2 == 0 else list(reversed(tools))
                    for t in order:
                        rows = list(threads)
                        if t == "ferry" and direction == "read":
                            rows.append(None)  # one read_many call with every key
                        if rep % 2:
                            rows.reverse()  # no row always first (or last) in its process
                        runs += one_worker(t, workload, name, direction, rep, rows, source, objects, warmup_key,
                                           args, ferry_opts, base, env, log, checker)
    finally:
        if minio:
            minio.stop()
        if store == "ram":
            shutil.rmtree(minio_root, ignore_errors=True)
        if not args.work_dir:
            shutil.rmtree(base, ignore_errors=True)
    elapsed = time.monotonic() - started
    summary = summarise(runs, workloads)
    meta = machine(store, available, tools)
    meta["elapsed_seconds"] = round(elapsed)
    settings = {"reps": reps, "threads": threads, "part_size": args.part_size,
                "part_concurrency": args.part_concurrency, "ferry_opts": ferry_opts, "seed": args.seed,
                "scale": args.scale, "smoke": args.smoke}
    (out / "results.json").write_text(json.dumps({"machine": meta, "settings": settings, "skipped": skipped,
                                                  "workloads": workloads, "runs": runs, "summary": summary},
                                                 indent=2))
    report = markdown(meta, settings, skipped, workloads, summary, runs, sys.argv[1:])
    (out / "report.md").write_text(report)
    print()
    print(report)
    failed = [r for r in runs if not r["ok"]]
    print(f"wrote {out}/results.json, report.md in {elapsed / 60:.1f} min; {len(failed)} failed runs "
          f"(details in {out}/runs.log)")
    return 1 if failed else 0


def one_worker(t, workload, name, direction, rep, rows, source, objects, warmup_key, args, ferry_opts, base, env,
               log, checker):
    """Runs tool t's rows of one workload and repetition in one worker; the runs' records."""
    spec = {"tool": t, "workload": workload, "direction": direction, "large": name == "large", "bucket": BUCKET,
            "read_prefix": f"{name}/", "source": str(source), "objects": objects, "warmup_key": warmup_key,
            "part_size": args.part_size, "part_concurrency": args.part_concurrency, "ferry_opts": ferry_opts,
            "store_pid": checker.minio.proc.pid}
    spec_path = base / f"worker-{t}.json"
    spec_path.write_text(json.dumps(spec))
    log.write(f"\n== {t} {workload} rep {rep}: rows {[row_label(r) for r in rows]}\n".encode())
    log.flush()
    worker = Worker(spec_path, t, env, log)
    records = []
    broken = None
    try:
        worker.request(None, args.timeout)  # ready: the source bytes are in memory
    except (TimeoutError, EOFError, ValueError) as e:
        broken = f"worker did not start: {e}"
    for i, threads in enumerate(rows):
        prefix = f"up/{t}/{name}/{row_label(threads)}/"
        record = {"tool": t, "workload": workload, "row": row_label(threads), "threads": threads, "rep": rep,
                  "objects": len(objects), "bytes": sum(s for _, s in objects)}
        cmd = {"threads": threads, "prefix": prefix, "check_index": rep * 7 + i * 3}
        if broken:
            result = {"ok": False, "error": broken}
        else:
            try:
                result = worker.request(cmd, args.timeout)
            except (TimeoutError, EOFError, ValueError, OSError) as e:
                broken = f"worker failed: {e}"
                worker.kill()
                result = {"ok": False, "error": broken}
        if direction == "write":
            if result.get("ok"):
                problem = checker.check(prefix, objects, source, cmd["check_index"])
                if problem:
                    result.update(ok=False, error=problem)
            checker.remove(prefix)
        record.update(result)
        records.append(record)
        status = "ok" if record["ok"] else f"FAILED: {record['error']}"
        if "seconds" in record:
            store = record.get("store_cpu_seconds")
            store = "?" if store is None else f"{store:.2f}"
            print(f"   {workload:12} {t:8} {row_label(threads):>9} {record['seconds']:7.2f} s "
                  f"{record['cpu_seconds']:6.2f} CPU-s (MinIO {store}) {record['peak_rss_bytes'] / MIB:6.0f} MiB "
                  f"{status}",
                  flush=True)
        else:
            print(f"   {workload:12} {t:8} {row_label(threads):>9} {status}", flush=True)
    if not broken:
        worker.close()
    spec_path.unlink(missing_ok=True)
    return records


def summarise(runs, workloads):
    """One row per workload, tool and thread count (or read_many): medians of
    the successful repetitions."""
    total = {w["workload"]: w["bytes"] for w in workloads}
    groups = {}
    for r in runs:
        groups.setdefault((r["workload"], r["tool"], r["row"]), []).append(r)
    rows = []
    for (workload, t, row), group in groups.items():
        ok = [r for r in group if r["ok"]]
        entry = {"workload": workload, "tool": t, "row": row, "threads": group[0]["threads"], "ok": bool(ok),
                 "runs": len(ok), "failed_runs": len(group) - len(ok)}
        if ok:
            secs = [r["seconds"] for r in ok]
            median = statistics.median(secs)
            size = total[workload]
            store = median_or_none(r.get("store_cpu_seconds") for r in ok)
            entry.update(median_seconds=median, min_seconds=min(secs), max_seconds=max(secs),
                         mib_per_second=size / MIB / median, objects_per_second=ok[0]["objects"] / median,
                         cpu_seconds_per_gib=statistics.median(r["cpu_seconds"] for r in ok) / (size / GIB),
                         peak_rss_mib=max(r["peak_rss_bytes"] for r in ok) / MIB,
                         store_cpu_seconds_per_gib=None if store is None else store / (size / GIB),
                         baseline_rss_mib=max(r.get("baseline_rss_bytes") or 0 for r in ok) / MIB)
        rows.append(entry)
    for workload in total:
        ferry = best(rows, workload, "ferry")
        for entry in rows:
            if ferry and entry["workload"] == workload and entry["tool"] != "ferry" \
                    and entry is best(rows, workload, entry["tool"]):
                entry["ferry_speedup"] = entry["median_seconds"] / ferry["median_seconds"]
    return rows


def median_or_none(values):
    values = list(values)
    return None if not values or None in values else statistics.median(values)


def best(rows, workload, t):
    candidates = [r for r in rows if r["ok"] and r["workload"] == workload and r["tool"] == t]
    return min(candidates, key=lambda r: r["median_seconds"]) if candidates else None


def machine(store, available, tools):
    return {
        "cpus": os.cpu_count(), "python": platform.python_version(),
        "platform": f"{platform.system()} {'.'.join(platform.release().split('.')[:2])} {platform.machine()}",
        "cpu_model": next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                           if line.startswith("model name")), ""),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB, 1),
        "minio_store": store,
        "versions": {t: available[t]["version"] for t in tools},
    }


def human(n):
    return f"{n / GIB:g} GiB" if n >= GIB and n % GIB == 0 else f"{n / MIB:g} MiB" if n >= MIB else f"{n >> 10} KiB"


def markdown(meta, settings, skipped, workloads, summary, runs, argv):
    threads = settings["threads"]
    lines = [
        "# In-process benchmark", "",
        f"Generated by `bench/run --inprocess {' '.join(argv)}` in {meta['elapsed_seconds'] / 60:.1f} minutes. "
        "Each tool reads the same objects from one local MinIO into memory, or writes them from memory, in a "
        "process of its own, from a pool of calling Python threads that each call the client's single-object "
        f"read or write ({', '.join(map(str, threads))} threads; for ferry also one `ferry.read_many` call with "
        f"every key). Medians of {settings['reps']} repetition{'s' if settings['reps'] != 1 else ''} (min–max in "
        "brackets), tool order alternating. "
        "CPU is the worker process's user + sys time per GiB, MinIO CPU the store's in the same timed "
        "window; peak RSS is the worker's during that run, the "
        "objects it holds included (reads keep every object read; writes start from the source objects in "
        f"memory). Large objects: {human(settings['part_size'])} parts, {settings['part_concurrency']} in flight "
        "per object for every peer; ferry " + (
            "with " + ", ".join(f"`{k}={v}`" for k, v in settings["ferry_opts"].items())
            if settings["ferry_opts"] else "at its defaults") + ".", "",
        f"Machine: {meta['cpus']} CPUs ({meta['cpu_model']}), {meta['memory_gib']} GiB, {meta['platform']}, "
        f"Python {meta['python']}. MinIO runs on the same CPUs, its store "
        f"{'in RAM (tmpfs)' if meta['minio_store'] == 'ram' else 'on disk'}.", "",
        "Versions: " + "; ".join(meta["versions"].values()), ""]
    for t, why in skipped.items():
        lines += [f"**{t} not measured**: {why}.", ""]
    for w in workloads:
        name = w["workload"]
        rows = [r for r in summary if r["workload"] == name]
        if not rows:
            continue
        lines += [f"## {name} ({w['objects']:,} × {human(w['object_bytes'])} = {human(w['bytes'])})", "",
                  "| tool | best threads | median s (min–max) | MiB/s | objects/s | CPU s/GiB | MinIO CPU s/GiB "
                  "| peak RSS MiB | ferry speed-up |", "|---|---|---|---|---|---|---|---|---|"]
        tools = sorted({r["tool"] for r in rows},
                       key=lambda t: best(rows, name, t)["median_seconds"] if best(rows, name, t) else 1e18)
        for t in tools:
            b = best(rows, name, t)
            if not b:
                lines.append(f"| {t} | | failed | | | | | | |")
                continue
            speedup = f"{b['ferry_speedup']:.2f}×" if "ferry_speedup" in b else ""
            store_cpu = "" if b.get("store_cpu_seconds_per_gib") is None else f"{b['store_cpu_seconds_per_gib']:.2f}"
            lines.append(f"| {t} | {b['row']} | {b['median_seconds']:.2f} ({b['min_seconds']:.2f}–"
                         f"{b['max_seconds']:.2f}) | {b['mib_per_second']:.0f} | {b['objects_per_second']:.0f} | "
                         f"{b['cpu_seconds_per_gib']:.2f} | {store_cpu} | {b['peak_rss_mib']:.0f} | {speedup} |")
        ferry = best(rows, name, "ferry")
        peers = [best(rows, name, t) for t in tools if t != "ferry" and best(rows, name, t)]
        lines.append("")
        if ferry and peers:
            fastest = min(peers, key=lambda r: r["median_seconds"])
            lines.append(f"Ferry ({ferry['row']}) against the fastest peer, {fastest['tool']} ({fastest['row']}): "
                         f"**{fastest['median_seconds'] / ferry['median_seconds']:.2f}×** "
                         "(> 1: Ferry is faster).")
        else:
            lines.append("Ferry against the fastest peer: not measured." if not ferry else
                         "Ferry against the fastest peer: no peer finished.")
        columns = [str(t) for t in threads] + ([READ_MANY] if any(r["row"] == READ_MANY for r in rows) else [])
        lines += ["", "MiB/s by calling threads (GIL scaling):", "",
                  "| tool | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
        for t in tools:
            cells = []
            for c in columns:
                r = next((r for r in rows if r["tool"] == t and r["row"] == c), None)
                cells.append("" if r is None else f"{r['mib_per_second']:.0f}" if r["ok"] else "failed")
            lines.append(f"| {t} | " + " | ".join(cells) + " |")
        lines.append("")
    failed = [r for r in runs if not r["ok"]]
    if failed:
        lines += ["## Failed runs", "", "| tool | workload | threads | rep | error |", "|---|---|---|---|---|"]
        lines += [f"| {r['tool']} | {r['workload']} | {r['row']} | {r['rep']} | {r['error']} |" for r in failed]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
