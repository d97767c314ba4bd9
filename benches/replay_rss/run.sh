#!/bin/sh
# The replay figures of BENCHMARKS.md's summary: peak RSS at about 1 M and 10 M input lines, and
# events/s with 1 and 2 shards, in one run. Run by hand, not by CI:
#   sh benches/replay_rss/run.sh [BINARY]     # default $CARGO_TARGET_DIR/release/braid; ≈ 5 min
# Generates the two inputs (gen.py 3000 s = 985 113 lines, 30 000 s = 9 850 024 lines, ≈ 430 MB)
# in a temporary directory under /dev/shm (tmpfs pages read with read() are not in the replay's
# RSS), runs measure.sh with 1 and 2 shards on each (1 shard, 2 shards, then again, so the load
# of the machine falls on both alike), checks every run wrote the same sorted effect rows, and
# removes the directory (KEEP=1 keeps it).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
B=${1:-${CARGO_TARGET_DIR:-$HERE/../../target}/release/braid}
[ -x "$B" ] || { echo "replay_rss: no braid binary at $B (cargo build --release)" >&2; exit 2; }
W=$(mktemp -d /dev/shm/braid-replay-rss.XXXXXX)
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$W"' EXIT
echo "replay_rss: $B ($(git -C "$HERE" rev-parse --short HEAD 2>/dev/null)), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
status=0
for size in 1m:3000 10m:30000; do
  label=${size%%:*}; seconds=${size#*:}
  mkdir -p "$W/$label"
  python3 "$HERE/gen.py" "$seconds" "$W/$label" > /dev/null
  for round in 1 2; do
    for shards in 1 2; do
      sh "$HERE/measure.sh" "$B" "$W/$label" "$label-r$round" "$shards"
    done
  done
  sums=$(for o in "$W/$label"/out-*; do sort "$o/effect.jsonl" | md5sum; done | sort -u | wc -l)
  [ "$sums" = 1 ] || { echo "replay_rss: $label: the runs' sorted effect rows differ" >&2; status=1; }
  echo "replay_rss: $label: sorted effect rows alike in every run: $([ "$sums" = 1 ] && echo yes || echo NO)"
  rm -rf "$W/$label"
done
exit $status
