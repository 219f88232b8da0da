#!/usr/bin/env python3
"""Cascades of rate cuts: for each sender `--json` summary given, the longest run of rate cuts
with no rise between them, how far it went (its last rate as a share of the rate before its
first cut), and the lowest rate past startup (from the first change that is not startup's).

    for i in $(seq 20); do hurtle send big --to 127.0.0.1:7555 --code 4242-banjo-cello-drum --json > run$i.json; done
    python3 bench/cuts.py run*.json

The WAN-fill issue asks for "no cascade of cuts" on loopback: issue 2's note had seen 15.8 ->
7.9 -> 6.0 -> 3.0 -> 1.3 Gbit/s in a transfer's last 200 ms, a run of four cuts to 0.08 of
where it began. This reads the `rate.timeline` list (each rate change: milliseconds since the
start, bits per second, reason); a long run keeps a few hundred entries of it (the latest
whole, the older spread evenly), so on runs of many seconds a run of cuts may read shorter
than it was.
"""
import argparse
import json
import statistics
import sys


def longest_cuts(rates):
    """(cuts, share): the longest run of falls with no rise between them in `rates`, and its
    last rate over the rate before its first fall (the deepest, of runs of that length)."""
    best, run, begin = (0, 1.0), 0, None
    for prev, cur in zip(rates, rates[1:]):
        if cur < prev:
            if run == 0:
                begin = prev
            run += 1
            share = cur / begin
            if run > best[0] or (run == best[0] and share < best[1]):
                best = (run, share)
        elif cur > prev:
            run = 0
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="sender --json summaries")
    args = ap.parse_args()
    worst, goodputs = (0, 1.0), []
    for path in args.runs:
        with open(path) as f:
            d = json.load(f)
        timeline = d["rate"]["timeline"]
        rates = [e[1] for e in timeline]
        cuts, share = longest_cuts(rates)
        # The first entry is the start, then startup's steps (reason "startup") until the
        # first change of another reason.
        past = next((i for i, e in enumerate(timeline) if i > 0 and e[2] != "startup"), len(rates))
        lowest = min(rates[past:], default=float("nan"))
        goodputs.append(d["goodput_bps"] / 1e6)
        print(f"{path}: {d['goodput_bps'] / 1e6:.0f} Mbit/s, start {rates[0] / 1e9:.2f} Gbit/s, "
              f"lowest past startup {lowest / 1e9:.2f}, longest run of cuts {cuts} (to {share:.2f}), "
              f"{len(rates)} changes")
        worst = max(worst, (cuts, -share))
    if goodputs:
        print(f"{len(goodputs)} runs: goodput median {statistics.median(goodputs):.0f} Mbit/s "
              f"({min(goodputs):.0f}-{max(goodputs):.0f}); longest run of cuts {worst[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
