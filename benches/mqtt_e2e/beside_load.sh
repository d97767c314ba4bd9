#!/bin/bash
# The MQTT bench's fixed load with other work beside braid (BENCHMARKS.md "The shards' tail in a
# state that keeps its size, beside other load").
#
#   benches/mqtt_e2e/beside_load.sh BRAID_BIN [ROUNDS]
#
# Each round runs `mqtt_e2e --bench --publishers 16 --runs 1 --fixed-seconds 20 --braid BRAID_BIN`
# three times: on a quiet machine; beside a shell busy loop at the same priority (a CPU hog); and
# beside a release build of braid with 2 jobs in a fresh target directory under $TMPDIR, started
# again as it ends (a compile's load: CPU, memory bandwidth, caches). It prints the bench's
# shard-latency lines and table rows. Build the bench first (`cargo bench --bench mqtt_e2e
# --no-run`; MQTT_E2E=path overrides the one found under target/release/deps). Run by hand, never
# by CI.
set -uo pipefail
braid=$(realpath "$1"); rounds=${2:-3}
repo=$(cd "$(dirname "$0")/../.." && pwd)
bench=${MQTT_E2E:-$(ls -t "$repo"/target/release/deps/mqtt_e2e-* 2>/dev/null | grep -v '\.d$' | head -1)}
[ -x "$bench" ] || { echo "no mqtt_e2e bench binary (cargo bench --bench mqtt_e2e --no-run)" >&2; exit 1; }
target=$(mktemp -d)
trap 'rm -rf "$target"' EXIT

measure() {
    echo "### $1 $(uptime)"
    "$bench" --bench --publishers 16 --runs 1 --fixed-seconds 20 --braid "$braid" 2>&1 | grep -E "held ≤ 10|^\| 1 \|"
}

for round in $(seq 1 "$rounds"); do
    measure "round $round quiet"
    ( while :; do :; done ) & hog=$!
    measure "round $round beside a CPU hog"
    kill "$hog"
    setsid bash -c "cd '$repo' && while :; do rm -rf '$target/build'; CARGO_TARGET_DIR='$target/build' cargo build --release --locked -j 2 >/dev/null 2>&1; done" < /dev/null & build=$!
    measure "round $round beside a release build"
    kill -- -"$build" 2>/dev/null
    pkill -f "$target/build" 2>/dev/null
    wait 2>/dev/null
done
