# Gateway workload (benches/common/gateway.rs shape): DEVICES devices (default 1000), a status every
# STATUS_MS (default 4 s) + 0-0.5 s jitter, a command every 8-16 s (the gap scales with
# COMMAND_MS, its mean, default 12 s); every 50th device is dark (commands only);
# command.jsonl and status.jsonl in event-time order, generated slice by slice.
#   python3 gen.py SECONDS DIR [DEVICES [STATUS_MS [COMMAND_MS]]]
# The defaults are the workload of BENCHMARKS.md "Replay in constant memory"; benches/peers/run.sh
# uses 1000 devices, a status a second and a command every 10 s (about 1.1 events per device-second).
import random, sys
seconds, out = int(sys.argv[1]), sys.argv[2]
DEV = int(sys.argv[3]) if len(sys.argv) > 3 else 1000
SLICE = int(sys.argv[4]) if len(sys.argv) > 4 else 4000
GAP = int(sys.argv[5]) if len(sys.argv) > 5 else 12000
rnd = random.Random(7)
EPOCH = 1_700_000_000_000
states = ["ok", "busy", "idle", "rebooting"]; cmds = ["reboot", "set_mode", "ping", "update_fw"]
st, cm = open(f"{out}/status.jsonl", "w"), open(f"{out}/command.jsonl", "w")
carry_s, carry_c, seq = [], [], [0] * DEV
next_cmd = [EPOCH + rnd.randrange(GAP) for _ in range(DEV)]
n = 0
for k in range(seconds * 1000 // SLICE):
    lo, hi = EPOCH + k * SLICE, EPOCH + (k + 1) * SLICE
    s, c = carry_s, carry_c
    for d in range(DEV):
        if d % 50 != 7:  # a few dark devices send commands only
            ts = lo + (d * 4) % SLICE + rnd.randrange(min(500, SLICE // 2))
            seq[d] += 1
            s.append((ts, f'{{"device":"dev-{d:05}","ts":{ts},"temp":{rnd.uniform(10, 90):.2f},"state":"{rnd.choice(states)}","seq":{seq[d]}}}\n'))
        while next_cmd[d] < hi:
            ts = next_cmd[d]
            c.append((ts, f'{{"device":"dev-{d:05}","ts":{ts},"cmd":"{rnd.choice(cmds)}","arg":"v={rnd.randrange(100)}","cmd_id":"c-{rnd.getrandbits(64):016x}"}}\n'))
            next_cmd[d] += GAP * 2 // 3 + rnd.randrange(GAP * 2 // 3)
    s.sort(); c.sort()
    carry_s = [x for x in s if x[0] >= hi]; carry_c = [x for x in c if x[0] >= hi]
    for f, lines in ((st, s), (cm, c)):
        w = [l for t, l in lines if t < hi]; n += len(w); f.write("".join(w))
for f, lines in ((st, carry_s), (cm, carry_c)):
    n += len(lines); f.write("".join(l for _, l in lines))
print(n, "lines")
