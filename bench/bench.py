#!/usr/bin/env python3
"""Ferry's benchmark suite: ferry-stager against its peers on the same data.

Starts a local MinIO, generates workloads reproducibly from a seed, and runs
every tool on the same objects in alternating order, several repetitions
each, for downloads (bucket prefix -> directory) and uploads (directory ->
bucket prefix). Each run is one fresh process tree; its wall time, CPU
(user + sys of the whole tree, from wait4) and peak RSS (of the largest
process in the tree) are recorded. Results: a JSON file, a Markdown report
and a PNG chart.

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


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Minio:
    """A throw-away MinIO on loopback."""

    def __init__(self, data_dir, log_path):
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.trash = Path(data_dir) / ".minio.sys" / "tmp" / ".trash"
        env = dict(os.environ, MINIO_ROOT_USER=ACCESS_KEY, MINIO_ROOT_PASSWORD=SECRET_KEY,
                   MINIO_BROWSER="off", MINIO_UPDATE="off")
        self.log = open(log_path, "wb")
        self.proc = subprocess.Popen(
            [tool("minio"), "server", str(data_dir), "--address", f"127.0.0.1:{self.port}",
             "--console-address", f"127.0.0.1:{free_port()}", "--quiet"],
            env=env, stdout=self.log, stderr=self.log, start_new_session=True)
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if urllib.request.urlopen(f"{self.endpoint}/minio/health/cluster", timeout=1).status == 200:
                    return
            except OSError:
                time.sleep(0.2)
        raise SystemExit("MinIO did not become healthy")

    def empty_trash(self):
        """MinIO moves deleted objects into a trash directory and frees it in
        the background, far slower than a benchmark deletes hundreds of GiB
        of uploads; what is in there is deleted data, so free it now."""
        shutil.rmtree(self.trash, ignore_errors=True)

    def stop(self):
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(timeout=20)


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
        base = [tool("ferry-stager")]
        if direction == "download":
            return base + ["pull", uri, local, "--concurrency", c, "--progress", "never"] + FERRY_ARGS
        return base + ["push", local, uri, "--concurrency", c, "--progress", "never"] + FERRY_ARGS
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


def measured(cmd, env, log, timeout=None):
    """Runs `cmd` as a fresh process tree under bench/measure; returns wall
    seconds, CPU seconds (user + sys of the tree), peak RSS bytes, exit code
    and whether it was stopped for running past `timeout` seconds."""
    limit = ["-t", f"{timeout:.1f}"] if timeout else []
    with tempfile.NamedTemporaryFile("r", suffix=".measure") as result:
        subprocess.run([tool("measure")] + limit + [result.name] + cmd, env=env, stdout=log, stderr=log, check=True)
        wall, cpu, rss_kib, code, timed_out = result.read().split()
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
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one repetition, no sweep (for tests)")
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
    minio = Minio(minio_root / "store", out / "minio.log")
    env = peer_env(minio)
    log = open(out / "runs.log", "wb")
    results = []
    hide = {str(scratch_root): "$WORK", str(base): "$WORK", minio.endpoint: "$ENDPOINT"}
    try:
        # A reused --work-dir keeps MinIO's store, bucket included.
        if not (minio_root / "store" / BUCKET).is_dir():
            subprocess.run([tool("s5cmd"), "--endpoint-url", minio.endpoint, "mb", f"s3://{BUCKET}"], env=env,
                           check=True, stdout=log, stderr=log)
        for name, (count, size) in workloads.items():
            source = generate(data_root, name, count, size, args.seed)
            total = count * size
            print(f"== {name}: {count} x {size} B = {total / MIB:.0f} MiB", flush=True)
            subprocess.run([tool("s5cmd"), "--endpoint-url", minio.endpoint, "cp", f"{source}/",
                            f"s3://{BUCKET}/{name}/"], env=env, check=True, stdout=log, stderr=log)
            for direction in args.directions.split(","):
                fastest = [None]  # the fastest successful run of this workload and direction so far
                stopped = set()  # (tool, setting) recorded as too slow here: not run again

                def run(t, setting, concurrency, rep):
                    timeout = max(min_timeout, args.too_slow * fastest[0]) if fastest[0] else None
                    r = one_run(t, direction, name, source, scratch_root, concurrency, env, minio, log, timeout)
                    r.update(workload=name, setting=setting, rep=rep, objects=count, bytes=total,
                             command=shown(r.pop("argv"), hide))
                    results.append(r)
                    if r["ok"]:
                        fastest[0] = min(fastest[0] or r["seconds"], r["seconds"])
                    if r["too_slow"]:
                        stopped.add((t, setting))
                    status = "ok" if r["ok"] else f"TOO SLOW (stopped at {timeout:.0f} s)" if r["too_slow"] else "FAILED"
                    print(f"   {direction:8} {t:8} {setting:6} c={concurrency:<4} {r['seconds']:7.2f} s "
                          f"{r['cpu_seconds']:6.2f} CPU-s {r['peak_rss_bytes'] / MIB:6.0f} MiB {status}", flush=True)
                    return r

                # Repetition 0: every tool at the shared budget.
                settings = {t: {"budget": args.concurrency} for t in tools}
                first = {t: run(t, "budget", args.concurrency, 0) for t in tools}
                # The sweep, once per point, only where it can change the
                # ranking: Ferry, and the peers whose first run is within
                # --sweep-within of the fastest peer's (in the first full
                # run no sweep point moved a tool by more than 10%, so a
                # peer 30% behind the fastest would stay behind it). A point
                # that beats the tool's budget run becomes its "best"
                # setting, and that run counts as the best row's first
                # repetition.
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
    finally:
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
    (out / "results.json").write_text(json.dumps({"machine": meta, "runs": results, "summary": summary}, indent=2))
    report = markdown(meta, summary, results, workloads, reps, sys.argv[1:], args)
    (out / "report.md").write_text(report)
    if args.report:
        Path(args.report).write_text(report)
    chart(summary, out / "chart.png")
    failed = [r for r in results if not r["ok"] and not r["too_slow"]]
    print(f"wrote {out}/results.json, report.md, chart.png in {elapsed / 60:.1f} min; "
          f"{len(failed)} failed runs (details in runs.log)")
    # A failed run is a broken tool setup or a broken Ferry: either way the
    # figures are incomplete, so the run fails. A run stopped as too slow is a
    # result, not a failure.
    return 1 if failed else 0


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


def one_run(t, direction, workload, source, scratch_root, concurrency, env, minio, log, timeout=None):
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
    wall, cpu, rss, code, too_slow = measured(cmd, env, log, timeout)
    ok = code == 0 and not too_slow and check(direction, source, local, prefix, env, minio, log)
    shutil.rmtree(local, ignore_errors=True)
    if direction == "upload":
        shutil.rmtree(source / ".ferry", ignore_errors=True)
        subprocess.run([tool("s5cmd"), "--endpoint-url", minio.endpoint, "rm", f"s3://{BUCKET}/{prefix}/*"],
                       env=env, stdout=log, stderr=log)
        minio.empty_trash()
    return {"tool": t, "direction": direction, "concurrency": concurrency, "seconds": wall, "cpu_seconds": cpu,
            "peak_rss_bytes": rss, "exit_code": code, "ok": ok, "too_slow": too_slow, "timeout": timeout,
            "argv": cmd}


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
            groups.setdefault((r["workload"], r["direction"], r["tool"], r["setting"]), []).append(r)
    rows = []
    for (workload, direction, t, setting), runs in sorted(groups.items()):
        ok = [r for r in runs if r["ok"]]
        too_slow = [r for r in runs if r["too_slow"]]
        if too_slow:
            rows.append({"workload": workload, "direction": direction, "tool": t, "setting": setting, "ok": False,
                         "too_slow": True, "concurrency": runs[0]["concurrency"], "timeout": too_slow[0]["timeout"],
                         "cpu_seconds_per_gib": too_slow[0]["cpu_seconds"] / (runs[0]["bytes"] / GIB),
                         "peak_rss_mib": max(r["peak_rss_bytes"] for r in runs) / MIB})
            continue
        if not ok:
            rows.append({"workload": workload, "direction": direction, "tool": t, "setting": setting, "ok": False})
            continue
        secs = [r["seconds"] for r in ok]
        size, objects = ok[0]["bytes"], ok[0]["objects"]
        median = statistics.median(secs)
        rows.append({
            "workload": workload, "direction": direction, "tool": t, "setting": setting, "ok": True,
            "concurrency": ok[0]["concurrency"], "runs": len(ok), "failed_runs": len(runs) - len(ok),
            "median_seconds": median, "min_seconds": min(secs), "max_seconds": max(secs),
            "mib_per_second": size / MIB / median, "objects_per_second": objects / median,
            "cpu_seconds_per_gib": statistics.median(r["cpu_seconds"] for r in ok) / (size / GIB),
            "peak_rss_mib": max(r["peak_rss_bytes"] for r in ok) / MIB,
        })
    # Ferry's ratio to each peer: best setting of each against best of Ferry.
    for row in rows:
        if not row["ok"] or row["tool"] == "ferry":
            continue
        ferry = best_row(rows, row["workload"], row["direction"], "ferry")
        peer = best_row(rows, row["workload"], row["direction"], row["tool"])
        if ferry and peer is row:
            row["ferry_speedup"] = peer["median_seconds"] / ferry["median_seconds"]
    return rows


def best_row(rows, workload, direction, t):
    candidates = [r for r in rows if r["ok"] and r["workload"] == workload and r["direction"] == direction
                  and r["tool"] == t]
    return min(candidates, key=lambda r: r["median_seconds"]) if candidates else None


def machine(args):
    def version(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
        except Exception:  # noqa: BLE001 - a missing version is not fatal
            return "unknown"
    return {
        # The kernel's major.minor only: its full release string names the build host.
        "cpus": os.cpu_count(), "python": platform.python_version(),
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
            f"budget run (the sweep covers Ferry and the peers within {args.sweep_within:g}× of the fastest "
            "peer's first run; the winning sweep run is the best row's first repetition). ")


def markdown(meta, summary, results, workloads, reps, argv, args):
    minutes = meta["elapsed_seconds"] / 60
    lines = ["# Benchmarks", "",
             f"Generated by `bench/run {' '.join(argv)}` in {minutes:.0f} minutes. Every tool moves the same objects "
             "to and from a local MinIO on the same machine, alternating order, medians of "
             f"{reps} runs (min–max in brackets). CPU is user + sys of the tool's whole process tree per GiB moved; "
             "RSS is the peak of the largest process. \"budget\" runs every tool at the same concurrency "
             f"({args.concurrency}). " + sweep_text(args) + "A run longer than "
             f"{args.too_slow:g}× the fastest run of its workload and direction (and {args.min_timeout:g} s) is "
             "stopped and its tool recorded as too slow there. Speed-up is Ferry's best median against the "
             "peer's best (> 1: Ferry is faster).", "",
             f"Machine: {meta['cpus']} CPUs ({meta['cpu_model']}), {meta['memory_gib']} GiB, {meta['platform']}, "
             f"data on {'tmpfs' if meta['tmpfs'] else 'disk'}. MinIO runs on the same CPUs, its store "
             f"{'in RAM (tmpfs)' if meta.get('minio_store') == 'ram' else 'on disk'}.", "",
             "Versions: " + "; ".join(f"{k} {v}" for k, v in meta["versions"].items()), ""]
    for name, (count, size) in workloads.items():
        for direction in ("download", "upload"):
            rows = [r for r in summary if r["workload"] == name and r["direction"] == direction]
            if not rows:
                continue
            lines += [f"## {name} ({count} × {size / MIB:g} MiB), {direction}", "",
                      "| tool | setting | concurrency | median s (min–max) | MiB/s | objects/s | CPU s/GiB | peak RSS MiB | Ferry speed-up |",
                      "|---|---|---|---|---|---|---|---|---|"]
            for r in sorted(rows, key=lambda r: r.get("median_seconds", 1e9)):
                if r.get("too_slow"):
                    ferry = best_row(summary, name, direction, "ferry")
                    speedup = f"> {r['timeout'] / ferry['median_seconds']:.1f}×" if ferry else ""
                    lines.append(f"| {r['tool']} | {r['setting']} | {r['concurrency']} | too slow: stopped at "
                                 f"{r['timeout']:.0f} s | | | | {r['peak_rss_mib']:.0f} | {speedup} |")
                    continue
                if not r["ok"]:
                    lines.append(f"| {r['tool']} | {r['setting']} | | failed | | | | | |")
                    continue
                speedup = f"{r['ferry_speedup']:.2f}×" if "ferry_speedup" in r else ""
                lines.append(
                    f"| {r['tool']} | {r['setting']} | {r['concurrency']} | {r['median_seconds']:.2f} "
                    f"({r['min_seconds']:.2f}–{r['max_seconds']:.2f}) | {r['mib_per_second']:.0f} | "
                    f"{r['objects_per_second']:.0f} | {r['cpu_seconds_per_gib']:.2f} | {r['peak_rss_mib']:.0f} | {speedup} |")
            lines.append("")
    lines += ["## Command lines", "",
              "One per tool and direction, as run (the first repetition of the last workload that ran it; only "
              "the prefix, the directory and the concurrency change between runs). `$ENDPOINT` is the MinIO "
              "the suite started, `$WORK` its scratch directory; the Python peers run the scripts in "
              "`bench/peers/`, with the endpoint and credentials in the environment (`AWS_ENDPOINT_URL`, "
              "`AWS_ACCESS_KEY_ID`, ...). `bench/results/runs.log` has every command line of a run with its output.",
              "", "```"]
    seen = {}
    for r in results:
        if r["setting"] == "budget" and r["rep"] == 0:
            seen[(r["tool"], r["direction"])] = r["command"]
    lines += [command for _, command in sorted(seen.items())]
    lines += ["```", ""]
    return "\n".join(lines)


def chart(summary, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = sorted({(r["workload"], r["direction"]) for r in summary})
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 4), squeeze=False)
    for ax, (workload, direction) in zip(axes[0], panels):
        best = {}
        for r in summary:
            if r["ok"] and r["workload"] == workload and r["direction"] == direction:
                if r["tool"] not in best or r["mib_per_second"] > best[r["tool"]]:
                    best[r["tool"]] = r["mib_per_second"]
        names = sorted(best, key=best.get, reverse=True)
        ax.bar(names, [best[n] for n in names], color=["#d9480f" if n == "ferry" else "#868e96" for n in names])
        ax.set_title(f"{workload} {direction}")
        ax.set_ylabel("MiB/s (best setting, median)")
        ax.tick_params(axis="x", rotation=60)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
