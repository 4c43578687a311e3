# Sourced by the shell benchmarks (bench/listing.sh, bench/versions.sh): a
# scratch directory $W with bench/measure.c built as $W/measure, a MinIO
# from the tool cache serving $W/data on 127.0.0.1:$PORT (process $MPID,
# endpoint $E), its credentials exported for the AWS tools, and the tool
# cache's s5cmd as $S5. Set PORT before sourcing.
MINIO=$(hack/tools.sh path minio); S5=$(hack/tools.sh path s5cmd)
W=$(mktemp -d)
gcc -O2 -o "$W/measure" bench/measure.c
export MINIO_ROOT_USER=benchuser MINIO_ROOT_PASSWORD=benchpassword
$MINIO server --address 127.0.0.1:$PORT "$W/data" > "$W/minio.log" 2>&1 &
MPID=$!
sleep 3
export AWS_ACCESS_KEY_ID=benchuser AWS_SECRET_ACCESS_KEY=benchpassword AWS_REGION=us-east-1
E=http://127.0.0.1:$PORT
