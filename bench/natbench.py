#!/usr/bin/env python3
"""Reach on a long lossy path: two peers behind NATs of each kind, paired by code through a
relay, against a direct session with no NAT on the same emulated path.

Topology (names ``hn<pid>-*``; everything is removed at exit)::

    [ha] 10.204.1.2 -- [na] NAT-A -- [a] relay 10.203.1.1 ==linkem (em)== [b] -- [nb] NAT-B -- [hb] 10.204.2.2
      receiver          10.203.1.2    router, relay           router         10.203.2.2     sender

``a``, ``em`` and ``b`` are bench/hbench/netlab.py's emulated path; ``a`` and ``b`` route for
the NATs' outside networks, and the relay listens on ``a``. Every path between the peers,
relayed or direct, crosses linkem once: the relay sits at the receiver's end of the long path,
so a relayed session and a direct one see the same round trip and the same loss.

NAT kinds (nftables in the NAT's namespace; the same rules as crates/cli/tests/relay.rs):

* ``cone``: masquerade (keeps a socket's port), inbound only for flows the inside started
  (port-restricted filtering), unsolicited datagrams to the NAT itself dropped.
* ``fullcone``: the same mapping, and any inbound UDP on the outside address goes to the inside
  host at the same port (endpoint-independent filtering).
* ``sym``: masquerade with random ports (a new public port per destination), inbound only for
  flows the inside started.
* ``noudp``: like ``cone`` for TCP, and every UDP datagram from the inside dropped.

Per run: goodput and what ``--json`` says of the path (path, transport, when the channels went
direct, bytes by path when the build reports them), CPU-seconds per GiB of sender, receiver and
relay, and the bytes the relay forwarded over UDP (its metrics) and spliced over TCP.

    sudo python3 bench/natbench.py                       # all pairings, intercontinental, 1 GiB, 3 runs
    sudo python3 bench/natbench.py --pairings cone-cone,sym-sym --size 256M --repeat 1 --splice ''
    sudo python3 bench/natbench.py --no-build --csv bench/results/nat.csv

Needs root, iproute2, nftables, ``cargo build --release -p hurtle -p linkem`` (done unless
``--no-build``).
"""
from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))

import run as hrun  # noqa: E402  (source files, quiet waits, memory warming)
from hbench import netlab  # noqa: E402
from hbench.sysutil import REG, Proc, cargo_build, install_signal_handlers, log, recover_stale, sh  # noqa: E402

# run.py sets HURTLE_CODE for its direct runs; here only the direct baseline has one (the relay
# runs take the code their receiver prints).
DIRECT_CODE = os.environ.pop("HURTLE_CODE", None) or "4242-banjo-cello-drum"
RELAY_ADDR = "10.203.1.1"
RELAY_PORT = 7431
METRICS = "127.0.0.1:7499"
HOSTS = {"a": "10.204.1.2", "b": "10.204.2.2"}

NAT_RULES = {
    "cone": """
table ip hn_nat {
  chain nat_out { type nat hook postrouting priority 100; oifname "out" masquerade; }
  chain filter_fwd {
    type filter hook forward priority 0; policy drop;
    ct state established,related accept;
    iifname "in" oifname "out" accept;
  }
  chain unsolicited { type filter hook input priority 0; policy accept; iifname "out" ct state new drop; }
}
""",
    "fullcone": """
table ip hn_nat {
  chain nat_in { type nat hook prerouting priority -100; iifname "out" meta l4proto udp dnat to {inside}; }
  chain nat_out { type nat hook postrouting priority 100; oifname "out" masquerade; }
  chain filter_fwd {
    type filter hook forward priority 0; policy drop;
    ct state established,related accept;
    ct status dnat accept;
    iifname "in" oifname "out" accept;
  }
}
""",
    "sym": """
table ip hn_nat {
  chain nat_out { type nat hook postrouting priority 100; oifname "out" masquerade random; }
  chain filter_fwd {
    type filter hook forward priority 0; policy drop;
    ct state established,related accept;
    iifname "in" oifname "out" accept;
  }
}
""",
    "noudp": """
table ip hn_nat {
  chain nat_out { type nat hook postrouting priority 100; oifname "out" masquerade; }
  chain filter_fwd {
    type filter hook forward priority 0; policy drop;
    iifname "in" meta l4proto udp drop;
    ct state established,related accept;
    iifname "in" oifname "out" accept;
  }
  chain unsolicited { type filter hook input priority 0; policy accept; iifname "out" ct state new drop; }
}
""",
}

# receiver's NAT - sender's NAT, and what the reach issue expects of each.
PAIRINGS = {
    "cone-cone": "direct",
    "sym-fullcone": "direct",
    "sym-cone": "relay udp",
    "sym-sym": "relay udp",
    "noudp-cone": "relay tcp",
}

CSV_FIELDS = ["timestamp", "pairing", "mode", "profile", "file_size", "ok", "goodput_mbps",
              "path", "transport", "direct_channels", "channels", "direct_after_s", "bytes_by_path",
              "relay_udp_bytes", "relay_splice_bytes", "cpu_s_per_gib_sender",
              "cpu_s_per_gib_receiver", "cpu_s_per_gib_relay", "note", "machine", "tcp_cc"]


class NatLab(netlab.Lab):
    """netlab's emulated path with a NAT and a host behind it at each end."""

    def build_nat(self, tcp_cc: str | None = None):
        self.build_emu(tcp_cc)
        a, em, b = self.ns("a"), self.ns("em"), self.ns("b")
        ha, na, nb, hb = (self._mkns(x) for x in ("ha", "na", "nb", "hb"))
        for side, (h, n, r, rdev) in {"a": (ha, na, a, "wa"), "b": (hb, nb, b, "wb")}.items():
            k = 1 if side == "a" else 2
            sh(["ip", "link", "add", "v", "netns", h, "type", "veth", "peer", "name", "in", "netns", n])
            sh(["ip", "link", "add", "out", "netns", n, "type", "veth", "peer", "name", rdev, "netns", r])
            for ns_, dev, addr in [(h, "v", f"10.204.{k}.2/24"), (n, "in", f"10.204.{k}.1/24"),
                                   (n, "out", f"10.203.{k}.2/24"), (r, rdev, f"10.203.{k}.1/24")]:
                sh(["ip", "-n", ns_, "addr", "add", addr, "dev", dev])
                sh(["ip", "-n", ns_, "link", "set", dev, "up"])
            sh(["ip", "-n", h, "route", "add", "default", "via", f"10.204.{k}.1"])
            sh(["ip", "-n", n, "route", "add", "default", "via", f"10.203.{k}.1"])
            sh(["sysctl", "-qw", "net.ipv4.ip_forward=1"], ns=n)
            sh(["sysctl", "-qw", "net.ipv4.ip_forward=1"], ns=r)
            self._endpoint_sysctls(h, tcp_cc)
        # The routers reach the far NAT's outside network across the emulated path.
        sh(["ip", "-n", a, "route", "add", "10.203.2.0/24", "via", "10.201.1.1"])
        sh(["ip", "-n", b, "route", "add", "10.203.1.0/24", "via", "10.201.2.1"])
        sh(["ip", "-n", em, "route", "add", "10.203.1.0/24", "via", netlab.A_ADDR])
        sh(["ip", "-n", em, "route", "add", "10.203.2.0/24", "via", netlab.B_ADDR])
        log(f"built NAT topology {ha} - {na} - {a} = {em} = {b} - {nb} - {hb}")

    def set_nats(self, kind_a: str, kind_b: str):
        for side, kind in (("a", kind_a), ("b", kind_b)):
            ns = self.ns("n" + side)
            sh(["nft", "flush", "ruleset"], ns=ns)
            rules = NAT_RULES[kind].replace("{inside}", HOSTS[side])
            sh(["bash", "-c", f"nft -f - <<'EOF'\n{rules}EOF"], ns=ns)


def proc_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and its live descendants (the relay under time/ip netns exec)."""
    from hbench.sysutil import descendants

    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for p in [pid] + descendants(pid):
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
            f = stat[stat.rfind(")") + 2:].split()
            total += (int(f[11]) + int(f[12])) / tick
        except (OSError, ValueError, IndexError):
            pass
    return total


def relay_metric(lab: NatLab, name: str) -> int | None:
    code = ("import urllib.request;"
            f"print(urllib.request.urlopen('http://{METRICS}/metrics', timeout=5).read().decode())")
    try:
        text = sh(["python3", "-c", code], ns=lab.ns("a"), timeout=10)
    except RuntimeError:
        return None
    total = None
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total = (total or 0) + int(float(line.rsplit(" ", 1)[1]))
    return total


def splice_total(log_text: str) -> int:
    """Bytes the relay's TCP splices carried both ways, from its `splice end` log lines."""
    n = 0
    for line in log_text.splitlines():
        if "splice end" in line:
            for m in re.finditer(r"(?:sender->receiver|receiver->sender)=(\d+)", line):
                n += int(m.group(1))
    return n


def one_run(lab: NatLab, hb: Path, pairing: str, mode: str, src: Path, rundir: Path, timeout: float,
            logs: bool = False) -> dict:
    """mode: ``auto`` (by code through the relay), ``tcp`` (the same with --transport tcp: the
    relay's TCP splice), or ``direct`` (no NAT: receiver on ``a``, sender on ``b``)."""
    out = rundir / "out"
    env = {"HURTLE_PATH_MEMORY": str(rundir / "path-memory")}
    row: dict = {"pairing": pairing if mode != "direct" else "none", "mode": mode}
    rlog = ["--log-dir", str(rundir / "receiver-logs")] if logs else []
    slog = ["--log-dir", str(rundir / "sender-logs")] if logs else []
    relay = recv = send = None
    try:
        if mode == "direct":
            env["HURTLE_CODE"] = DIRECT_CODE
            recv = Proc([str(hb), "receive", "--listen", f"{netlab.A_ADDR}:47400", "--out", str(out),
                         "--json", "-q"] + rlog, "receiver", rundir, ns=lab.ns("a"), env=env)
            if not recv.wait_listening(47400, "tcp", timeout=15):
                raise RuntimeError("receiver never listened: " + recv.stderr()[-300:])
            send = Proc([str(hb), "send", str(src), "--to", f"{netlab.A_ADDR}:47400", "--json", "-q"] + slog,
                        "sender", rundir, ns=lab.ns("b"), env=env)
        else:
            relay = Proc([str(hb), "relay", "--listen", f"{RELAY_ADDR}:{RELAY_PORT}", "--metrics", METRICS],
                         "relay", rundir, ns=lab.ns("a"))
            if not relay.wait_listening(RELAY_PORT, "tcp", timeout=10):
                raise RuntimeError("relay never listened: " + relay.stderr()[-300:])
            renv = env
            recv = Proc([str(hb), "receive", "--relay", f"{RELAY_ADDR}:{RELAY_PORT}", "--out", str(out),
                         "--json"] + rlog, "receiver", rundir, ns=lab.ns("ha"), env=renv)
            code = None
            end = time.monotonic() + 15
            while time.monotonic() < end and code is None:
                m = re.search(r"code: (\S+)", recv.stderr())
                code = m.group(1) if m else None
                if recv.poll() is not None:
                    break
                time.sleep(0.05)
            if code is None:
                raise RuntimeError("the receiver printed no code: " + recv.stderr()[-300:])
            extra = ["--transport", "tcp"] if mode == "tcp" else []
            send = Proc([str(hb), "send", str(src), "--code", code, "--relay",
                         f"{RELAY_ADDR}:{RELAY_PORT}", "--json", "-q"] + extra + slog,
                        "sender", rundir, ns=lab.ns("hb"), env=renv)
        rc = send.wait(timeout)
        rrc = recv.wait(30)
        gib = src.stat().st_size / (1 << 30)
        s = hrun.tools.last_json(send.stdout()) if rc is not None else None
        row["ok"] = int(rc == 0 and rrc == 0 and s is not None
                        and hrun.tools.sha256(out / src.name) == hrun.tools.sha256(src))
        if s:
            row.update(goodput_mbps=f"{(s.get('goodput_bps') or 0) / 1e6:.1f}", path=s.get("path", "direct"),
                       transport=s.get("transport"), channels=s.get("channels"),
                       direct_channels=s.get("direct_channels"),
                       direct_after_s=s.get("direct_after_seconds"),
                       bytes_by_path=json.dumps(s.get("bytes_by_path")) if s.get("bytes_by_path") else "")
        else:
            row["note"] = f"sender rc={rc}: " + send.stderr()[-200:].replace("\n", " ")
        if relay is not None:
            row["relay_udp_bytes"] = relay_metric(lab, "hurtle_relay_udp_forwarded_bytes_total")
            row["cpu_s_per_gib_relay"] = f"{proc_cpu(relay.pid) / gib:.3f}"
        for p, k in ((send, "sender"), (recv, "receiver")):
            p.stop(grace=3.0)
            _, cpu, _ = p.usage()
            if cpu is not None:
                row[f"cpu_s_per_gib_{k}"] = f"{cpu / gib:.3f}"
        if relay is not None:
            relay.stop(grace=3.0)
            row["relay_splice_bytes"] = splice_total(relay.stderr())
        return row
    finally:
        for p in (send, recv, relay):
            if p is not None:
                p.stop(grace=2.0)
                p.close()
        sh(["rm", "-rf", str(out)])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="intercontinental", choices=[
        p for p, v in netlab.PROFILES.items() if v.kind == "emu"])
    ap.add_argument("--pairings", default=",".join(PAIRINGS))
    ap.add_argument("--splice", default="cone-cone", metavar="PAIRING",
                    help="the pairing also run with --transport tcp (the relay's TCP splice, what a "
                         "relayed session was before UDP through the relay; it does not depend on the "
                         "NAT kind); '' for none, 'all' for every pairing")
    ap.add_argument("--size", type=hrun.parse_size, default=1 << 30)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-direct", action="store_true", help="skip the no-NAT direct baseline")
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--hurtle-bin", type=Path, default=REPO / "target" / "release" / "hurtle",
                    help="the hurtle binary to run (default: this checkout's release build)")
    ap.add_argument("--workdir", type=Path, default=Path("/dev/shm/hnbench"))
    ap.add_argument("--wait-quiet", type=float, default=5.0)
    ap.add_argument("--tcp-cc", help="TCP congestion control of the peers and the relay (default: the "
                    "host's, bbr here; the relay's splice and --transport tcp use it)")
    ap.add_argument("--timeout", type=float, help="per run, seconds (default 60 + 0.4 s per MiB)")
    ap.add_argument("--logs", action="store_true", help="keep each side's --log-dir logs in the run's directory")
    ap.add_argument("--csv", type=Path, default=BENCH / "results" / "nat.csv")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root (network namespaces, TUN, nftables)")
    pairings = args.pairings.split(",")
    for p in pairings:
        if p not in PAIRINGS:
            sys.exit(f"unknown pairing {p!r}; known: {', '.join(PAIRINGS)}")
    recover_stale(hrun.STATE_PATH, r"^hn(\d+)-")
    install_signal_handlers()
    REG.state_file = hrun.STATE_PATH
    if not args.no_build:
        for pkg in ("linkem", "hurtle"):
            if err := cargo_build(pkg):
                sys.exit(err)
    hb = args.hurtle_bin
    prof = netlab.PROFILES[args.profile]
    work = args.workdir / f"run-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    lab = NatLab(f"hn{os.getpid()}", work, REPO / "target" / "release" / "linkem")
    machine = f"{os.cpu_count()}c {Path('/proc/cpuinfo').read_text().split('model name')[1].split(':')[1].splitlines()[0].strip()[:40]}"
    timeout = args.timeout or 60 + args.size * 8 / 20e6
    rows = []
    try:
        if args.tcp_cc:
            # A namespace may make a congestion control its default only if the host allows it.
            key = "net.ipv4.tcp_allowed_congestion_control"
            allowed = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control").read_text().split()
            if args.tcp_cc not in allowed:
                REG.set_sysctl(key, " ".join(allowed + [args.tcp_cc]))
        lab.build_nat(args.tcp_cc)
        src = hrun.source_file(args.size, args.workdir)
        plan = [] if args.no_direct else [("none", "direct")]
        plan += [(p, "auto") for p in pairings]
        plan += [(p, "tcp") for p in pairings if args.splice in (p, "all")]
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        new = not args.csv.exists()
        with open(args.csv, "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
            if new:
                w.writeheader()
            k = 0
            for rep in range(args.repeat):
                for pairing, mode in plan:
                    k += 1
                    if mode != "direct":
                        ka, kb = pairing.split("-")
                        lab.set_nats(ka, kb)
                    hrun.wait_quiet(args.wait_quiet)
                    hrun.warm_memory(min(2 * args.size, 4 << 30))
                    rundir = work / f"{k:03d}-{pairing}-{mode}"
                    rundir.mkdir(parents=True)
                    lab.start_linkem(prof, seed=rep + 1, logdir=rundir)
                    try:
                        row = one_run(lab, hb, pairing, mode, src, rundir, timeout, args.logs)
                    except RuntimeError as e:
                        row = {"pairing": pairing, "mode": mode, "ok": 0, "note": str(e)[:300]}
                    finally:
                        lab.stop_linkem()
                    row.update(timestamp=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                               profile=args.profile, file_size=args.size, machine=machine,
                               tcp_cc=args.tcp_cc or Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip())
                    w.writerow({c: row.get(c, "") for c in CSV_FIELDS})
                    f.flush()
                    rows.append(row)
                    log(f"[{k}/{len(plan) * args.repeat}] {row['pairing']} {mode}: ok={row.get('ok')} "
                        f"{row.get('goodput_mbps')} Mbit/s path={row.get('path')}/{row.get('transport')} "
                        f"direct_after={row.get('direct_after_s')} relay_udp={row.get('relay_udp_bytes')} "
                        f"spliced={row.get('relay_splice_bytes')} cpu/GiB s={row.get('cpu_s_per_gib_sender')} "
                        f"r={row.get('cpu_s_per_gib_receiver')} relay={row.get('cpu_s_per_gib_relay')} "
                        f"{row.get('note', '')}")
    finally:
        REG.cleanup()
    summarize(rows)


def summarize(rows: list[dict]):
    """Medians per (pairing, mode)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["pairing"], r["mode"]), []).append(r)
    print(f"{'pairing':<14}{'mode':<8}{'ok':>4}{'Mbit/s':>9}  {'path':<18}{'direct after':>13}"
          f"{'relay fwd':>11}{'cpu s/r/relay':>20}")

    def med(rs, k):
        v = [float(r[k]) for r in rs if r.get(k) not in (None, "")]
        return statistics.median(v) if v else None

    for (p, m), rs in groups.items():
        ok = sum(int(r.get("ok") or 0) for r in rs)
        g, after, fwd = med(rs, "goodput_mbps"), med(rs, "direct_after_s"), med(rs, "relay_udp_bytes")
        cpu = "/".join(f"{x:.2f}" if x is not None else "-" for x in
                       (med(rs, "cpu_s_per_gib_sender"), med(rs, "cpu_s_per_gib_receiver"),
                        med(rs, "cpu_s_per_gib_relay")))
        paths = ",".join(sorted({f"{r.get('path')}/{r.get('transport')}" for r in rs}))
        print(f"{p:<14}{m:<8}{ok:>2}/{len(rs)}{(g or 0):>9.1f}  {paths:<18}"
              f"{(f'{after:.2f} s' if after is not None else '-'):>13}"
              f"{(f'{fwd / 2**20:.1f} MiB' if fwd is not None else '-'):>11}{cpu:>20}")


if __name__ == "__main__":
    main()
