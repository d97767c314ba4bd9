#!/usr/bin/env bash
# Fills a golden case's out/*.jsonl from the Python model of `braid replay`
# (shared/model/braid_model.py, not part of this repository), with the same --input / --output
# flags the runner (tests/golden.rs) gives braid: the `args` file if the case has one, else
# in/*.jsonl and out/*.jsonl in file-name order. Create out/NAME.jsonl (empty) for every
# output you want first.
#
#   tests/golden/regen_with_model.sh tests/golden/<case> [...]
#
# The model's output is a proposal, not the truth: check every row by hand against
# CONTRACT.md and write the reasoning into the case's README.md. Where the model and
# CONTRACT.md disagree, CONTRACT.md wins: fix the expected file by hand and say so there.
set -euo pipefail
model=${BRAID_MODEL:-/work/shared/model/braid_model.py}
for case in "$@"; do
    case=${case%/}
    if [[ -f $case/expect_exit ]]; then
        echo "$case: has expect_exit, nothing to generate" >&2
        continue
    fi
    args=()
    if [[ -f $case/args ]]; then
        while read -r flag value; do
            [[ -z $flag || $flag == \#* ]] && continue
            args+=("$flag" "${value%%=*}=$case/${value#*=}")
        done <"$case/args"
    else
        for f in "$case"/in/*.jsonl; do
            [[ -e $f ]] || continue
            n=$(basename "$f" .jsonl)
            args+=(--input "$n=$f")
        done
        for f in "$case"/out/*.jsonl; do
            [[ -e $f ]] || continue
            n=$(basename "$f" .jsonl)
            args+=(--output "$n=$f")
        done
    fi
    python3 "$model" replay --config "$case/config.toml" "${args[@]}"
    echo "$case: regenerated" >&2
done
