"""Compares braid's and Flink's rows of one output by content.

Usage: python compare.py BRAID.jsonl FLINK_DIR

braid's own columns (_id, _version, _supersedes) are left out; Flink's window bounds (TIMESTAMP(3)
in UTC) become ms as braid writes them, and a window result's _ts is end - 1 ms. Prints the rows
found on one side only; exit 0 when there are none.
"""
import collections
import datetime
import json
import os
import sys

BRAID_ONLY = {"_id", "_version", "_supersedes"}


def ms(text):
    when = datetime.datetime.strptime(text, "%Y-%m-%d %H:%M:%S.%f" if "." in text else "%Y-%m-%d %H:%M:%S")
    return int(when.replace(tzinfo=datetime.timezone.utc).timestamp() * 1000)


def normal(row):
    row = {k: v for k, v in row.items() if k not in BRAID_ONLY}
    for k in ("_window_start", "_window_end"):
        if isinstance(row.get(k), str):
            row[k] = ms(row[k])
    if "_window_end" in row and "_ts" not in row:
        row["_ts"] = row["_window_end"] - 1
    return json.dumps(row, sort_keys=True)


def rows_of_dir(path):
    rows = []
    for root, _, files in os.walk(path):
        for name in sorted(files):
            if name.startswith("."):
                continue
            with open(os.path.join(root, name)) as f:
                rows.extend(json.loads(line) for line in f if line.strip())
    return rows


def main(braid_path, flink_dir):
    with open(braid_path) as f:
        braid = collections.Counter(normal(json.loads(line)) for line in f if line.strip())
    flink = collections.Counter(normal(row) for row in rows_of_dir(flink_dir))
    only_braid, only_flink = braid - flink, flink - braid
    for row, n in sorted(only_braid.items()):
        print(f"  braid only (x{n}): {row}")
    for row, n in sorted(only_flink.items()):
        print(f"  flink only (x{n}): {row}")
    same = sum((braid & flink).values())
    print(f"  {same} rows alike, {sum(only_braid.values())} braid only, {sum(only_flink.values())} flink only")
    return 0 if not only_braid and not only_flink else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
