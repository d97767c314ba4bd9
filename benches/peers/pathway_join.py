"""The gateway interval join in Pathway (benches/peers/run.sh).

Usage: python pathway_join.py DATA_DIR OUT_FILE

command ⋈ status on device, status.ts in [command.ts - 3 s, command.ts + 5 s], inner, the columns
of benches/replay_rss/gateway.toml's select; both files read once (static mode). Threads: run it
under `pathway spawn --threads N`. Prints `pathway net_s=…` (the time of pw.run alone, after
imports and graph building) on stderr.
"""
import sys
import time

import pathway as pw


class Status(pw.Schema):
    device: str
    ts: int
    temp: float
    state: str
    seq: int


class Command(pw.Schema):
    device: str
    ts: int
    cmd: str
    arg: str
    cmd_id: str


def main(data, out):
    status = pw.io.jsonlines.read(f"{data}/status.jsonl", schema=Status, mode="static")
    command = pw.io.jsonlines.read(f"{data}/command.jsonl", schema=Command, mode="static")
    joined = pw.temporal.interval_join(
        command,
        status,
        command.ts,
        status.ts,
        pw.temporal.interval(-3000, 5000),
        command.device == status.device,
    ).select(cmd_id=command.cmd_id, device=command.device, seq=status.seq, status_ts=status.ts)
    pw.io.jsonlines.write(joined, out)
    started = time.monotonic()
    pw.run(monitoring_level=pw.MonitoringLevel.NONE)
    print(f"pathway net_s={time.monotonic() - started:.3f}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
