"""Runs a `braid export flink-sql` script in PyFlink's local mini cluster, timed (benches/peers/run.sh).

Usage: python flink_job.py SCRIPT.sql PARALLELISM

As tests/flink/run_script.py (streaming mode, UTC, the INSERTs as one job), with the parallelism
given and a checkpoint every 5 s (the filesystem sink commits its last files when the bounded
inputs end). Prints `flink net_s=…` (submit → job finished, without JVM start and planning of the
DDL) on stderr.
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


def main(path, parallelism):
    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    config = env.get_config()
    config.set("parallelism.default", parallelism)
    config.set("table.local-time-zone", "UTC")
    config.set("execution.checkpointing.interval", "5 s")
    config.set("restart-strategy.type", "none")
    inserts = env.create_statement_set()
    with open(path) as f:
        for statement in statements(f.read()):
            setting = re.fullmatch(r"SET\s+'([^']*)'\s*=\s*'([^']*)'", statement, re.IGNORECASE)
            if setting:
                config.set(setting.group(1), setting.group(2))
            elif statement.upper().startswith("INSERT"):
                inserts.add_insert_sql(statement)
            else:
                env.execute_sql(statement)
    started = time.monotonic()
    inserts.execute().wait()
    print(f"flink net_s={time.monotonic() - started:.3f}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
