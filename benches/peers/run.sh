#!/usr/bin/env bash
# braid replay against its peers on one generated gateway workload (BENCHMARKS.md "Peers: the
# gateway interval join"). Run by hand, not by CI:
#
#   benches/peers/run.sh [--seconds S] [--devices D] [--runs K] [--timeout T]
#
# 1. Generates the gateway workload with benches/replay_rss/gen.py: D devices (1000) over S s of
#    event time (600), a status a second and a command every ~10 s: about 650 k lines, in a
#    temporary directory (under /dev/shm when it is writable; removed at the end, KEEP=1 keeps it).
# 2. Runs, K times each (1), on the same files, each bounded by T seconds (900):
#    - `braid replay` (the release binary: $BRAID, default $CARGO_TARGET_DIR/release/braid) of
#      benches/replay_rss/gateway.toml (command ⋈ status on device, [-3 s, +5 s], inner) with
#      1 and 2 shards;
#    - Pathway (benches/peers/pathway_join.py under `pathway spawn --threads $PATHWAY_THREADS`,
#      default 2) if $PATHWAY_VENV (default /work/pathway-venv) has it: `pip install pathway`;
#    - Flink SQL through PyFlink (the script `braid export flink-sql` writes for the same config,
#      run by tests/flink/run_script.py at parallelism $FLINK_PARALLELISM, default 2, a
#      checkpoint every 5 s) if $FLINK_VENV (default /work/flink-venv) has apache-flink and
#      `java` is on the PATH.
#    A peer that is not installed is skipped with a message saying how to install it. With
#    BRAID_BASE=PATH, that braid binary runs too, in the same rounds, as the baseline. Each run
#    starts $SETTLE seconds (2) after the one before.
# 3. Checks that every run found the same number of results, and prints each one's events/s
#    (input lines / wall time of the whole process; "net" = without interpreter, JVM start and
#    planning, as the peers time themselves), peak RSS, versions, and braid's ratio to the best
#    peer in this run. Exit status 1 if the result counts differ or a run failed.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
seconds=600 devices=1000 runs=1 limit=900
while [ $# -gt 0 ]; do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --devices) devices=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --timeout) limit=$2; shift 2 ;;
    *) echo "usage: $0 [--seconds S] [--devices D] [--runs K] [--timeout T]" >&2; exit 2 ;;
  esac
done
braid=${BRAID:-${CARGO_TARGET_DIR:-$repo/target}/release/braid}
pathway_venv=${PATHWAY_VENV:-/work/pathway-venv}
flink_venv=${FLINK_VENV:-/work/flink-venv}
pathway_threads=${PATHWAY_THREADS:-2}
flink_parallelism=${FLINK_PARALLELISM:-2}
config=$repo/benches/replay_rss/gateway.toml
if [ ! -x "$braid" ]; then
  echo "peers: no braid binary at $braid: build it with \`cargo build --release\` or set BRAID" >&2
  exit 2
fi
parent=/tmp
[ -w /dev/shm ] && parent=/dev/shm
work=$(mktemp -d "$parent/braid-peers.XXXXXX")
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$work"' EXIT
data=$work/data results=$work/results.tsv
mkdir -p "$data"
echo "peers: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), load $(cut -d' ' -f1-3 /proc/loadavg), work dir $work"
python3 "$repo/benches/replay_rss/gen.py" "$seconds" "$data" "$devices" 1000 10000 > /dev/null
events=$(cat "$data/command.jsonl" "$data/status.jsonl" | wc -l)
echo "peers: workload: $devices devices × $seconds s: $events lines ($(wc -l < "$data/command.jsonl") command + $(wc -l < "$data/status.jsonl") status), $(du -sh "$data" | cut -f1)"
: > "$results"

# timed NAME RUN VERSION COUNT_COMMAND -- COMMAND...: runs COMMAND under /usr/bin/time and timeout,
# then COUNT_COMMAND (a shell snippet printing the result count); appends a line to results.tsv.
timed() {
  local name=$1 run=$2 version=$3 count=$4; shift 5
  local log=$work/$name-$run.log
  # The previous run's teardown (a JVM's, Pathway's gigabyte) runs on for a moment after it
  # exits: without a pause, whichever braid came next ran slower (0.51-0.55 s against 0.39).
  sleep "${SETTLE:-2}"
  local load; load=$(cut -d' ' -f1 /proc/loadavg)
  /usr/bin/time -f 'TIME %e %M' timeout --kill-after=10 "$limit" "$@" > "$log" 2>&1
  local rc=$?
  local wall rss net found
  read -r wall rss < <(grep '^TIME ' "$log" | tail -1 | cut -d' ' -f2-)
  net=$(grep -o 'net_s=[0-9.]*' "$log" | tail -1 | cut -d= -f2)
  found=$(eval "$count" 2>/dev/null || echo 0)
  if [ $rc -ne 0 ]; then
    echo "peers: $name run $run failed (exit $rc$([ $rc = 124 ] && echo ", timed out after $limit s")); last lines of $log:" >&2
    tail -5 "$log" | sed 's/^/  /' >&2
    found=-1
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$run" "$wall" "${net:--}" "$rss" "$found" "$load" "$version" >> "$results"
  printf 'peers:   %-16s run %s: %6s s wall, net %6s s, peak RSS %7s KiB, %s results (load %s)\n' "$name" "$run" "$wall" "${net:--}" "$rss" "$found" "$load"
}

braid_version=$("$braid" --version 2>/dev/null | head -1)
braid_version="${braid_version:-braid} ($(git -C "$repo" rev-parse --short HEAD 2>/dev/null))"
have_pathway=0
if "$pathway_venv/bin/python" -c 'import pathway' 2>/dev/null; then
  have_pathway=1
  pathway_version="pathway $("$pathway_venv/bin/python" -c 'import pathway; print(pathway.__version__)' 2>/dev/null)"
else
  echo "peers: Pathway skipped: no \`import pathway\` in $pathway_venv (python3 -m venv $pathway_venv && $pathway_venv/bin/pip install pathway, or set PATHWAY_VENV)"
fi
have_flink=0
if ! command -v java > /dev/null; then
  echo "peers: Flink skipped: no java on the PATH (Java 17: apt-get install openjdk-17-jre-headless)"
elif ! "$flink_venv/bin/python" -c 'import pyflink' 2>/dev/null; then
  echo "peers: Flink skipped: no \`import pyflink\` in $flink_venv (python3 -m venv $flink_venv && $flink_venv/bin/pip install 'apache-flink==1.20.*', or set FLINK_VENV)"
else
  have_flink=1
  flink_version="apache-flink $("$flink_venv/bin/pip" show apache-flink 2>/dev/null | sed -n 's/^Version: //p'), $(java -version 2>&1 | head -1 | sed 's/"//g')"
  "$braid" export flink-sql --config "$config" --input "command=$data/command.jsonl" --input "status=$data/status.jsonl" \
    --output "effect=$work/flink-out" > "$work/flink.sql"
fi

# BRAID_BASE=PATH: a baseline braid binary run alongside, in the same rounds ("braid@base-N-shard").
braids="braid=$braid"
if [ -n "${BRAID_BASE:-}" ]; then braids="$braids braid@base=$BRAID_BASE"; fi
for run in $(seq 1 "$runs"); do
  for entry in $braids; do
  label=${entry%%=*} bin=${entry#*=}
  version=$braid_version
  [ "$label" = braid ] || version="$("$bin" --version 2>/dev/null | head -1) (baseline)"
  for shards in 1 2; do
    out=$work/braid-$shards
    rm -rf "$out" && mkdir -p "$out"
    timed "${label}-${shards}-shard" "$run" "$version" "wc -l < $out/effect.jsonl" -- \
      "$bin" replay --config "$config" --shards "$shards" \
      --input "command=$data/command.jsonl" --input "status=$data/status.jsonl" \
      --output "effect=$out/effect.jsonl" --output "effect.late=$out/late.jsonl" --output "dead_letter=$out/dead.jsonl"
    for side in late dead; do
      if [ -s "$out/$side.jsonl" ]; then echo "peers: braid wrote $(wc -l < "$out/$side.jsonl") $side rows: the workload should have none" >&2; fi
    done
  done
  done
  if [ $have_pathway = 1 ]; then
    out=$work/pathway-out.jsonl
    rm -f "$out"
    timed "pathway-${pathway_threads}-thr" "$run" "$pathway_version" \
      "python3 -c 'import json,sys; print(sum(json.loads(l)[\"diff\"] for l in open(sys.argv[1])))' $out" -- \
      "$pathway_venv/bin/pathway" spawn --threads "$pathway_threads" "$pathway_venv/bin/python" "$here/pathway_join.py" "$data" "$out"
  fi
  if [ $have_flink = 1 ]; then
    rm -rf "$work/flink-out"
    timed "flink-p${flink_parallelism}" "$run" "$flink_version" \
      "find $work/flink-out -type f ! -name '.*' -exec cat {} + | wc -l" -- \
      "$flink_venv/bin/python" "$repo/tests/flink/run_script.py" "$work/flink.sql" "$flink_parallelism" "5 s"
  fi
done

python3 "$here/summary.py" "$results" "$events"
