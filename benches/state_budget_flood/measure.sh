#!/bin/sh
# The state budget under a flood of new keys (issue 12 item 2; BENCHMARKS.md "State budget").
#
# `braid run` through mosquitto: N command messages, each of a new device id, into the gateway's
# left interval join whose status input never sends and never turns idle (idle_timeout = "0ms"),
# so nothing but the budget bounds the state. Samples every 0.5 s: the shard's state bytes as the
# budget counts them (/metrics braid_shard_state_bytes), braid's RSS (/proc/PID/status VmRSS, the
# arenas' tmpfs pages it touched included), the rows in state, and the rows sent to
# effect.expired. Prints one line per sample: seconds, state bytes, RSS KiB, state rows, expired.
#
# usage: benches/state_budget_flood/measure.sh BRAID MODE [N] [BUDGET]
#   MODE: evict_oldest | backpressure | none (no budget: the control)
set -eu
BRAID=$1
MODE=$2
N=${3:-100000}
BUDGET=${4:-16MiB}
DIR=$(mktemp -d /tmp/braid-flood-XXXXXX)
port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
MQTT=$(port)
OPS=$(port)
printf 'listener %s 127.0.0.1\nallow_anonymous true\nmax_queued_messages 0\nmax_inflight_messages 100\n' "$MQTT" > "$DIR/mosquitto.conf"
mosquitto -c "$DIR/mosquitto.conf" > "$DIR/mosquitto.log" 2>&1 &
MOSQ=$!
BUDGET_KEYS=""
if [ "$MODE" != none ]; then
    BUDGET_KEYS="state_budget = \"$BUDGET\"
on_state_full = \"$MODE\""
fi
cat > "$DIR/flood.toml" <<TOML
[runtime]
shards = 1
state_dir = "$DIR/state"
scratch_dir = "$DIR/scratch"
$BUDGET_KEYS

[ops]
listen = "127.0.0.1:$OPS"

[sources.devices]
kind = "mqtt"
url = "mqtt://127.0.0.1:$MQTT"

[streams.command]
key = "device"
time = { field = "ts" }
idle_timeout = "0ms"
fields = { device = "string", ts = "int", cmd_id = "string" }
source = "devices"
topic = "flood/command"

[streams.status]
key = "device"
time = { field = "ts" }
idle_timeout = "0ms"
fields = { device = "string", ts = "int", state = "string" }
source = "devices"
topic = "flood/status"

[operators.effect]
kind = "interval_join"
left = "command"
right = "status"
lower = "-3s"
upper = "5s"
join = "left"
select = ["left.cmd_id", "right.state"]

[sinks.archive]
kind = "file"
path = "$DIR/out.jsonl"
inputs = ["effect", "effect.expired"]
TOML
mkdir -p "$DIR/scratch"
"$BRAID" run --config "$DIR/flood.toml" > "$DIR/braid.log" 2>&1 &
PID=$!
trap 'kill $PID $MOSQ 2>/dev/null; wait 2>/dev/null; rm -rf "$DIR"' EXIT
until curl -sf "http://127.0.0.1:$OPS/metrics" > /dev/null 2>&1; do sleep 0.2; done
# 10 000 messages a second, each of a new device, ts = now.
python3 -c "
import sys, time
n = int(sys.argv[1]); start = time.time()
for i in range(n):
    while time.time() < start + i / 10000: time.sleep(0.001)
    sys.stdout.write('{\"device\":\"dev-%07d\",\"ts\":%d,\"cmd_id\":\"c%d-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"}\n' % (i, time.time() * 1000, i))
sys.stdout.flush()
" "$N" | mosquitto_pub -p "$MQTT" -t flood/command -q 1 -l &
PUB=$!
T0=$(date +%s.%N)
metric() { curl -s "http://127.0.0.1:$OPS/metrics" | awk -v m="$1" '$1 ~ "^"m"({|$)" { s += $2 } END { printf "%d", s }'; }
while :; do
    NOW=$(date +%s.%N)
    RSS=$(awk '/^VmRSS/ { print $2 }' /proc/$PID/status)
    printf '%.1f %s %s %s %s\n' "$(echo "$NOW - $T0" | bc)" "$(metric braid_shard_state_bytes)" "$RSS" \
        "$(metric braid_operator_state_rows)" "$(metric braid_operator_expired_total)"
    # Until every message was taken (or 3 minutes), then 5 s more.
    if [ "$(metric braid_ingest_taken_total)" -ge "$N" ] || [ "$(echo "$NOW - $T0 > 180" | bc)" = 1 ]; then
        DONE=${DONE:-0}; DONE=$((DONE + 1))
        [ $DONE -ge 10 ] && break
    fi
    sleep 0.5
done
echo "# taken: $(metric braid_ingest_taken_total) of $N; state_full: $(metric braid_state_budget_full)"
