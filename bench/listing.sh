#!/bin/bash
# Listing throughput: s5cmd ls of N objects against a ferry pull re-run with
# nothing to copy (listing + one stat per object + the manifest merge), same
# MinIO, alternating, 5 repetitions each. Needs `hack/build.sh` and the
# tool cache (`hack/tools.sh install minio s5cmd`).
# N=100000 bench/listing.sh
set -u
cd "$(dirname "$0")/.."
N=${N:-100000}
PORT=19778
. bench/scratch-minio.sh
$S5 --endpoint-url $E mb s3://list-bench >/dev/null
python3 - "$W/src" "$N" <<'PY'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    d = os.path.join(root, f"d{i // 1000:04d}")
    if i % 1000 == 0: os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"o{i % 1000:04d}.bin"), "wb") as f: f.write(os.urandom(256))
PY
t0=$(date +%s)
$S5 --endpoint-url $E --numworkers 64 cp "$W/src/*" s3://list-bench/ds/ > /dev/null
echo "uploaded $N in $(( $(date +%s) - t0 )) s"
ST=target/release/ferry-stager
$ST pull s3://list-bench/ds/ "$W/dst" --endpoint-url $E --summary-file "$W/first.json" 2>/dev/null >/dev/null
python3 -c "import json; s=json.load(open('$W/first.json')); print('first pull', s['objects'])"
for rep in 1 2 3 4 5; do
  "$W/measure" "$W/s5.$rep" sh -c "$S5 --endpoint-url $E ls 's3://list-bench/ds/*' | wc -l > $W/s5count"
  "$W/measure" "$W/ferry.$rep" $ST pull s3://list-bench/ds/ "$W/dst" --endpoint-url $E --summary-file "$W/re.json"
done 2>/dev/null >/dev/null
echo "s5cmd ls lines: $(cat $W/s5count); ferry re-run: $(python3 -c "import json; s=json.load(open('$W/re.json')); print(s['objects'])")"
python3 - "$W" <<'PY'
import sys, statistics
w = sys.argv[1]
def rows(tool):
    out = []
    for rep in range(1, 6):
        wall, cpu, rss, code, _ = open(f"{w}/{tool}.{rep}").read().split()
        out.append((float(wall), float(cpu), int(rss) / 1024, int(code)))
    return out
for tool in ("s5", "ferry"):
    r = rows(tool)
    print(tool, "wall median %.2f s (%s)" % (statistics.median(x[0] for x in r), ", ".join("%.2f" % x[0] for x in r)),
          "cpu median %.2f s" % statistics.median(x[1] for x in r), "peak RSS median %.1f MiB" % statistics.median(x[2] for x in r),
          "exit", set(x[3] for x in r))
PY
kill $MPID; rm -rf "$W"
