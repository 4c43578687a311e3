#!/bin/bash
# Versions: the disk a new version takes when 1% of the objects changed, and
# how long a switch takes on one node. N objects of SIZE bytes on MinIO;
# `pull --versions switch` stages them; 1% are uploaded again with new
# bytes; `pull --versions build` stages the new version beside the current
# one (du before and after: hard links are counted once); then `ferry-stager
# switch` flips between the two versions, 5 times each way, timed.
# Needs `hack/build.sh` and `hack/tools.sh install minio s5cmd`.
# N=1000 SIZE=262144 bench/versions.sh
set -u
cd "$(dirname "$0")/.."
N=${N:-1000}; SIZE=${SIZE:-262144}
PORT=19779
. bench/scratch-minio.sh
trap 'kill $MPID 2>/dev/null; rm -rf "$W"' EXIT
ST=target/release/ferry-stager
$S5 --endpoint-url $E mb s3://versions >/dev/null
python3 - "$W/src" "$N" "$SIZE" <<'PY'
import os, sys
root, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.makedirs(root)
for i in range(n):
    with open(os.path.join(root, f"o{i:05d}.bin"), "wb") as f: f.write(os.urandom(size))
PY
$S5 --endpoint-url $E --numworkers 32 cp "$W/src/*" s3://versions/model/ > /dev/null
D="$W/dst"
$ST pull s3://versions/model "$D" --endpoint-url $E --versions switch --summary-file "$W/v1.json" 2>/dev/null
one=$(du -sb "$D" | cut -f1)
# 1% of the objects change.
CHANGED=$(( N / 100 > 0 ? N / 100 : 1 ))
python3 - "$W/src" "$CHANGED" "$SIZE" <<'PY'
import os, sys
root, k, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for i in range(k):
    with open(os.path.join(root, f"o{i * 100:05d}.bin"), "wb") as f: f.write(os.urandom(size))
PY
for i in $(seq 0 $((CHANGED - 1))); do
  $S5 --endpoint-url $E cp "$W/src/$(printf 'o%05d.bin' $((i * 100)))" s3://versions/model/ > /dev/null
done
"$W/measure" "$W/build" $ST pull s3://versions/model "$D" --endpoint-url $E --versions build --summary-file "$W/v2.json" 2>/dev/null
two=$(du -sb "$D" | cut -f1)
d1=$(python3 -c "import json; print(json.load(open('$W/v1.json'))['snapshot']['digest'])")
d2=$(python3 -c "import json; print(json.load(open('$W/v2.json'))['snapshot']['digest'])")
for rep in 1 2 3 4 5; do
  "$W/measure" "$W/to2.$rep" $ST switch "$D" --to "$d2" --keep "$d1"
  "$W/measure" "$W/to1.$rep" $ST switch "$D" --to "$d1" --keep "$d2"
done > /dev/null 2>&1
python3 - "$W" "$N" "$SIZE" "$CHANGED" "$one" "$two" <<'PY'
import json, statistics, sys
w, n, size, changed, one, two = sys.argv[1], *map(int, sys.argv[2:])
v2 = json.load(open(f"{w}/v2.json"))
def wall(name):
    # measure.c writes "WALL CPU MAXRSS_KIB EXIT TIMED_OUT"
    return float(open(f"{w}/{name}").read().split()[0])
switches = [wall(f"to{d}.{r}") for d in (1, 2) for r in range(1, 6)]
print(f"{n} objects of {size} bytes; {changed} changed ({100 * changed / n:.0f}%)")
print(f"one version: {one} bytes on disk; with the second beside it: {two} bytes "
      f"(+{two - one}, {100 * (two - one) / one:.2f}%; the changed objects are {changed * size} bytes)")
print(f"building the second version: fetched {v2['objects']['transferred']} objects, linked {v2['objects']['skipped']}, "
      f"{wall('build'):.2f} s")
print(f"switch (seal, link, keep the other): median {statistics.median(switches) * 1000:.1f} ms "
      f"(min {min(switches) * 1000:.1f}, max {max(switches) * 1000:.1f}) over {len(switches)}")
PY
