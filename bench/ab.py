#!/usr/bin/env python3
"""Side by side on loopback: hurtle binaries (or settings) in interleaved rounds, memory warmed
before every run, medians at the end.

The harness (``run.py``) compares hurtle with other tools; this compares hurtle with itself, as
every change to the data path needs: a change is worth a few percent, and on a shared VM a
set of 3-5 runs of one binary after the other moves by more than that. So each round runs
every variant once, in an order that rotates from round to round, with the same warm-up
before each run (see ``run.warm_memory``), and the summary gives medians and min-max per
variant and each median's ratio to the first variant's.

    python3 bench/ab.py --rounds 10 base=/tmp/hurtle-before new=target/release/hurtle
    python3 bench/ab.py --rounds 8 --send-args "--channels 8" a=target/release/hurtle \\
        'fixed=target/release/hurtle::--rate-fixed 10G'

A variant is NAME=BINARY, optionally followed by ``::`` and extra ``send`` arguments, and a
second ``::`` and extra ``receive`` arguments. One run: a receiver on 127.0.0.1 writing into a
fresh directory under ``--workdir`` (tmpfs by default), the sender with ``--json``; the wall
time counts from the sender's start to the receiver's exit (both must exit 0: the receiver
has verified every byte). Per run it prints goodput, the sender's resent datagrams, both
processes' CPU seconds, and the CPU the hypervisor stole meanwhile.

``--pin`` runs the sender on the first CPU and the receiver on the last, as two hosts of one
core each would: without it both ends share every core, so more channels (more threads on
each side) also means more threads competing for the same two cores.
"""
from __future__ import annotations

import argparse
import json
import os

# Every hurtle session is authenticated: both ends of a run get the same code (a build that
# predates codes, as a --hurtle-base binary may, ignores it).
os.environ.setdefault("HURTLE_CODE", "4242-banjo-cello-drum")
# Every run starts cold, as on a path never seen: no memory of the last run's path (and none
# left in the user's cache).
os.environ.setdefault("HURTLE_PATH_MEMORY", "off")
import select
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import cpu_jiffies, parse_size, source_file, warm_memory  # noqa: E402

RUN_TIMEOUT = 120.0


class Variant:
    def __init__(self, spec: str):
        name, _, rest = spec.partition("=")
        parts = rest.split("::")
        if not name or not parts[0]:
            raise argparse.ArgumentTypeError(f"expected NAME=BINARY[::SEND ARGS[::RECEIVE ARGS]], got {spec!r}")
        self.name = name
        self.binary = str(Path(parts[0]).resolve())
        self.send = shlex.split(parts[1]) if len(parts) > 1 else []
        self.receive = shlex.split(parts[2]) if len(parts) > 2 else []
        if not os.access(self.binary, os.X_OK):
            raise argparse.ArgumentTypeError(f"{self.binary} is not an executable")


def pinned(cpus: set[int] | None):
    """A ``preexec_fn`` that confines the child to ``cpus`` (``None``: no confinement)."""
    if cpus is None:
        return None
    return lambda: os.sched_setaffinity(0, cpus)


def start_receiver(v: Variant, out: Path, cpus: set[int] | None) -> tuple[subprocess.Popen, str]:
    """A receiver on a free loopback port; returns it with the address it printed."""
    p = subprocess.Popen([v.binary, "receive", "--listen", "127.0.0.1:0", "--out", str(out), "--json"]
                         + v.receive, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         preexec_fn=pinned(cpus))
    said = b""
    deadline = time.monotonic() + 10
    while b"\n" not in said and time.monotonic() < deadline:
        ready, _, _ = select.select([p.stderr], [], [], 0.1)
        if ready:
            chunk = os.read(p.stderr.fileno(), 4096)
            if not chunk:
                break
            said += chunk
    line = said.decode(errors="replace")
    if "listening on" not in line:
        p.kill()
        p.wait()
        raise RuntimeError(f"{v.name}: the receiver did not say where it listens: {line.strip()!r}")
    return p, line.split("listening on", 1)[1].split(",", 1)[0].strip()


def one_run(v: Variant, src: Path, work: Path, send_args: list[str],
            pins: tuple[set[int] | None, set[int] | None]) -> dict:
    """One transfer; ``pins`` holds the sender's and the receiver's CPUs (``None``: any)."""
    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)
    recv, addr = start_receiver(v, out, pins[1])
    steal0 = cpu_jiffies()[2]
    t0 = time.monotonic()
    send = subprocess.Popen([v.binary, "send", str(src), "--to", addr, "-q", "--json"] + send_args + v.send,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=pinned(pins[0]))
    try:
        # A child's CPU time is counted once it is reaped: reaping the sender, then the
        # receiver, tells the two apart.
        cpu0 = children_cpu()
        s_out, s_err = send.communicate(timeout=RUN_TIMEOUT)
        cpu1 = children_cpu()
        recv.communicate(timeout=RUN_TIMEOUT)
        cpu2 = children_cpu()
    except subprocess.TimeoutExpired:
        send.kill()
        recv.kill()
        send.wait()
        recv.wait()
        raise RuntimeError(f"{v.name}: a run took over {RUN_TIMEOUT:.0f} s")
    wall = time.monotonic() - t0
    steal_ms = (cpu_jiffies()[2] - steal0) * 1000 // (os.sysconf("SC_CLK_TCK") or 100)
    shutil.rmtree(out, ignore_errors=True)
    if send.returncode != 0 or recv.returncode != 0:
        raise RuntimeError(f"{v.name}: sender exit {send.returncode}, receiver exit {recv.returncode}: "
                           f"{s_err.strip()}")
    summary = json.loads(s_out.strip().splitlines()[-1])
    return {"mbps": src.stat().st_size * 8 / wall / 1e6, "wall": wall, "steal_ms": steal_ms,
            "resent": summary.get("datagrams_resent", 0), "cpu_send": cpu1 - cpu0,
            "cpu_recv": cpu2 - cpu1}


def children_cpu() -> float:
    r = os.times()
    return r.children_user + r.children_system


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("variants", nargs="+", type=Variant, metavar="NAME=BINARY[::SEND ARGS[::RECEIVE ARGS]]")
    ap.add_argument("--rounds", type=int, default=8, help="rounds; each runs every variant once (default 8)")
    ap.add_argument("--size", type=parse_size, default=1 << 30, help="file size (default 1G)")
    ap.add_argument("--send-args", default="", help="extra send arguments for every variant")
    ap.add_argument("--warm", type=parse_size, help="memory written and freed before each run "
                    "(default twice the file, at most 4G; 0 = off)")
    ap.add_argument("--workdir", type=Path, default=Path("/dev/shm/hurtle-ab"),
                    help="source file and received files (default /dev/shm/hurtle-ab)")
    ap.add_argument("--pin", action="store_true",
                    help="sender on the first CPU, receiver on the last (two one-core hosts)")
    args = ap.parse_args()
    if not 1 <= args.rounds <= 100:
        sys.exit("--rounds must be 1 to 100")
    warm = args.warm if args.warm is not None else min(2 * args.size, 4 << 30)
    src = source_file(args.size, args.workdir)
    send_args = shlex.split(args.send_args)
    pins: tuple[set[int] | None, set[int] | None] = (None, None)
    if args.pin:
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < 2:
            sys.exit("--pin needs at least two CPUs")
        pins = ({cpus[0]}, {cpus[-1]})
    results: dict[str, list[dict]] = {v.name: [] for v in args.variants}
    try:
        for r in range(args.rounds):
            k = r % len(args.variants)
            for v in args.variants[k:] + args.variants[:k]:
                warm_memory(warm)
                cpu0 = children_cpu()
                res = one_run(v, src, args.workdir, send_args, pins)
                res["cpu"] = children_cpu() - cpu0
                results[v.name].append(res)
                print(f"round {r + 1} {v.name}: {res['mbps']:.0f} Mbit/s in {res['wall']:.3f} s, "
                      f"resent {res['resent']}, CPU {res['cpu']:.2f} s (sender {res['cpu_send']:.2f}, "
                      f"receiver {res['cpu_recv']:.2f}), steal {res['steal_ms']} ms", flush=True)
    finally:
        shutil.rmtree(args.workdir / "out", ignore_errors=True)
    first = None
    gib = (1 << 30) / args.size
    print(f"\n{len(args.variants)} variants, {args.rounds} rounds, {args.size} bytes, warmed {warm} bytes"
          + (f", sender on CPU {min(pins[0])}, receiver on CPU {min(pins[1])}" if args.pin else ""))
    for v in args.variants:
        runs = results[v.name]
        med = statistics.median(x["mbps"] for x in runs)
        first = first or med
        print(f"{v.name:>12}: median {med:.0f} Mbit/s ({min(x['mbps'] for x in runs):.0f}-"
              f"{max(x['mbps'] for x in runs):.0f}), x{med / first:.3f}; CPU median "
              f"{statistics.median(x['cpu'] for x in runs):.2f} s (per GiB: sender "
              f"{statistics.median(x['cpu_send'] for x in runs) * gib:.2f}, receiver "
              f"{statistics.median(x['cpu_recv'] for x in runs) * gib:.2f}); resent in "
              f"{sum(1 for x in runs if x['resent'])} of {len(runs)} runs")


if __name__ == "__main__":
    main()
