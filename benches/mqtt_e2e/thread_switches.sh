#!/bin/bash
# Context switches and CPU per braid thread over each braid's life in one saturation run
# (BENCHMARKS.md "One thread for a source's messages").
#
#   benches/mqtt_e2e/thread_switches.sh BRAID_BIN [MQTT_E2E_ARGS...]
#
# Runs `mqtt_e2e --bench --publishers 16 --runs 1 --saturation-only --braid BRAID_BIN` (build it
# first: `cargo bench --bench mqtt_e2e --no-run`; MQTT_E2E=path overrides the one found under
# target/release/deps) and follows the two `braid run` processes it starts, (b) results over MQTT
# then (c) results to a file: the last sample of /proc/PID/task/*/status and stat before each
# ends that still shows all its threads, one line per thread — voluntary and involuntary switches, utime and stime (clock ticks).
# The bench's own table goes to thread_switches.log. Run by hand, never by CI.
set -euo pipefail
braid=$(realpath "$1"); shift
name=$(basename "$braid" | cut -c1-15)
bench=${MQTT_E2E:-$(ls -t target/release/deps/mqtt_e2e-* 2>/dev/null | grep -v '\.d$' | head -1)}
[ -x "$bench" ] || { echo "no mqtt_e2e bench binary (cargo bench --bench mqtt_e2e --no-run)" >&2; exit 1; }
"$bench" --bench --publishers 16 --runs 1 --saturation-only --braid "$braid" "$@" > thread_switches.log 2>&1 &
bench_pid=$!

# Waits (at most 60 s) for the next braid process, then samples it until it ends.
follow() {
    local pid="" last="" sample
    for _ in $(seq 1 1200); do
        pid=$(pgrep -x "$name" | head -1) && break
        kill -0 "$bench_pid" 2>/dev/null || return 1
        sleep 0.05
    done
    [ -n "$pid" ] || return 1
    while [ -d "/proc/$pid" ]; do
        sample=$(for task in /proc/"$pid"/task/*; do
            comm=$(cat "$task/comm" 2>/dev/null) || continue
            switches=$(awk '/^(voluntary|nonvoluntary)_ctxt_switches/ {printf "%s ", $2}' "$task/status" 2>/dev/null)
            ticks=$(awk '{print $14, $15}' "$task/stat" 2>/dev/null)
            [ -n "$switches" ] && echo "  $comm voluntary/involuntary $switches utime/stime $ticks"
        done)
        # Threads end one by one at the exit: a sample that lost some keeps the one before.
        [ -n "$sample" ] && [ "$(wc -l <<< "$sample")" -ge "$(wc -l <<< "$last")" ] && last=$sample
        sleep 0.2
    done
    echo "$last"
}

echo "(b) results over MQTT"; follow
echo "(c) results to a file"; follow
wait "$bench_pid"
grep '^| 1 |' thread_switches.log
