#!/bin/sh
# Peak RSS and wall time of one `braid replay` of the gateway join (BENCHMARKS.md "Replay in
# constant memory"). Run by hand, not by CI:
#   mkdir -p /dev/shm/rss-1m && python3 benches/replay_rss/gen.py 3000 /dev/shm/rss-1m   # ~1 M lines
#   sh benches/replay_rss/measure.sh target/release/braid /dev/shm/rss-1m 1m
# BINARY DATA_DIR LABEL; outputs go to DATA_DIR/out-LABEL.
set -u
B=$1; D=$2; L=$3; O=$D/out-$L
HERE=$(dirname "$0")
mkdir -p "$O"
/usr/bin/time -v "$B" replay --config "$HERE/gateway.toml" --shards 2 \
  --input command="$D/command.jsonl" --input status="$D/status.jsonl" \
  --output effect="$O/effect.jsonl" --output effect.late="$O/late.jsonl" --output dead_letter="$O/dead.jsonl" \
  2> "$O/time.txt" > "$O/stdout.txt"
echo "$L rc=$? $(grep -E 'Maximum resident|Elapsed' "$O/time.txt" | tr -s ' ' | tr '\n' ' ') effect=$(wc -l < "$O/effect.jsonl") late=$(wc -l < "$O/late.jsonl") dead=$(wc -l < "$O/dead.jsonl")"
