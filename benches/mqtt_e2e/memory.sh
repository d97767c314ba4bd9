#!/bin/bash
# braid run's memory under the fixed MQTT load, sampled (BENCHMARKS.md "State in less memory").
#
#   benches/mqtt_e2e/memory.sh BRAID_BIN OUT_PREFIX SECONDS
#
# Runs `mqtt_e2e --bench --publishers 16 --runs 1 --fixed-seconds SECONDS --braid BRAID_BIN`
# (build it first: `cargo bench --bench mqtt_e2e --no-run`; MQTT_E2E=path overrides the one found
# under target/release/deps) and every 5 s appends a line per running `BRAID_BIN run` to
# OUT_PREFIX.samples: pid, age in seconds, VmHWM, VmRSS, RssAnon, RssFile, RssShmem (KiB), load.
# The bench's log goes to OUT_PREFIX.log. Then prints, per braid process that ran 60 s or more,
# the min / median / max of each figure from 30 s on, in MiB. Run by hand, never by CI.
set -euo pipefail
bin=$1 out=$2 seconds=$3
mqtt=${MQTT_E2E:-$(ls -t target/release/deps/mqtt_e2e-* | grep -v '\.d$' | head -1)}
: >"$out.samples"
"$mqtt" --bench --publishers 16 --runs 1 --fixed-seconds "$seconds" --braid "$bin" >"$out.log" 2>&1 &
bench=$!
ticks=$(getconf CLK_TCK)
while kill -0 "$bench" 2>/dev/null; do
  for pid in $(pgrep -f "^$bin run" || true); do
    started=$(awk '{print $22}' "/proc/$pid/stat" 2>/dev/null) || continue
    age=$(awk -v s="$started" -v t="$ticks" '{printf "%.1f", $1 - s / t}' /proc/uptime)
    figures=$(awk '/^(VmHWM|VmRSS|RssAnon|RssFile|RssShmem):/ {printf "%s=%s ", $1, $2}' "/proc/$pid/status" 2>/dev/null) || continue
    echo "$pid age=$age $figures load=$(cut -d' ' -f1 /proc/loadavg)" >>"$out.samples"
  done
  sleep 5
done
python3 - "$out.samples" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    pid, *fields = line.split()
    if not fields:
        continue
    runs.setdefault(pid, []).append({k.rstrip(':'): float(v) for k, v in (f.split('=') for f in fields)})
for pid, samples in runs.items():
    if max(s['age'] for s in samples) < 60:
        continue  # a saturation phase: too short to settle
    kept = [s for s in samples if s['age'] >= 30]
    def spread(key):
        values = sorted(s[key] / 1024 for s in kept)
        return f"{values[0]:.1f} / {statistics.median(values):.1f} / {values[-1]:.1f}"
    print(f"pid {pid}, {len(kept)} samples from 30 s: RSS {spread('VmRSS')}, anonymous {spread('RssAnon')},"
          f" files {spread('RssFile')}, shared {spread('RssShmem')}, peak {max(s['VmHWM'] for s in kept) / 1024:.1f} MiB,"
          f" load {min(s['load'] for s in kept):.1f}-{max(s['load'] for s in kept):.1f}")
PY
