#!/usr/bin/env python3
"""Rate-control benchmark: hurtle through a kernel ``tbf`` bottleneck between
two network namespaces (the harness's tbf topology, see hbench/netlab.py).

Scenarios (each ``--repeat`` times, one CSV row per run):

  a  300 Mbit/s bottleneck, short queue, no random loss: ``--rate auto``
     (the default) beside ``--rate-fixed`` at twice the bottleneck;
  b  the same bottleneck with 1% random loss per direction (nft numgen): auto;
  c  a slow receiving host: the receiver runs in a CPU cgroup (v1 ``cpu``
     controller, a few percent of one core), so it can process only a
     fraction of the link; auto, beside ``--rate-fixed`` at the link rate;
  d  hurtle against one competing TCP flow (iperf3, 20 s, started 3 s into
     the transfer): ``--fair`` and ``auto``, with the TCP flow on bbr and on
     cubic. The TCP share is iperf3's receiver-side rate over the
     bottleneck; hurtle's rate in the same window is counted at the
     receiver's namespace (nft counter on UDP). By default this path has a
     40 ms round trip (``--d-rtt``): linkem, the harness's emulator, adds
     the delay and the same kernel tbf (queue ``--d-queue``) is the
     bottleneck. Without delay, TCP's round trip is tens of microseconds
     and any standing queue of a few hundred microseconds caps a bbr flow
     (its window is twice its minimum-RTT bandwidth-delay product), which
     says more about the test than about sharing a real path.

Every namespace, cgroup and process is removed at exit, also on Ctrl-C.
Traffic stays between the two namespaces.

    python3 bench/ratectl.py                      # all scenarios, 1 GiB, x3
    python3 bench/ratectl.py --scenarios a,b --size 256M --repeat 1
"""
from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os

# Every hurtle session is authenticated: both ends of a run get the same code (a build that
# predates codes, as a --hurtle-base binary may, ignores it).
os.environ.setdefault("HURTLE_CODE", "4242-banjo-cello-drum")
# Every run starts cold, as on a path never seen: with the default path memory
# (~/.cache/hurtle/paths) a run would resume from whatever the last transfer to that address
# left, another scenario's or another batch's.
os.environ.setdefault("HURTLE_PATH_MEMORY", "off")
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))

from hbench import netlab  # noqa: E402
from hbench.sysutil import (REG, Interrupted, Proc, cargo_build, descendants, ensure_packages,  # noqa: E402
                            install_signal_handlers, log, sh)

RATE_MBPS = 300
QUEUE = "64k"  # ~1.7 ms at 300 Mbit/s: a short drop-tail queue (scenarios a-c)
CGROUP = Path("/sys/fs/cgroup/cpu") / f"hurtle-ratectl-{os.getpid()}"
FIELDS = ["timestamp", "scenario", "variant", "tcp_cc", "repeat", "file_size", "ok", "wall_s",
          "goodput_mbps", "share_of_link", "resent_share", "socket_drops", "rate_final_mbps",
          "rate_reasons", "tcp_mbps", "hurtle_overlap_mbps", "note"]


def parse_size(s: str) -> int:
    m = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * m[s[-1].upper()]) if s[-1].upper() in m else int(s)


def source(workdir: Path, size: int) -> Path:
    p = workdir / f"src-{size}.bin"
    if not (p.exists() and p.stat().st_size == size):
        with open(p, "wb") as f:
            left = size
            while left:
                n = min(left, 8 << 20)
                f.write(os.urandom(n))
                left -= n
    return p


def same_file(a: Path, b: Path) -> bool:
    if not b.exists() or a.stat().st_size != b.stat().st_size:
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x, y = fa.read(8 << 20), fb.read(8 << 20)
            if x != y:
                return False
            if not x:
                return True


def last_json(text: str):
    for line in reversed(text.strip().splitlines()):
        if line.strip().startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                pass
    try:
        return json.loads(text)
    except ValueError:
        return None


class Throttle:
    """A v1 cpu cgroup limiting its members to ``quota_us`` per ``period_us``."""

    def __init__(self, quota_us: int, period_us: int):
        CGROUP.mkdir(exist_ok=True)
        (CGROUP / "cpu.cfs_period_us").write_text(str(period_us))
        (CGROUP / "cpu.cfs_quota_us").write_text(str(quota_us))
        self.desc = f"receiver CPU quota {quota_us} us per {period_us} us ({100 * quota_us / period_us:.1f}% of a core)"

    def enter(self, proc: Proc):
        """Moves the process tree (all threads) into the cgroup. Done from outside: inside
        ``ip netns exec`` /sys is the namespace's own and shows no cgroups."""
        for pid in [proc.pid] + descendants(proc.pid):
            try:
                (CGROUP / "cgroup.procs").write_text(str(pid))
            except OSError:
                pass  # exited meanwhile


def remove_cgroup():
    if CGROUP.exists():
        try:
            CGROUP.rmdir()
        except OSError as e:
            log(f"cleanup: {CGROUP}: {e}")


class Udpcount:
    """An nft counter of UDP bytes arriving in a namespace."""

    def __init__(self, ns: str):
        self.ns = ns
        rules = ("table inet hrcount {\n chain in {\n  type filter hook input priority 0; policy accept;\n"
                 "  meta l4proto udp counter\n }\n}\n")
        sh(["ip", "netns", "exec", ns, "bash", "-c", f"nft -f - <<'EOF'\n{rules}EOF"])

    def bytes(self) -> int:
        words = sh(["ip", "netns", "exec", self.ns, "nft", "list", "table", "inet", "hrcount"]).split()
        return int(words[words.index("bytes") + 1]) if "bytes" in words else 0


def run_hurtle(lab, ends, src, rundir, port, send_extra, timeout, throttle=None, competitor=None, keep=None):
    """One transfer; returns a result dict. With ``keep``, the sender's ``--log-dir`` logs
    (``send-rate.log`` has every report and rate decision) and both sides' JSON summaries and
    stderr go there."""
    out = rundir / "out"
    out.mkdir(parents=True, exist_ok=True)
    hb = str(REPO / "target" / "release" / "hurtle")
    rargv = [hb, "receive", "--listen", f"{ends.recv_addr}:{port}", "--out", str(out), "--json", "-q"]
    recv = Proc(rargv, "receiver", rundir, ns=ends.recv_ns)
    if throttle:
        time.sleep(0.2)
        throttle.enter(recv)
    res = {"ok": 0, "note": ""}
    if not recv.wait_listening(port, "tcp", timeout=15):
        recv.stop()
        res["note"] = "receiver never listened: " + recv.stderr()[-300:].replace("\n", " ")
        return res
    sargv = [hb, "send", str(src), "--to", f"{ends.recv_addr}:{port}", "--json", "-q"] + send_extra
    if keep:
        keep.mkdir(parents=True, exist_ok=True)
        sargv += ["--log-dir", str(keep)]
    t0 = time.monotonic()
    send = Proc(sargv, "sender", rundir, ns=ends.send_ns)
    comp = None
    if competitor:
        comp = competitor(send)
    rc = send.wait(timeout)
    wall = time.monotonic() - t0
    if rc is None:
        send.stop()
        recv.stop()
        res["note"] = f"timeout after {timeout:.0f}s"
        return res
    rrc = recv.wait(30)
    if rrc is None:
        recv.stop()
    s = last_json(send.stdout())
    r = last_json(recv.stdout())
    if keep:
        (keep / "send.json").write_text(json.dumps(s, indent=1))
        (keep / "recv.json").write_text(json.dumps(r, indent=1))
        (keep / "send.stderr").write_text(send.stderr())
        (keep / "recv.stderr").write_text(recv.stderr())
    ok = rc == 0 and rrc == 0 and s is not None and same_file(src, out / src.name)
    res.update(ok=int(ok), wall_s=round(wall, 3))
    if s:
        sent = s.get("datagrams_sent") or 0
        res.update(
            goodput_mbps=round(s["goodput_bps"] / 1e6, 1),
            resent_share=round((s.get("datagrams_resent") or 0) / sent, 5) if sent else 0,
            rate_final_mbps=round(s["rate"]["final_bps"] / 1e6, 1),
            rate_reasons=json.dumps(s["rate"]["reasons"], separators=(",", ":")),
        )
        res["share_of_link"] = round(res["goodput_mbps"] / RATE_MBPS, 3)
    if r is not None:
        res["socket_drops"] = r.get("socket_drops")
    if comp:
        res.update(comp())
    if not ok:
        res["note"] += f" rc={rc} rrc={rrc} " + send.stderr()[-300:].replace("\n", " ")
    shutil.rmtree(out, ignore_errors=True)
    return res


def iperf_competitor(ends, rundir, counter: Udpcount, cc=None, start_after=3.0, secs=20):
    """Returns a function that starts iperf3 a few seconds into the transfer and
    a collector for its result and hurtle's rate over the same window."""
    server = Proc(["iperf3", "-s", "-1", "-B", ends.recv_addr, "-p", "5299"], "iperf3-server", rundir,
                  ns=ends.recv_ns, timed=False)
    server.wait_listening(5299, "tcp", timeout=10)

    def start(sender):
        state = {}
        time.sleep(start_after)
        state["b0"] = counter.bytes()
        state["t0"] = time.monotonic()
        state["client"] = Proc(["iperf3", "-c", ends.recv_addr, "-p", "5299", "-t", str(secs), "-J"]
                               + (["-C", cc] if cc else []),
                               "iperf3-client", rundir, ns=ends.send_ns, timed=False)

        def at_end():
            # hurtle's bytes over iperf3's window: read the counter the moment iperf3 ends,
            # not when the (longer) transfer does.
            state["rc"] = state["client"].wait(secs + 20)
            state["b1"], state["t1"] = counter.bytes(), time.monotonic()
        state["watch"] = threading.Thread(target=at_end, daemon=True)
        state["watch"].start()

        def collect():
            c = state["client"]
            state["watch"].join(secs + 30)
            rc = state.get("rc")
            b1, t1 = state.get("b1", counter.bytes()), state.get("t1", time.monotonic())
            server.stop()
            out = {}
            try:
                j = json.loads(c.stdout())
                out["tcp_mbps"] = round(j["end"]["sum_received"]["bits_per_second"] / 1e6, 1)
            except (ValueError, KeyError):
                out["note"] = f"iperf3 gave no result (rc={rc})"
            # Window: iperf3's run (from its start to its exit); if the transfer ends first,
            # this undercounts hurtle.
            out["hurtle_overlap_mbps"] = round((b1 - state["b0"]) * 8 / (t1 - state["t0"]) / 1e6, 1)
            return out
        return collect

    return start


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", default="a,b,c,d")
    ap.add_argument("--size", type=parse_size, default=1 << 30)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--d-queue", default="1M",
                    help="bottleneck queue for scenario d (delay-based yielding needs a queue to see; "
                         "the short queue of a-c is 64k)")
    ap.add_argument("--d-rtt", type=float, default=40.0,
                    help="round-trip time (ms) of scenario d's path: linkem adds the delay in front "
                         "of the same tbf bottleneck (0: the plain veth+tbf path of a-c, where TCP's "
                         "RTT is tens of microseconds)")
    ap.add_argument("--variants", help="comma list: run only these variants (e.g. auto,fair)")
    ap.add_argument("--quota", default="1000/30000", help="receiver CPU quota/period in us for scenario c")
    ap.add_argument("--workdir", type=Path, default=Path("/dev/shm/hurtle-ratectl"))
    ap.add_argument("--csv", type=Path, default=BENCH / "results" / "ratectl.csv")
    ap.add_argument("--keep", type=Path,
                    help="keep each run's sender logs (send-rate.log: reports and rate decisions), "
                         "both sides' JSON summaries and stderr under KEEP/NNN-scenario-variant")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root (namespaces, tc, nft, cgroups)")
    install_signal_handlers()
    for pkg in ("hurtle", "linkem"):
        if err := cargo_build(pkg):
            sys.exit(err)
    if "d" in args.scenarios.split(",") and (failed := ensure_packages(["iperf3"])):
        sys.exit(f"scenario d needs iperf3: {failed['iperf3']}")
    args.workdir.mkdir(parents=True, exist_ok=True)
    work = args.workdir / f"run-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    src = source(args.workdir, args.size)
    new = not args.csv.exists()
    csvf = open(args.csv, "a", newline="")
    w = csv.DictWriter(csvf, fieldnames=FIELDS)
    if new:
        w.writeheader()
    port = 48000
    try:
        plans = []  # (scenario, loss, tcp_cc, queue, [(variant, send_extra, throttle?, competitor?)])
        sc = args.scenarios.split(",")
        fixed2x = ["--rate-fixed", f"{2 * RATE_MBPS}M"]
        if "a" in sc:
            plans.append(("a", 0.0, None, QUEUE, [("auto", [], False, False), ("fixed 2x", fixed2x, False, False)]))
        if "b" in sc:
            plans.append(("b", 0.01, None, QUEUE, [("auto", [], False, False)]))
        if "c" in sc:
            plans.append(("c", 0.0, None, QUEUE, [("auto", [], True, False),
                                           ("fixed 1x", ["--rate-fixed", f"{RATE_MBPS}M"], True, False)]))
        if "d" in sc:
            for cc in ("bbr", "cubic"):
                plans.append(("d", 0.0, cc, args.d_queue, [("fair", ["--fair"], False, True), ("auto", [], False, True),
                                             ("none (iperf3 alone)", None, False, True)]))
        k = 0
        for scen, loss, cc, queue, variants in plans:
            lab = netlab.Lab(f"hr{os.getpid()}{scen}{cc or ''}"[:12], work, REPO / "target/release/linkem")
            path_note = ""
            if scen == "d" and args.d_rtt > 0:
                # linkem for the delay only, then the kernel tbf bottleneck.
                prof = netlab.Profile(f"rtt{args.d_rtt:g}", "emu", "delay", rtt_ms=args.d_rtt)
                lab.prepare(prof, None)
                lab.start_linkem(prof, seed=1, logdir=work)
                lab.set_emu_bottleneck(RATE_MBPS, queue)
                path_note = f" rtt={args.d_rtt:g}ms"
            else:
                prof = netlab.Profile(f"tbf{RATE_MBPS}", "tbf", "tbf", rate_mbps=RATE_MBPS, loss=loss, queue=queue)
                # The competing flow's congestion control is set per socket (iperf3 -C): a namespace
                # may not make a congestion control outside tcp_allowed_congestion_control its default.
                lab.prepare(prof, None)
            ends = lab.ends(prof)
            counter = Udpcount(ends.recv_ns) if scen == "d" else None
            throttle = None
            for rep in range(args.repeat):
                for variant, extra, throttled, compete in variants:
                    if args.variants and variant.split(" ")[0] not in args.variants.split(","):
                        continue
                    k += 1
                    port += 1
                    rundir = work / f"{k:03d}"
                    rundir.mkdir(parents=True, exist_ok=True)
                    if throttled and throttle is None:
                        q, p = (int(x) for x in args.quota.split("/"))
                        throttle = Throttle(q, p)
                    row = {"timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                           "scenario": scen, "variant": variant, "tcp_cc": cc or "", "repeat": rep + 1,
                           "file_size": args.size}
                    if extra is None:
                        # The TCP flow alone through the same bottleneck, for reference.
                        start = iperf_competitor(ends, rundir, counter, cc)
                        collect = start(None)
                        row.update(collect(), ok=1)
                    else:
                        comp = iperf_competitor(ends, rundir, counter, cc) if compete else None
                        keep = (args.keep / f"{k:03d}-{scen}-{variant.split(' ')[0]}{'-' + cc if cc else ''}"
                                if args.keep else None)
                        row.update(run_hurtle(lab, ends, src, rundir, port, extra, args.timeout,
                                              throttle if throttled else None, comp, keep))
                    if throttled and throttle:
                        row["note"] = (row.get("note", "") + " " + throttle.desc).strip()
                    row["note"] = (row.get("note", "") + f" queue={queue}{path_note}").strip()
                    w.writerow({f: row.get(f, "") for f in FIELDS})
                    csvf.flush()
                    log(f"[{k}] {scen} {variant} {cc or ''} rep{rep + 1}: " + ", ".join(
                        f"{f}={row[f]}" for f in ("ok", "goodput_mbps", "resent_share", "socket_drops",
                                                    "rate_final_mbps", "tcp_mbps", "hurtle_overlap_mbps",
                                                    "note") if row.get(f) not in (None, "")))
                    shutil.rmtree(rundir, ignore_errors=True)
            lab.stop_linkem()
            for ns in {ends.send_ns, ends.recv_ns, lab.ns("em")}:
                sh(["ip", "netns", "del", ns], check=False)
        summarize(args.csv)
    except Interrupted as e:
        log(f"interrupted: {e}")
    finally:
        REG.cleanup()
        remove_cgroup()
        shutil.rmtree(work, ignore_errors=True)
        csvf.close()


def summarize(path: Path):
    rows = list(csv.DictReader(open(path)))
    groups = {}
    for r in rows:
        groups.setdefault((r["scenario"], r["variant"], r["tcp_cc"]), []).append(r)
    print("| scenario | variant | TCP cc | runs ok | goodput Mbit/s (median) | resent (median) | TCP Mbit/s | hurtle in TCP window |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for (s, v, cc), rs in sorted(groups.items()):
        def med(f):
            xs = [float(r[f]) for r in rs if r.get(f) not in ("", None)]
            return statistics.median(xs) if xs else None
        g, rs_, t, o = med("goodput_mbps"), med("resent_share"), med("tcp_mbps"), med("hurtle_overlap_mbps")
        print(f"| {s} | {v} | {cc} | {sum(int(r['ok'] or 0) for r in rs)}/{len(rs)} | "
              f"{'' if g is None else f'{g:.0f}'} | {'' if rs_ is None else f'{rs_ * 100:.2f}%'} | "
              f"{'' if t is None else f'{t:.0f}'} | {'' if o is None else f'{o:.0f}'} |")


if __name__ == "__main__":
    main()
