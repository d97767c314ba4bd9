"""Runs a `braid export flink-sql` script in a local Flink (PyFlink's mini cluster).

Usage: python run_script.py SCRIPT.sql [PARALLELISM [CHECKPOINT_INTERVAL]]

Every statement but INSERT runs as it comes; the INSERTs run together as one job, in streaming
mode with parallelism 1 (or PARALLELISM), local time zone UTC and checkpoints every second (or
CHECKPOINT_INTERVAL, e.g. "5 s"; the filesystem sink commits its files on checkpoints, the last one
when the bounded inputs end). Prints `flink net_s=…` on stderr: job submission → job finished,
without the JVM start and the DDL (benches/peers/run.sh times Flink with it).
"""
import re
import sys
import time

from pyflink.table import EnvironmentSettings, TableEnvironment


def statements(text):
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("--")]
    for part in "\n".join(lines).split(";\n"):
        part = part.strip().rstrip(";").strip()
        if part:
            yield part


def main(path, parallelism="1", checkpoint_interval="1 s"):
    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    config = env.get_config()
    config.set("parallelism.default", parallelism)
    config.set("table.local-time-zone", "UTC")
    config.set("execution.checkpointing.interval", checkpoint_interval)
    config.set("restart-strategy.type", "none")
    inserts = env.create_statement_set()
    count = 0
    with open(path) as f:
        for statement in statements(f.read()):
            setting = re.fullmatch(r"SET\s+'([^']*)'\s*=\s*'([^']*)'", statement, re.IGNORECASE)
            if setting:
                config.set(setting.group(1), setting.group(2))
            elif statement.upper().startswith("INSERT"):
                inserts.add_insert_sql(statement)
                count += 1
            else:
                env.execute_sql(statement)
    if count:
        started = time.monotonic()
        inserts.execute().wait()
        print(f"flink net_s={time.monotonic() - started:.3f}", file=sys.stderr)


if __name__ == "__main__":
    main(*sys.argv[1:4])
