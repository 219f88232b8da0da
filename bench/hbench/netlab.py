"""Network namespaces, links and path profiles.

Topologies (all names carry the prefix ``hb<pid>``, so concurrent runs and
stale leftovers are told apart; everything is registered for cleanup):

emulated (linkem)::

    [hb<pid>-a]                 [hb<pid>-em]                  [hb<pid>-b]
     va 10.201.1.2/24 ==veth== ea 10.201.1.1   eb 10.201.2.1 ==veth== vb 10.201.2.2/24
                                 |  tunA   tunB  |
                                 +--- linkem ----+

    A and B only have a route to each other's /24 (no default route). In
    em, policy routing sends everything that arrives on ``ea`` into
    ``tunA`` (``ip rule iif ea lookup 100``; table 100: default dev tunA) and
    everything from ``eb`` into ``tunB``. linkem reads tunA, impairs, writes
    tunB; the kernel then routes the packet (main table) out of ``eb`` to B.
    The reverse direction is symmetric. rp_filter is off in em.

tbf (kernel shaping, no delay)::

    [hb<pid>-ta] va 10.201.3.1 ==veth== vb 10.201.3.2 [hb<pid>-tb]
    B: ingress of vb redirected to ifb0, ``tbf`` on ifb0 (the bottleneck sits
    "in the network", not in the sender's own qdisc, so TCP gets no local
    back-pressure); random loss with ``nft ... numgen random mod 1000000 <
    N drop`` in the prerouting hook of *both* namespaces.

loopback: sender and receiver both in hb<pid>-a on 127.0.0.1 (lo, MTU 65536).

Endpoint namespaces get large TCP autotuning limits (tcp_rmem/tcp_wmem max
64 MiB; these sysctls are per-namespace, so nothing global changes) and
tcp_no_metrics_save=1 so one run's cached ssthresh/RTT never leaks into the
next. GSO super-packets are disabled on the tbf veths (gso_max_segs 1) so
nft loss applies per wire packet; on the emulated path the TUN devices have
no offloads, so the kernel segments before linkem.

linkem runs with ``--slack 100us --gso`` (``LINKEM_SLACK``, ``LINKEM_GSO``;
``run.py --linkem-slack 0 --no-linkem-gso`` gives an emulator that wakes
and writes once per packet): it releases what falls due within 100 us of a
due packet with it and writes each flow's packets of such a lump as one GSO
super-packet, so it wakes and writes several times less often. Every tool
gets the same.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from .sysutil import REG, Proc, log, sh

A_ADDR, B_ADDR = "10.201.1.2", "10.201.2.2"
TA_ADDR, TB_ADDR = "10.201.3.1", "10.201.3.2"


@dataclass
class Profile:
    """A path. ``rtt_ms`` is the round-trip propagation delay; linkem gets
    half of it as one-way delay in each direction. ``loss`` applies to each
    direction independently. ``rate_mbps`` is the bottleneck (both ways)."""

    name: str
    kind: str  # loopback | tbf | emu
    desc: str
    rtt_ms: float = 0.0
    rate_mbps: float | None = None
    loss: float = 0.0
    jitter_ms: float = 0.0  # one-way, uniform +-
    loss_burst: float = 1.0
    queue: str = "1M"
    reorder: float = 0.0
    extra: list[str] = field(default_factory=list)

    def linkem_args(self, seed: int) -> list[str]:
        a = [
            "--delay", f"{self.rtt_ms / 2:.4f}ms",
            "--rate", f"{int(self.rate_mbps)}M" if self.rate_mbps else "0",
            "--queue", self.queue,
            "--loss", f"{self.loss}",
            "--seed", str(seed),
        ]
        if self.jitter_ms:
            a += ["--jitter", f"{self.jitter_ms}ms"]
        if self.loss_burst > 1:
            a += ["--loss-burst", str(self.loss_burst)]
        if self.reorder:
            a += ["--reorder", str(self.reorder)]
        return a + self.extra

    def summary(self) -> str:
        if self.kind == "loopback":
            return self.desc
        parts = [f"RTT {self.rtt_ms:g} ms"] if self.kind == "emu" else ["no added delay"]
        if self.rate_mbps:
            parts.append(f"{self.rate_mbps:g} Mbit/s")
        parts.append(f"loss {self.loss * 100:g}%/dir" + (f" (bursts ~{self.loss_burst:g})" if self.loss_burst > 1 else ""))
        if self.jitter_ms:
            parts.append(f"jitter +-{self.jitter_ms:g} ms/dir")
        if self.reorder:
            parts.append(f"reorder {self.reorder * 100:g}%")
        if self.extra:
            parts.append(" ".join(self.extra))
        parts.append(f"queue {self.queue}")
        return ", ".join(parts)


# Rates stay well under linkem's measured ceiling (see README).
PROFILES: dict[str, Profile] = {
    p.name: p
    for p in [
        Profile("loopback", "loopback", "namespace loopback 127.0.0.1 (MTU 65536), no impairment"),
        Profile("tbf", "tbf", "veth + tbf 500 Mbit/s + nft random drop 0.5%/dir, no added delay",
                rate_mbps=500, loss=0.005, queue="1M"),
        Profile("lan", "emu", "LAN", rtt_ms=0.2, rate_mbps=800, loss=0.0, queue="512k"),
        Profile("metro", "emu", "metro", rtt_ms=10, rate_mbps=800, loss=0.0001, queue="1M"),
        Profile("continental", "emu", "continental", rtt_ms=80, rate_mbps=500, loss=0.005, queue="2M"),
        Profile("intercontinental", "emu", "intercontinental", rtt_ms=150, rate_mbps=500, loss=0.01, queue="4M"),
        Profile("lossy-wifi", "emu", "lossy Wi-Fi", rtt_ms=20, rate_mbps=200, loss=0.02, jitter_ms=2.0,
                loss_burst=2.0, queue="512k"),
        Profile("satellite", "emu", "GEO satellite", rtt_ms=600, rate_mbps=100, loss=0.001, queue="2M"),
        # The WAN-fill issue's paths beyond the ones above.
        Profile("wan-1g", "emu", "1 Gbit/s intercontinental", rtt_ms=150, rate_mbps=1000, loss=0.01,
                queue="8M"),
        Profile("lossy-wifi-reorder", "emu", "lossy Wi-Fi, 2% reordered, 1% duplicated", rtt_ms=20,
                rate_mbps=200, loss=0.02, jitter_ms=2.0, loss_burst=2.0, queue="512k", reorder=0.02,
                extra=["--dup", "0.01", "--reorder-delay", "3ms"]),
        # intercontinental with a few ms of one-way delay spread (never reordering), reordering
        # and duplication apart from it: jitter and reordering that are not a queue. (At 60 ms
        # and 400 Mbit/s the same impairments cost auto nothing against the oracle; at 150 ms
        # the receiver's train estimates, which jitter spreads, ended startup at half the path.)
        Profile("jittery", "emu", "intercontinental, +-4 ms jitter, 1% reordered, 0.5% duplicated",
                rtt_ms=150, rate_mbps=500, loss=0.01, jitter_ms=4.0, queue="4M", reorder=0.01,
                extra=["--dup", "0.005", "--reorder-delay", "3ms"]),
        # A queue of a tenth of the bandwidth-delay product (1 Gbit/s x 40 ms = 5 MB).
        Profile("shallow-1g", "emu", "1 Gbit/s, shallow queue", rtt_ms=40, rate_mbps=1000, loss=0.0,
                queue="500k"),
        Profile("lossy-5pct", "emu", "heavy random loss", rtt_ms=100, rate_mbps=300, loss=0.05, queue="2M"),
        # intercontinental with the link down both ways for 3 s once 128 MiB went in from the
        # sender's side (a route flap, a handover): what recovery costs beyond the 3 s.
        Profile("intercontinental-outage", "emu", "intercontinental, down 3 s after 128 MiB",
                rtt_ms=150, rate_mbps=500, loss=0.01, queue="4M",
                extra=["--outage-at", "128M", "--outage-for", "3s"]),
        # The same down for 10 s: what a sender sends into an outage that lasts.
        Profile("intercontinental-outage-10s", "emu", "intercontinental, down 10 s after 128 MiB",
                rtt_ms=150, rate_mbps=500, loss=0.01, queue="4M",
                extra=["--outage-at", "128M", "--outage-for", "10s"]),
        # intercontinental without random loss: the set-up's round trips alone (1 MiB in 4 RTT).
        Profile("intercontinental-clean", "emu", "intercontinental, no loss", rtt_ms=150,
                rate_mbps=500, loss=0.0, queue="4M"),
    ]
}


@dataclass
class PathEnds:
    send_ns: str
    recv_ns: str
    send_addr: str
    recv_addr: str


# linkem's release slack and GSO writes (see the module doc). Measured on a
# 2-core VM over intercontinental: with them linkem woke half as often and
# wrote 5x less often, the machine's busy share fell from ~72% to ~53% per
# hurtle run; at 1 Gbit/s (wan-1g) no packet was dropped before linkem any
# more (thousands per run before, counted as the path's loss).
LINKEM_SLACK = "100us"
LINKEM_GSO = True


class Lab:
    """Builds the topologies on demand and runs linkem."""

    def __init__(self, prefix: str, root: Path, linkem_bin: Path, rt_priority=20,
                 slack=LINKEM_SLACK, gso=LINKEM_GSO):
        self.prefix = prefix
        self.root = root
        self.linkem_bin = linkem_bin
        self.rt_priority = rt_priority
        self.slack = slack
        self.gso = gso
        self.emu_built = False
        self.tbf_built = None  # the Profile it was built for
        self.linkem: Proc | None = None

    # -- helpers -------------------------------------------------------------
    def ns(self, suffix):
        return f"{self.prefix}-{suffix}"

    def _mkns(self, suffix):
        name = self.ns(suffix)
        sh(["ip", "netns", "add", name])
        REG.add_netns(name)
        sh(["ip", "-n", name, "link", "set", "lo", "up"])
        return name

    def _endpoint_sysctls(self, ns, tcp_cc=None):
        sets = [
            "net.ipv4.tcp_rmem=4096 131072 67108864",
            "net.ipv4.tcp_wmem=4096 16384 67108864",
            "net.ipv4.tcp_no_metrics_save=1",
        ]
        if tcp_cc:
            sets.append(f"net.ipv4.tcp_congestion_control={tcp_cc}")
        for s in sets:
            sh(["sysctl", "-qw", s], ns=ns)

    # -- emulated topology ---------------------------------------------------
    def build_emu(self, tcp_cc=None):
        if self.emu_built:
            return
        a, em, b = self._mkns("a"), self._mkns("em"), self._mkns("b")
        cmds = [
            ["ip", "link", "add", "va", "netns", a, "type", "veth", "peer", "name", "ea", "netns", em],
            ["ip", "link", "add", "vb", "netns", b, "type", "veth", "peer", "name", "eb", "netns", em],
            ["ip", "-n", a, "addr", "add", f"{A_ADDR}/24", "dev", "va"],
            ["ip", "-n", a, "link", "set", "va", "up"],
            ["ip", "-n", b, "addr", "add", f"{B_ADDR}/24", "dev", "vb"],
            ["ip", "-n", b, "link", "set", "vb", "up"],
            ["ip", "-n", em, "addr", "add", "10.201.1.1/24", "dev", "ea"],
            ["ip", "-n", em, "addr", "add", "10.201.2.1/24", "dev", "eb"],
            ["ip", "-n", em, "link", "set", "ea", "up"],
            ["ip", "-n", em, "link", "set", "eb", "up"],
            # Subnet routes only, no default route: nothing in the endpoint
            # namespaces can even try to reach an outside address (a DNS
            # lookup fails at once instead of timing out).
            ["ip", "-n", a, "route", "add", "10.201.2.0/24", "via", "10.201.1.1"],
            ["ip", "-n", b, "route", "add", "10.201.1.0/24", "via", "10.201.2.1"],
            ["ip", "-n", em, "tuntap", "add", "dev", "tunA", "mode", "tun"],
            ["ip", "-n", em, "tuntap", "add", "dev", "tunB", "mode", "tun"],
            ["ip", "-n", em, "link", "set", "tunA", "up", "txqueuelen", "4096"],
            ["ip", "-n", em, "link", "set", "tunB", "up", "txqueuelen", "4096"],
            ["ip", "-n", em, "rule", "add", "iif", "ea", "lookup", "100", "pref", "100"],
            ["ip", "-n", em, "rule", "add", "iif", "eb", "lookup", "101", "pref", "101"],
            ["ip", "-n", em, "route", "add", "default", "dev", "tunA", "table", "100"],
            ["ip", "-n", em, "route", "add", "default", "dev", "tunB", "table", "101"],
        ]
        for c in cmds:
            sh(c)
        sh(["sysctl", "-qw", "net.ipv4.ip_forward=1"], ns=em)
        for d in ["all", "default", "ea", "eb", "tunA", "tunB"]:
            sh(["sysctl", "-qw", f"net.ipv4.conf.{d}.rp_filter=0"], ns=em)
        self._endpoint_sysctls(a, tcp_cc)
        self._endpoint_sysctls(b, tcp_cc)
        self.emu_built = True
        log(f"built emulated topology {a} <-> {em} <-> {b}")

    def set_emu_bottleneck(self, rate_mbps: float, queue: str):
        """A kernel ``tbf`` bottleneck on the emulated path's a->b direction, behind linkem
        (on the router's egress towards b), so linkem adds only delay: the real qdisc queue of
        the tbf topology with a round-trip time. Replaced by the next call; goes with the
        namespaces."""
        sh(["tc", "-n", self.ns("em"), "qdisc", "replace", "dev", "eb", "root"] + tbf_args(rate_mbps, queue))

    def tun_drops(self) -> int:
        """Packets the kernel dropped before linkem could read them (TUN
        queue overflow = emulator overload), both directions."""
        if not self.emu_built:
            return 0
        out = sh(["ip", "-n", self.ns("em"), "-s", "-j", "link", "show"])
        total = 0
        for dev in json.loads(out):
            if dev.get("ifname") in ("tunA", "tunB"):
                st = dev.get("stats64", {}).get("tx", {})
                total += int(st.get("dropped", 0))
        return total

    def start_linkem(self, prof: Profile, seed: int, logdir: Path) -> Proc:
        self.stop_linkem()
        args = [str(self.linkem_bin), "--rt-priority", str(self.rt_priority), "--label", "linkem"]
        args += ["--slack", self.slack] + (["--gso"] if self.gso else [])
        args += prof.linkem_args(seed)
        p = Proc(args, "linkem", logdir, ns=self.ns("em"), timed=True)
        end = time.monotonic() + 5
        while time.monotonic() < end:
            if "linkem: ready" in p.stderr():
                self.linkem = p
                return p
            if p.poll() is not None:
                break
            time.sleep(0.02)
        raise RuntimeError(f"linkem did not start: {p.stderr()[-500:]}")

    def stop_linkem(self) -> dict:
        """Stop linkem; return its final per-direction counters."""
        p, self.linkem = self.linkem, None
        if p is None:
            return {}
        p.stop(grace=3.0)
        p.close()
        return parse_linkem_stats(p.stderr())

    # -- tbf topology --------------------------------------------------------
    def build_tbf(self, prof: Profile, tcp_cc=None):
        if self.tbf_built is prof:
            return
        if self.tbf_built is not None:
            raise RuntimeError("only one tbf profile per run")
        ta, tb = self._mkns("ta"), self._mkns("tb")
        rate = f"{int(prof.rate_mbps)}mbit"
        cmds = [
            ["ip", "link", "add", "va", "netns", ta, "type", "veth", "peer", "name", "vb", "netns", tb],
            ["ip", "-n", ta, "addr", "add", f"{TA_ADDR}/24", "dev", "va"],
            ["ip", "-n", tb, "addr", "add", f"{TB_ADDR}/24", "dev", "vb"],
            ["ip", "-n", ta, "link", "set", "va", "gso_max_segs", "1", "up"],
            ["ip", "-n", tb, "link", "set", "vb", "gso_max_segs", "1", "up"],
            ["ip", "-n", tb, "link", "add", "ifb0", "type", "ifb"],
            ["ip", "-n", tb, "link", "set", "ifb0", "up"],
            ["tc", "-n", tb, "qdisc", "add", "dev", "vb", "handle", "ffff:", "ingress"],
            ["tc", "-n", tb, "filter", "add", "dev", "vb", "parent", "ffff:", "protocol", "all",
             "u32", "match", "u32", "0", "0", "action", "mirred", "egress", "redirect", "dev", "ifb0"],
            ["tc", "-n", tb, "qdisc", "add", "dev", "ifb0", "root"] + tbf_args(prof.rate_mbps, prof.queue),
        ]
        for c in cmds:
            sh(c)
        n = int(round(prof.loss * 1_000_000))
        if n > 0:
            rules = (
                "table inet hbloss {\n"
                "  chain pre {\n"
                "    type filter hook prerouting priority -300; policy accept;\n"
                f"    numgen random mod 1000000 < {n} counter drop\n"
                "  }\n"
                "}\n"
            )
            for ns in (ta, tb):
                sh(["ip", "netns", "exec", ns, "bash", "-c", f"nft -f - <<'EOF'\n{rules}EOF"])
        self._endpoint_sysctls(ta, tcp_cc)
        self._endpoint_sysctls(tb, tcp_cc)
        self.tbf_built = prof
        log(f"built tbf topology {ta} <-> {tb} ({rate}, loss {prof.loss})")

    # -- paths ---------------------------------------------------------------
    def ends(self, prof: Profile) -> PathEnds:
        if prof.kind == "loopback":
            return PathEnds(self.ns("a"), self.ns("a"), "127.0.0.1", "127.0.0.1")
        if prof.kind == "tbf":
            return PathEnds(self.ns("ta"), self.ns("tb"), TA_ADDR, TB_ADDR)
        return PathEnds(self.ns("a"), self.ns("b"), A_ADDR, B_ADDR)

    def prepare(self, prof: Profile, tcp_cc=None):
        if prof.kind in ("loopback", "emu"):
            self.build_emu(tcp_cc)
        else:
            self.build_tbf(prof, tcp_cc)


def tbf_args(rate_mbps: float, queue: str) -> list[str]:
    """A ``tbf`` qdisc at ``rate_mbps`` with a drop-tail queue of ``queue`` bytes ("64k", "1M")."""
    return ["tbf", "rate", f"{int(rate_mbps)}mbit", "burst", "32kb",
            "limit", queue.replace("M", "mb").replace("k", "kb")]


def parse_linkem_stats(stderr: str) -> dict:
    """{'a2b': {...}, 'b2a': {...}} from linkem's ``final`` lines."""
    res = {}
    for line in stderr.splitlines():
        if not line.endswith(" final"):
            continue
        parts = line.split()
        if len(parts) < 3:
            continue
        d = {}
        for kv in parts[2:]:
            if "=" in kv:
                k, v = kv.split("=", 1)
                try:
                    d[k] = float(v.rstrip("s"))
                except ValueError:
                    pass
        res[parts[1]] = d
    return res
