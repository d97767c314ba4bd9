#!/usr/bin/env bash
# Export conformance against Apache Flink itself (README.md "SQL", "Export to Flink"): for each
# example whose operators Flink SQL expresses, `braid export flink-sql` with the sample inputs,
# run the script in a local Flink (PyFlink, Java 17), `braid replay` the same inputs, and compare
# the rows by content (tests/flink/compare.py). Prints the rows found on one side only; the
# differences README.md documents (late rows, sessions, idleness) are expected to show here.
#
#   tests/flink/run.sh [EXAMPLE...]        default: gateway union window_join cogroup window_aggregate
#                                          temporal_join site_limits
#
# Needs python3 and java 17; creates a venv with apache-flink (pip, ~700 MB) in
# $FLINK_VENV (default: ${CARGO_TARGET_DIR:-target}/flink-venv) on first use.
set -euo pipefail
cd "$(dirname "$0")/../.."
target=${CARGO_TARGET_DIR:-target}
venv=${FLINK_VENV:-$target/flink-venv}
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import pyflink' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q 'apache-flink==1.20.*'
fi
cargo build -q --locked
braid=$target/debug/braid
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
examples=("$@")
[ ${#examples[@]} -gt 0 ] || examples=(gateway union window_join cogroup window_aggregate temporal_join site_limits)
status=0
for example in "${examples[@]}"; do
  config=configs/$example.toml
  inputs=()
  for sample in configs/samples/$example/*.jsonl; do
    inputs+=(--input "$(basename "$sample" .jsonl)=$PWD/$sample")
  done
  operators=$(grep -o '^\[operators\.[A-Za-z0-9_]*\]' "$config" | sed 's/^\[operators\.//; s/\]$//')
  outputs=()
  replay_outputs=()
  for op in $operators; do
    outputs+=(--output "$op=$work/$example/flink/$op")
    replay_outputs+=(--output "$op=$work/$example/braid-$op.jsonl")
  done
  mkdir -p "$work/$example"
  sed '/^state_dir/d' "$config" > "$work/$example/config.toml"
  "$braid" export flink-sql --config "$work/$example/config.toml" "${inputs[@]}" "${outputs[@]}" > "$work/$example/script.sql"
  "$braid" replay --config "$work/$example/config.toml" "${inputs[@]}" "${replay_outputs[@]}" 2>/dev/null
  echo "== $example"
  if ! "$venv/bin/python" tests/flink/run_script.py "$work/$example/script.sql" > "$work/$example/flink.log" 2>&1; then
    echo "  Flink failed:"; grep -E 'Exception|Error' "$work/$example/flink.log" | head -5 | sed 's/^/  /'
    status=1
    continue
  fi
  for op in $operators; do
    echo " $op:"
    "$venv/bin/python" tests/flink/compare.py "$work/$example/braid-$op.jsonl" "$work/$example/flink/$op" || status=1
  done
done
exit $status
