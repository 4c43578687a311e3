"""Stores beyond S3: ferry-stager against each store's own clients on the same data.

Azure Blob Storage (Azurite, the emulator, on loopback): ferry-stager
against rclone's azureblob backend, the Azure SDK for Python
(azure-storage-blob) and obstore (object_store's Azure backend), both
directions. OCI registries (the distribution project's registry on
loopback): ferry-stager pull against `oras pull` of the same artifact, each
file one layer. The Hugging Face Hub (olah, a self-hosted Hub, behind the
testkit's front that redirects LFS files to MinIO as the Hub redirects them
to its storage: `ferry-test-hub`): ferry-stager pull against the Hub's own
client, `hf download` (huggingface_hub 2, plain HTTP) and
`huggingface-cli download` with `hf_transfer` (huggingface_hub 0.36, the
last that uses it), into `--local-dir`. azcopy is not among them: it is not
served by the package registries this project installs from.

Every run is a fresh process under bench/measure (wall time, CPU of the
tree, peak RSS); tools alternate within each repetition; a download counts
only if every file arrived byte-identical (SHA-256), an upload only if every
blob is listed with its size. The emulator and the registry are single
processes on the same CPUs as the tool, so these rows compare clients
against one server, not against Azure or a production registry.

    bench/run --stores [--reps 3] [--scale 1.0] [--report docs/benchmarks.md]
    bench/run --stores --smoke
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import MIB, free_port, generate, measured, minio_store, python_peer, tool  # noqa: E402
from fleet import tree_digest  # noqa: E402

# Azurite's development account: public, the same in every Azurite.
ACCOUNT = "devstoreaccount1"
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
CONTAINER = "bench"
REPOSITORY = "bench"

# name: (object count, object size in MiB) at scale 1.0
WORKLOADS = {"medium": (32, 8), "large": (2, 128), "many": (500, 1 / 16)}
SMOKE = {"medium": (4, 1), "large": (1, 6), "many": (20, 1 / 16)}

AZURE_TOOLS = ["ferry", "rclone", "azure-sdk", "obstore"]
REGISTRY_TOOLS = ["ferry", "oras"]
HUB_TOOLS = ["ferry", "hf", "hf-transfer"]


def wait_for(url, proc, log, what):
    """Waits until `url` answers at all (any HTTP status)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited during start-up; see {log}")
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{what} did not start within 60 s; see {log}")


class LocalServer:
    """A server process of this run's own (`proc`, writing to `log`)."""

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


class Azurite(LocalServer):
    """A throw-away Azurite blob service on loopback."""

    def __init__(self, data_dir, log_path):
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}/{ACCOUNT}"
        self.log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            [tool("azurite-blob"), "--blobHost", "127.0.0.1", "--blobPort", str(self.port), "--location",
             str(data_dir), "--skipApiVersionCheck", "--loose", "--disableTelemetry", "--silent"],
            stdout=self.log, stderr=self.log, start_new_session=True)
        wait_for(f"{self.endpoint}?comp=list", self.proc, log_path, "azurite-blob")
        self.service = azure_service(self.endpoint)

    def env(self):
        return {"FERRY_ENDPOINT_URL": self.endpoint, "BENCH_ENDPOINT": self.endpoint,
                "AZURE_STORAGE_ACCOUNT": ACCOUNT, "AZURE_STORAGE_KEY": ACCOUNT_KEY,
                # obstore's Azure backend finds the emulator here.
                "AZURITE_BLOB_STORAGE_URL": f"http://127.0.0.1:{self.port}"}

    def listing(self, prefix):
        """Name → size of every blob under prefix."""
        container = self.service.get_container_client(CONTAINER)
        return {b.name: b.size for b in container.list_blobs(name_starts_with=prefix)}

    def delete(self, prefix):
        container = self.service.get_container_client(CONTAINER)
        for name in list(self.listing(prefix)):
            container.delete_blob(name)



def azure_service(endpoint):
    from azure.storage.blob import BlobServiceClient
    return BlobServiceClient(account_url=endpoint, credential={"account_name": ACCOUNT, "account_key": ACCOUNT_KEY})


class Registry(LocalServer):
    """A throw-away distribution registry on loopback, without auth."""

    def __init__(self, data_dir, scratch, log_path):
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        config = Path(scratch) / "registry.yml"
        config.write_text(f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {data_dir}\n"
                          f"http:\n  addr: {self.host}\n")
        self.log = open(log_path, "ab")
        env = dict(os.environ, OTEL_TRACES_EXPORTER="none")
        self.proc = subprocess.Popen([tool("registry"), "serve", str(config)], stdout=self.log, stderr=self.log,
                                     env=env, start_new_session=True)
        wait_for(f"http://{self.host}/v2/", self.proc, log_path, "registry")
        # No credentials anywhere: neither tool may pick up the user's.
        self.docker_config = Path(scratch) / "docker"
        self.docker_config.mkdir(exist_ok=True)
        (self.docker_config / "config.json").write_text("{}")

    def env(self):
        return {"DOCKER_CONFIG": str(self.docker_config)}



class Hub(LocalServer):
    """`ferry-test-hub`: olah serving `source` as repository ferry/NAME,
    behind the front that redirects LFS files to MinIO."""

    def __init__(self, source, name, log_path):
        self.log = open(log_path, "ab")
        self.proc = subprocess.Popen([tool("ferry-test-hub"), str(source), name], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, start_new_session=True, text=True)
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"ferry-test-hub exited during start-up; see {log_path}")
        started = json.loads(line)
        self.endpoint, self.repo = started["endpoint"], started["repo"]

    def stop(self):
        # Closing its input lets it stop olah and MinIO itself; a signal
        # would end it before it does.
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def hub_command(t, hub, local, concurrency, home):
    if t == "ferry":
        return [tool("ferry-stager"), "pull", f"hf://{hub.repo}", local, "--endpoint-url", hub.endpoint,
                "--progress", "never"]
    if t == "hf":
        return [tool("hf"), "download", hub.repo, "--local-dir", local, "--max-workers", str(concurrency)]
    if t == "hf-transfer":
        # huggingface_hub 0.36 in the benchmark environment, with hf_transfer
        # (HF_HUB_ENABLE_HF_TRANSFER in hub_env).
        cli = str(Path(tool("bench-python")).parent / "huggingface-cli")
        return [cli, "download", hub.repo, "--local-dir", local, "--max-workers", str(concurrency)]
    raise ValueError(t)


def hub_env(t, base_env, hub, home):
    env = dict(base_env, HF_ENDPOINT=hub.endpoint, HF_HOME=str(home), HF_HUB_DISABLE_TELEMETRY="1")
    env.pop("HF_TOKEN", None)
    if t == "hf-transfer":
        env["HF_HUB_ENABLE_HF_TRANSFER"] = "1"
    return env


def azure_command(t, direction, prefix, local, concurrency, azurite):
    """The command line of tool `t` for one Azure run."""
    c = str(concurrency)
    if t == "ferry":
        # Ferry's default concurrency (`auto`), what its users run.
        uri = f"az://{CONTAINER}/{prefix}"
        args = ["pull", uri, local] if direction == "download" else ["push", local, uri]
        return [tool("ferry-stager")] + args + ["--progress", "never"]
    if t == "rclone":
        # Values with ':' or '=' must be quoted inside a connection string.
        remote = f":azureblob,account={ACCOUNT},key='{ACCOUNT_KEY}',endpoint='{azurite.endpoint}':"
        base = [tool("rclone"), "copy", "--transfers", c, "--checkers", c, "--multi-thread-streams", "4",
                "--no-check-dest", "--config", "/dev/null"]
        target = f"{remote}{CONTAINER}/{prefix}"
        return base + ([target, local] if direction == "download" else [local, target])
    if t == "azure-sdk":
        return python_peer("azure_blob_copy.py") + [direction, CONTAINER, prefix, local, "--concurrency", c]
    if t == "obstore":
        return python_peer("obstore_copy.py") + ["--backend", "azure", direction, CONTAINER, prefix, local,
                                                 "--concurrency", c]
    raise ValueError(t)


def registry_command(t, reference, local, concurrency, registry):
    if t == "ferry":
        return [tool("ferry-stager"), "pull", f"oci://{reference}", local, "--endpoint-url",
                f"http://{registry.host}", "--progress", "never"]
    if t == "oras":
        return [tool("oras"), "pull", "--plain-http", "--concurrency", str(concurrency), "-o", local, reference]
    raise ValueError(t)


def one_run(cmd, env, log, direction, check, target=None):
    """Runs `cmd`, checks what it did, removes the download `target`."""
    log.write(f"\n$ {' '.join(cmd)}\n".encode())
    log.flush()
    wall, cpu, rss, code, too_slow = measured(cmd, env, log, timeout=600)
    ok = code == 0 and not too_slow and check()
    if target is not None:
        shutil.rmtree(target, ignore_errors=True)
    return {"seconds": wall, "cpu_seconds": cpu, "peak_rss_bytes": rss, "exit_code": code, "ok": ok,
            "direction": direction, "argv": cmd}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="azure,registry,hub", help="azure, registry, hub (comma-separated)")
    parser.add_argument("--workloads", default="medium,large,many",
                        help="medium and large for every store; many (small files) for the Hub only")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply object counts (large: object size)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16, help="the peers' concurrency")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--smoke", action="store_true", help="seconds: tiny workloads, once")
    parser.add_argument("--out", default="bench/results/stores")
    parser.add_argument("--report", help="replace the stores table of this Markdown file")
    args = parser.parse_args()
    workloads = SMOKE if args.smoke else WORKLOADS
    if args.smoke:
        args.reps = 1
    chosen = {}
    for name in args.workloads.split(","):
        count, size = workloads[name]
        if name == "large":
            size = max(1, round(size * args.scale))
        else:
            count = max(1, round(count * args.scale))
        chosen[name] = (count, int(size * MIB))
    stores = args.backends.split(",")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / "stores.log", "wb")
    scratch = Path(tempfile.mkdtemp(prefix="ferry-bench-stores-"))
    need = 2 * sum(count * size for count, size in chosen.values())
    server_root = (Path(tempfile.mkdtemp(prefix="ferry-bench-stores-", dir="/dev/shm"))
                   if minio_store("auto", need) == "ram" else scratch / "servers")
    results = []
    try:
        sources = {name: generate(scratch / "source", name, count, size, args.seed)
                   for name, (count, size) in chosen.items()}
        digests = {name: tree_digest(path) for name, path in sources.items()}
        base_env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_", "FERRY_ENDPOINT"))}
        # The many-small-files shape is the Hub's (a dataset of shards); the
        # other stores' rows keep the two shapes they always had.
        both = {name: shape for name, shape in chosen.items() if name != "many"}
        their_sources = {name: sources[name] for name in both}
        if "azure" in stores:
            results += bench_azure(args, both, their_sources, digests, server_root, scratch, base_env, log, out)
        if "registry" in stores:
            results += bench_registry(args, both, their_sources, digests, server_root, scratch, base_env, log, out)
        if "hub" in stores:
            results += bench_hub(args, chosen, sources, digests, scratch, base_env, log, out)
        (out / "stores.json").write_text(json.dumps(results, indent=2))
        table = report(results, chosen, args)
        (out / "stores.md").write_text(table)
        print(table)
        if args.report:
            write_section(Path(args.report), table)
        failed = [r for r in results if not r["ok"]]
        if failed:
            raise SystemExit(f"{len(failed)} run(s) failed; see {out / 'stores.log'}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(server_root, ignore_errors=True)


def bench_azure(args, chosen, sources, digests, server_root, scratch, base_env, log, out):
    azurite = Azurite(server_root / "azurite", out / "azurite.log")
    results = []
    try:
        env = dict(base_env, **azurite.env())
        azurite.service.create_container(CONTAINER)
        for name, source in sources.items():
            # Seeded by the Azure SDK, as a team's data usually is: blobs up
            # to 64 MiB in one Put Blob (which records Content-MD5), larger
            # ones as committed block lists (no whole-blob checksum).
            container = azurite.service.get_container_client(CONTAINER)
            for rel in sorted(digests[name]):
                with open(source / rel, "rb") as f:
                    container.upload_blob(f"{name}/{rel}", f, overwrite=True, max_concurrency=4)
        for rep in range(args.reps):
            for name in chosen:
                for direction in ("download", "upload"):
                    for t in rotate(AZURE_TOOLS, rep):
                        local = scratch / "target" / t
                        shutil.rmtree(local, ignore_errors=True)
                        if direction == "download":
                            local.mkdir(parents=True)
                            prefix = name
                            check = lambda local=local, name=name: tree_digest(local) == digests[name]  # noqa: E731
                        else:
                            prefix = f"up/{t}/{name}"
                            local = sources[name]
                            shutil.rmtree(local / ".ferry", ignore_errors=True)
                            azurite.delete(prefix + "/")
                            want = {f"{prefix}/{k}": (local / k).stat().st_size for k in digests[name]}
                            check = lambda prefix=prefix, want=want: azurite.listing(prefix + "/") == want  # noqa: E731
                        cmd = azure_command(t, direction, prefix, str(local), args.concurrency, azurite)
                        r = one_run(cmd, env, log, direction, check, local if direction == "download" else None)
                        if direction == "upload":
                            shutil.rmtree(sources[name] / ".ferry", ignore_errors=True)
                            azurite.delete(prefix + "/")
                        r.update(store="Azure Blob (Azurite)", workload=name, tool=t, rep=rep)
                        results.append(r)
                        print(f"rep {rep + 1} azure {name} {direction} {t}: {r['seconds']:.2f} s "
                              f"{'ok' if r['ok'] else 'FAILED'}", flush=True)
    finally:
        azurite.stop()
    return results


def bench_registry(args, chosen, sources, digests, server_root, scratch, base_env, log, out):
    registry = Registry(server_root / "registry", scratch, out / "registry.log")
    results = []
    try:
        env = dict(base_env, **registry.env())
        references = {}
        for name, source in sources.items():
            reference = f"{registry.host}/{REPOSITORY}/{name}:v1"
            files = sorted(digests[name])
            # Each file one layer, titled with its path, as `oras push` and
            # ModelPack write model artifacts.
            subprocess.run([tool("oras"), "push", "--plain-http", reference] + files, cwd=source, env=env,
                           stdout=log, stderr=log, check=True)
            references[name] = reference
        for rep in range(args.reps):
            for name in chosen:
                for t in rotate(REGISTRY_TOOLS, rep):
                    local = scratch / "target" / t
                    shutil.rmtree(local, ignore_errors=True)
                    local.mkdir(parents=True)
                    check = lambda local=local, name=name: tree_digest(local) == digests[name]  # noqa: E731
                    cmd = registry_command(t, references[name], str(local), args.concurrency, registry)
                    r = one_run(cmd, env, log, "download", check, local)
                    r.update(store="OCI registry (distribution)", workload=name, tool=t, rep=rep)
                    results.append(r)
                    print(f"rep {rep + 1} registry {name} download {t}: {r['seconds']:.2f} s "
                          f"{'ok' if r['ok'] else 'FAILED'}", flush=True)
    finally:
        registry.stop()
    return results


def bench_hub(args, chosen, sources, digests, scratch, base_env, log, out):
    results = []
    for name in chosen:
        hub = Hub(sources[name], name, out / "hub.log")
        try:
            for rep in range(args.reps):
                for t in rotate(HUB_TOOLS, rep):
                    local = scratch / "target" / t
                    home = scratch / "hf-home" / t
                    shutil.rmtree(local, ignore_errors=True)
                    shutil.rmtree(home, ignore_errors=True)
                    local.mkdir(parents=True)

                    def check(local=local, name=name):
                        # The Hub's client keeps its metadata beside the files.
                        shutil.rmtree(local / ".cache", ignore_errors=True)
                        return tree_digest(local) == digests[name]

                    cmd = hub_command(t, hub, str(local), args.concurrency, home)
                    r = one_run(cmd, hub_env(t, base_env, hub, home), log, "download", check, local)
                    r.update(store="Hugging Face Hub (olah, LFS from MinIO)", workload=name, tool=t, rep=rep)
                    results.append(r)
                    print(f"rep {rep + 1} hub {name} download {t}: {r['seconds']:.2f} s "
                          f"{'ok' if r['ok'] else 'FAILED'}", flush=True)
        finally:
            hub.stop()
    return results


def rotate(tools, rep):
    """The tools in a different order each repetition: none always runs first."""
    k = rep % len(tools)
    return tools[k:] + tools[:k]


def report(results, chosen, args):
    lines = [
        f"{os.cpu_count()} CPUs; the server and the tool on the same CPUs; medians of {args.reps} run(s); peers at "
        f"concurrency {args.concurrency}, Ferry at its default; every download checked by SHA-256, every upload by "
        "listing. Workloads: " + ", ".join(f"{name} {count} × {size / MIB:g} MiB" for name, (count, size) in
                                            chosen.items()) + ".",
        "",
        "| store | workload | direction | tool | median s | MiB/s | Ferry's speed-up | CPU s | peak RSS MiB |",
        "|---|---|---|---|---:|---:|---:|---:|---:|",
    ]
    groups = {}
    for r in results:
        groups.setdefault((r["store"], r["workload"], r["direction"], r["tool"]), []).append(r)
    order = {t: i for i, t in enumerate(AZURE_TOOLS + REGISTRY_TOOLS[1:] + HUB_TOOLS[1:])}
    for (store, workload, direction, t), runs in sorted(groups.items(), key=lambda kv: (
            kv[0][0], list(chosen).index(kv[0][1]), kv[0][2], order[kv[0][3]])):
        ok = [r for r in runs if r["ok"]]
        if not ok:
            lines.append(f"| {store} | {workload} | {direction} | {t} | failed | | | | |")
            continue
        median = statistics.median(r["seconds"] for r in ok)
        ferry = [r["seconds"] for r in groups.get((store, workload, direction, "ferry"), []) if r["ok"]]
        speedup = "" if t == "ferry" or not ferry else f"{median / statistics.median(ferry):.2f}×"
        count, size = chosen[workload]
        lines.append(
            f"| {store} | {workload} | {direction} | {t} | {median:.2f} | {count * size / MIB / median:.0f} "
            f"| {speedup} | {statistics.median(r['cpu_seconds'] for r in ok):.2f} "
            f"| {max(r['peak_rss_bytes'] for r in ok) / MIB:.0f} |")
    return "\n".join(lines) + "\n"


def write_section(path, table):
    """Replaces the table between the stores markers of `path`."""
    begin, end = "<!-- stores:begin -->", "<!-- stores:end -->"
    text = path.read_text() if path.exists() else ""
    block = f"{begin}\n{table}{end}"
    if begin in text and end in text:
        text = text[: text.index(begin)] + block + text[text.index(end) + len(end):]
    else:
        text = text.rstrip() + f"\n\n## Azure Blob, OCI registries and the Hugging Face Hub\n\n{block}\n"
    path.write_text(text)


if __name__ == "__main__":
    main()
