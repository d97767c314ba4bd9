#!/bin/sh
# Peak RSS and wall time of one `braid replay` of the gateway join (BENCHMARKS.md "Replay in
# constant memory"). Run by hand, not by CI (benches/replay_rss/run.sh runs the whole series):
#   mkdir -p /dev/shm/rss-1m && python3 benches/replay_rss/gen.py 3000 /dev/shm/rss-1m   # ~1 M lines
#   sh benches/replay_rss/measure.sh target/release/braid /dev/shm/rss-1m 1m [SHARDS]
# BINARY DATA_DIR LABEL [SHARDS, default 2]; outputs go to DATA_DIR/out-LABEL-SHARDS.
set -u
B=$1; D=$2; L=$3; S=${4:-2}; O=$D/out-$L-$S
HERE=$(dirname "$0")
mkdir -p "$O"
/usr/bin/time -v "$B" replay --config "$HERE/gateway.toml" --shards "$S" \
  --input command="$D/command.jsonl" --input status="$D/status.jsonl" \
  --output effect="$O/effect.jsonl" --output effect.late="$O/late.jsonl" --output dead_letter="$O/dead.jsonl" \
  2> "$O/time.txt" > "$O/stdout.txt"
rc=$?
lines=$(cat "$D/command.jsonl" "$D/status.jsonl" | wc -l)
wall=$(sed -n 's/.*Elapsed (wall clock) time (h:mm:ss or m:ss): //p' "$O/time.txt" | awk -F: '{ s = 0; for (i = 1; i <= NF; i++) s = s * 60 + $i; print s }')
echo "$L shards=$S rc=$rc lines=$lines $(grep -E 'Maximum resident|Elapsed' "$O/time.txt" | tr -s ' ' | tr '\n' ' ') events/s=$(awk -v n="$lines" -v w="$wall" 'BEGIN { printf "%.0f", n / w }') effect=$(wc -l < "$O/effect.jsonl") late=$(wc -l < "$O/late.jsonl") dead=$(wc -l < "$O/dead.jsonl") load=$(cut -d' ' -f1 /proc/loadavg)"
