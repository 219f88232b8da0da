#!/usr/bin/env python3
"""Plots and a Markdown summary from bench/results/results.csv.

    bench/plot.py                 # PNGs into bench/results/
    bench/plot.py --markdown      # also print a median table (Markdown)

Per path profile: one PNG with the median goodput of each tool+setting and
min/max error bars over the successful runs (failed runs are counted in the
label, never plotted). Sweeps: hurtle goodput vs --channels and vs
--payload (one line per profile), and heat maps of hurtle --transport tcp
connections x --chunk-size and of globus-url-copy -p x -bs, when such rows
exist. Only ``ok`` rows count; rows flagged ABOVE-EMU-CEILING are never ok.
"""
from __future__ import annotations

import argparse
import csv
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hbench.sysutil import matplotlib_or_reexec  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
SWEEP_KEYS = ("channels=", "payload=", "transport=tcp,channels=", "p=")


def load(path: Path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def groups(rows):
    """{(profile, tool, settings): [goodputs of ok rows], ...} plus failures."""
    ok, failed = defaultdict(list), defaultdict(int)
    for r in rows:
        key = (r["profile"], r["tool"], r["settings"])
        if r.get("ok") == "1" and r.get("goodput_mbps"):
            ok[key].append(float(r["goodput_mbps"]))
        else:
            failed[key] += 1
    return ok, failed


def is_sweep(settings: str) -> bool:
    return ("channels=" in settings and settings != "channels=4") or "payload=" in settings \
        or "chunk=" in settings or ",bs=" in settings


def profile_plots(plt, rows, out: Path):
    ok, failed = groups(rows)
    by_prof = defaultdict(set)
    for (p, t, s) in list(ok) + list(failed):
        if not is_sweep(s):
            by_prof[p].add((t, s))
    made = []
    for prof, keys in sorted(by_prof.items()):
        keys = sorted(keys, key=lambda k: (-statistics.median(ok[(prof,) + k]) if ok.get((prof,) + k) else 0, k))
        labels, med, lo, hi, colors = [], [], [], [], []
        for t, s in keys:
            vals = ok.get((prof, t, s), [])
            nf = failed.get((prof, t, s), 0)
            lab = f"{t}\n{s}" + (f"\n({len(vals)} ok, {nf} failed)" if nf else f"\n(n={len(vals)})")
            labels.append(lab)
            if vals:
                m = statistics.median(vals)
                med.append(m)
                lo.append(m - min(vals))
                hi.append(max(vals) - m)
            else:
                med.append(0)
                lo.append(0)
                hi.append(0)
            colors.append("#d62728" if t == "hurtle" else ("#7f7f7f" if t == "iperf3" else "#1f77b4"))
        fig, ax = plt.subplots(figsize=(max(6, 1.25 * len(keys)), 4.8))
        x = range(len(keys))
        ax.bar(x, med, yerr=[lo, hi], capsize=4, color=colors)
        for i, m in enumerate(med):
            ax.text(i, m, f"{m:.0f}" if m else "failed", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_ylabel("goodput, Mbit/s (median, min-max bars)")
        path = next((r["path"] for r in rows if r["profile"] == prof and r.get("path")), "")
        sizes = sorted({int(r["file_size"]) for r in rows if r["profile"] == prof})
        ax.set_title(f"{prof}: {path}\nfile {', '.join(_h(s) for s in sizes)}; grey = iperf3 memory-to-memory bound",
                     fontsize=9)
        fig.tight_layout()
        p = out / f"profile-{prof}.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        made.append(p)
    return made


def _h(n):
    for u, m in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= m and n % m == 0:
            return f"{n // m} {u}iB"
    return f"{n} B"


def line_sweep(plt, rows, out: Path, key: str, xlabel: str, fname: str):
    ok, _ = groups(rows)
    series = defaultdict(dict)
    for (prof, tool, s), vals in ok.items():
        if tool != "hurtle":
            continue
        m = re.fullmatch(rf"{key}=(\d+)", s)
        if m:
            series[prof][int(m.group(1))] = vals
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for prof, pts in sorted(series.items()):
        xs = sorted(pts)
        med = [statistics.median(pts[x]) for x in xs]
        ax.errorbar(xs, med, yerr=[[m - min(pts[x]) for m, x in zip(med, xs)],
                                   [max(pts[x]) - m for m, x in zip(med, xs)]],
                    marker="o", capsize=3, label=prof)
    if key == "channels":
        ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("goodput, Mbit/s (median, min-max)")
    ax.set_title(f"hurtle: goodput vs {xlabel}")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    p = out / fname
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p


def heatmaps(plt, rows, out: Path, tool: str, pattern: str, xname: str, yname: str, prefix: str):
    ok, _ = groups(rows)
    by_prof = defaultdict(dict)
    for (prof, t, s), vals in ok.items():
        m = re.fullmatch(pattern, s)
        if t == tool and m:
            by_prof[prof][(m.group(1), m.group(2))] = statistics.median(vals)
    made = []
    for prof, cells in sorted(by_prof.items()):
        ys = sorted({int(a) for a, _ in cells})
        xs = sorted({b for _, b in cells}, key=_size_key)
        grid = [[cells.get((str(y), x), float("nan")) for x in xs] for y in ys]
        fig, ax = plt.subplots(figsize=(1.3 * len(xs) + 2.5, 0.55 * len(ys) + 2))
        im = ax.imshow(grid, cmap="viridis", aspect="auto", origin="lower")
        ax.set_xticks(range(len(xs)))
        ax.set_xticklabels(xs)
        ax.set_yticks(range(len(ys)))
        ax.set_yticklabels([str(y) for y in ys])
        ax.set_xlabel(xname)
        ax.set_ylabel(yname)
        for i, row in enumerate(grid):
            for j, v in enumerate(row):
                if v == v:
                    ax.text(j, i, f"{v:.0f}", ha="center", va="center", color="w", fontsize=8)
        fig.colorbar(im, ax=ax, label="median goodput, Mbit/s")
        ax.set_title(f"{tool} on {prof}", fontsize=9)
        fig.tight_layout()
        p = out / f"{prefix}-{prof}.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        made.append(p)
    return made


def _size_key(s: str):
    m = re.fullmatch(r"(\d+)([KMG]?)", s)
    if not m:
        return (1, s)
    return (0, int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2)])


def markdown(rows) -> str:
    """Median table: one row per profile x tool/setting."""
    ok, failed = groups(rows)
    cpu = defaultdict(list)
    for r in rows:
        if r.get("ok") == "1":
            k = (r["profile"], r["tool"], r["settings"])
            try:
                cpu[k].append(float(r["cpu_s_sender"] or 0) + float(r["cpu_s_receiver"] or 0))
            except ValueError:
                pass
    keys = sorted(set(ok) | set(failed), key=lambda k: (k[0], -(statistics.median(ok[k]) if ok.get(k) else -1)))
    out = ["| profile | tool | settings | median Mbit/s | min–max | ok/runs | CPU s (snd+rcv, median) |",
           "|---|---|---|---:|---:|---:|---:|"]
    notes = {}
    for r in rows:
        if r.get("ok") != "1" and r.get("note", "").startswith("unavailable"):
            notes[(r["profile"], r["tool"], r["settings"])] = "unavailable"
    for k in keys:
        vals = ok.get(k, [])
        n = len(vals) + failed.get(k, 0)
        if vals:
            c = f"{statistics.median(cpu[k]):.2f}" if cpu.get(k) else "–"
            out.append(f"| {k[0]} | {k[1]} | {k[2]} | {statistics.median(vals):.0f} | "
                       f"{min(vals):.0f}–{max(vals):.0f} | {len(vals)}/{n} | {c} |")
        else:
            out.append(f"| {k[0]} | {k[1]} | {k[2]} | {notes.get(k, 'failed')} | – | 0/{n} | – |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, default=RESULTS / "results.csv")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--markdown", action="store_true", help="print a Markdown median table")
    a = ap.parse_args()
    if not a.csv.exists():
        sys.exit(f"no {a.csv}; run bench/run.py first")
    rows = load(a.csv)
    matplotlib_or_reexec(__file__)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = profile_plots(plt, rows, a.out)
    for key, xl, fn in (("channels", "--channels (UDP data channels)", "sweep-channels.png"),
                        ("payload", "--payload bytes", "sweep-payload.png")):
        p = line_sweep(plt, rows, a.out, key, xl, fn)
        if p:
            made.append(p)
    made += heatmaps(plt, rows, a.out, "hurtle", r"transport=tcp,channels=(\d+),chunk=(\w+)",
                     "--chunk-size", "TCP connections (--channels)", "heatmap-hurtle-tcp")
    made += heatmaps(plt, rows, a.out, "gridftp", r"p=(\d+),bs=(\d+)", "-bs (bytes)",
                     "parallel streams (-p)", "heatmap-gridftp")
    for p in made:
        print(p)
    if a.markdown:
        print()
        print(markdown(rows))


if __name__ == "__main__":
    main()
