#!/usr/bin/env python3
"""Rate over time: one run's pacing rate, delivered rate, queueing delay and loss, as a PNG.

    hurtle send big.iso --to host:7400 --json > run.json
    python3 bench/timeline.py run.json                # writes run.png beside it
    python3 bench/timeline.py run.json --out x.png --title "intercontinental, auto"
    python3 bench/timeline.py run.json other.json --text   # the figures below, no plot

It reads the `rate` object of hurtle's `--json` summary (the sender's): `timeline` (each rate
change with its reason) and `reports` (each receiver report: delivered bits per second,
queueing delay, datagrams lost and counted, the rate after it, the bottleneck's rate by the
receiver's trains), both kept to a few hundred entries on long runs (the latest whole, the
older spread evenly over the run). The top panel shows the
pacing rate as steps, the delivered rate as points, the trains' estimates as crosses, and the
model's bottleneck estimate at the end (`path_bps`) as a line; the middle one
the queueing delay; the bottom one the share of datagrams lost per report beside the random
loss the controller estimated (`random_loss`). A controller change shows here as a different
picture on the same path.

`--text` prints, for each run given, what compares two builds on one path without a plot:
the queueing delay of the reports kept (median, 90th percentile, most), the rate changes by
reason over the whole run (`loss` and `delay` are the congestion cuts), the model's bottleneck
and random loss, and the datagrams resent. (The bottleneck's own overflows are in the bench
CSV's note, `linkem a2b: ... qdrop=N`.)
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hbench.sysutil import last_json, matplotlib_or_reexec  # noqa: E402


def load(path: Path) -> dict:
    """The summary in the file (the last JSON object in it)."""
    summary = last_json(path.read_text())
    if summary is None:
        sys.exit(f"no JSON summary in {path}")
    return summary


def draw(summary: dict, out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rate = summary.get("rate") or {}
    timeline = rate.get("timeline") or []
    reports = rate.get("reports") or []
    if not timeline:
        sys.exit("no rate timeline in this summary (a --json summary of `hurtle send`?)")
    fig, (ax_rate, ax_delay, ax_loss) = plt.subplots(
        3, 1, figsize=(10, 7.5), sharex=True, gridspec_kw={"height_ratios": [3, 1.3, 1.3]})

    t = [p[0] / 1000 for p in timeline]
    r = [p[1] / 1e6 for p in timeline]
    end = max(t[-1], reports[-1][0] / 1000 if reports else 0, summary.get("seconds", 0))
    ax_rate.step(t + [end], r + [r[-1]], where="post", color="tab:blue", label="pacing rate")
    if reports:
        rt = [p[0] / 1000 for p in reports]
        ax_rate.plot(rt, [p[1] / 1e6 for p in reports], ".", ms=3, color="tab:orange",
                     label="delivered (per report)")
        trains = [(x, p[6] / 1e6) for x, p in zip(rt, reports) if len(p) > 6 and p[6]]
        if trains:
            ax_rate.plot([x for x, _ in trains], [y for _, y in trains], "x", ms=3,
                         color="tab:green", label="bottleneck by the receiver's trains")
        ax_delay.plot(rt, [p[2] / 1000 for p in reports], "-", lw=1, color="tab:purple")
        ax_loss.plot(rt, [100 * p[3] / p[4] if p[4] else 0 for p in reports], "-", lw=1,
                     color="tab:red", label="lost per report")
    if rate.get("path_bps"):
        ax_rate.axhline(rate["path_bps"] / 1e6, ls="--", lw=1, color="gray",
                        label=f"model's bottleneck at the end ({rate['path_bps'] / 1e6:.0f} Mbit/s)")
    if rate.get("random_loss") is not None:
        ax_loss.axhline(100 * rate["random_loss"], ls="--", lw=1, color="gray",
                        label=f"random loss estimate ({100 * rate['random_loss']:.2f}%)")
    # Mark the corrections (congestion reasons) on the rate panel.
    for p in timeline:
        if p[2] in ("loss", "delay", "socket-drops", "backlog"):
            ax_rate.axvline(p[0] / 1000, color="tab:red", alpha=0.25, lw=0.8)
    ax_rate.set_ylabel("Mbit/s")
    ax_rate.legend(loc="lower right", fontsize=8)
    ax_delay.set_ylabel("queueing\ndelay, ms")
    ax_loss.set_ylabel("lost, %")
    ax_loss.set_xlabel("seconds since the sender started")
    ax_loss.legend(loc="upper right", fontsize=8)
    gp = summary.get("goodput_bps")
    sub = (f"{summary.get('bytes', 0) / 2**20:.0f} MiB in {summary.get('seconds', 0):.2f} s"
           + (f", {gp / 1e6:.0f} Mbit/s" if gp else "")
           + f", resent {100 * summary.get('resent_share', 0):.2f}%, mode {rate.get('mode', '?')}"
           + "; red lines: corrections")
    fig.suptitle(f"{title}\n{sub}" if title else sub, fontsize=10)
    for ax in (ax_rate, ax_delay, ax_loss):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(out)


def text(summary: dict) -> str:
    """The run's queueing, congestion cuts and resends, one line each."""
    rate = summary.get("rate") or {}
    reports = rate.get("reports") or []
    lines = []
    delays = sorted(p[2] / 1000 for p in reports)
    if delays:
        def at(q):
            return delays[min(len(delays) - 1, int(q * len(delays)))]
        lines.append(f"queueing delay, {len(delays)} reports: median {at(0.5):.1f} ms, "
                     f"p90 {at(0.9):.1f} ms, most {delays[-1]:.1f} ms")
    reasons = rate.get("reasons") or {}
    if reasons:
        lines.append("rate changes: " + ", ".join(f"{k} {v}" for k, v in sorted(reasons.items())))
    path, loss = rate.get("path_bps"), rate.get("random_loss")
    lines.append("model: bottleneck " + (f"{path / 1e6:.1f} Mbit/s" if path else "-")
                 + ", random loss " + (f"{100 * loss:.2f}%" if loss is not None else "-"))
    lines.append(f"resent: {summary.get('datagrams_resent', '-')} datagrams, share "
                 + (f"{100 * summary['resent_share']:.2f}%" if summary.get("resent_share") is not None
                    else "-")
                 + f", NACKs {summary.get('nacks', '-')}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", type=Path, nargs="+", help="hurtle send --json output")
    ap.add_argument("--out", type=Path, help="PNG to write (default: beside the JSON; one run only)")
    ap.add_argument("--title", default="", help="a first title line")
    ap.add_argument("--text", action="store_true",
                    help="print each run's queueing, congestion cuts and resends instead of a plot")
    a = ap.parse_args()
    if a.text:
        for path in a.json:
            print(f"{path}:\n" + text(load(path)))
        return
    if a.out and len(a.json) > 1:
        sys.exit("--out takes one run")
    matplotlib_or_reexec(__file__)
    for path in a.json:
        draw(load(path), a.out or path.with_suffix(".png"), a.title)


if __name__ == "__main__":
    main()
