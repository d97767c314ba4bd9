"""Summary of benches/peers/run.sh: python summary.py RESULTS.tsv EVENTS

RESULTS.tsv: name, run, wall s, net s (or -), peak RSS KiB, results (-1: failed), load, version.
Prints a markdown table (medians over the runs) and braid's ratio to the best peer; exits 1 if
a run failed or the result counts differ.
"""
import statistics
import sys


def main(path, events):
    rows = [line.rstrip("\n").split("\t") for line in open(path) if line.strip()]
    tools = {}
    for name, run, wall, net, rss, results, load, version in rows:
        tools.setdefault(name, []).append(
            {"wall": float(wall or "nan"), "net": float(net) if net != "-" else None, "rss": int(rss or 0),
             "results": int(results), "load": load, "version": version})
    ok = True
    counts = {r["results"] for runs in tools.values() for r in runs}
    if len(counts) != 1 or -1 in counts:
        ok = False
        print(f"\npeers: RESULT COUNTS DIFFER OR A RUN FAILED: {sorted(counts)}")
    print(f"\n{events} input lines; results: {', '.join(str(c) for c in sorted(counts))}\n")
    print("| tool | version | runs | wall s (median) | events/s, whole process | net s | events/s, net | peak RSS | loads |")
    print("|---|---|---|---|---|---|---|---|---|")
    rate = {}
    for name, runs in tools.items():
        good = [r for r in runs if r["results"] >= 0]
        if not good:
            continue
        wall = statistics.median(r["wall"] for r in good)
        nets = [r["net"] for r in good if r["net"] is not None]
        net = statistics.median(nets) if nets else wall
        # /usr/bin/time sees the processes it waits for: PyFlink's JVM is not one of them.
        rss = "—" if name.startswith("flink") else f"{max(r['rss'] for r in good) / 1024:.0f} MiB"
        rate[name] = (events / wall, events / net)
        print(f"| {name} | {good[0]['version']} | {len(good)} | {wall:.2f} | {events / wall / 1e6:.3f} M | "
              f"{net:.2f} | {events / net / 1e6:.3f} M | {rss} | {' '.join(r['load'] for r in runs)} |")
    peers = {n: r for n, r in rate.items() if not n.startswith("braid")}
    for braid in sorted(n for n in rate if n.startswith("braid")):
        if not peers:
            print(f"\n{braid}: no peer ran, no ratio")
            continue
        best_whole = max(peers, key=lambda n: peers[n][0])
        best_net = max(peers, key=lambda n: peers[n][1])
        print(f"\n{braid}: {rate[braid][0] / 1e6:.3f} M events/s = "
              f"**{rate[braid][0] / peers[best_whole][0]:.1f}×** the best peer whole-process ({best_whole}), "
              f"**{rate[braid][0] / peers[best_net][1]:.1f}×** the best peer net ({best_net})", end="")
    print()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
