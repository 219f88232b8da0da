#!/usr/bin/env python3
"""Where each CPU-second goes: hurtle's cost per byte, per side, beside one TCP stream.

A fixed workload (a random file on /dev/shm, 1 GiB by default) moved over a veth pair between
two network namespaces (no delay, MTU 1500 by default or 9000) and over a namespace's
loopback, by hurtle at fixed rates and with automatic rate control, and by one TCP stream at
the same rates (paced by the kernel with SO_MAX_PACING_RATE at a fixed rate; without the fq
qdisc TCP paces itself with an hrtimer per burst; unpaced at ``auto``), three ways:

* ``tcp``: bench/tcphash ``--no-hash``: the sender reads the file in 1 MiB pieces and writes
  them to the socket, the receiver reads up to 1 MiB at a time and writes each piece;
* ``tcp-b3``: bench/tcphash: the same with BLAKE3 of every byte on both ends (the integrity
  work hurtle does; the fair baseline for hurtle's cost);
* ``tcp-sendfile``: bench/hbench/tcpcopy.py (sendfile, and a Python receiver reading into a
  4 MiB buffer; paced through ``cost.py _tcp-send-paced``): zero-copy sending, but the
  receiver's interpreter costs per wake-up, which shows at low rates.

Per run and as medians it prints:

* goodput (file bytes x 8 / time from the sender's start until both ends exited);
* CPU-seconds per GiB of each side, user and system apart (``/usr/bin/time``, i.e. wait4's
  rusage of the process and all its threads), and of the whole machine over the run
  (``/proc/stat`` minus idle and iowait, steal apart): on veth and loopback much of the
  kernel's network work runs in softirq context and is charged to whichever task is on the
  CPU, often the peer, so the machine's figure is the fair one to compare tools by;
* per GiB per side: system calls (sends, receives, futex, sched_yield, clock_nanosleep, poll,
  pread/pwrite, read/write) and context switches, counted by ``perf stat`` on the syscall
  tracepoints in runs of their own after the measured ones (``--stat-repeat``, default 1):
  the tracepoints cost a sender paced at 100M a quarter more CPU (``--no-syscalls``: none);
* ``--profile``: one more run per configuration under ``perf record -g`` per side, its samples
  split by stage (read, hash, seal/open, send, receive, net softirq, pace/sleep/switch, gather,
  write, user copy, other) by the rules in ``STAGES`` below, and the top "other" symbols;
* ``--callgrind``: one run per configuration of ``--callgrind-size`` (32 MiB) with each side
  under ``valgrind --tool=callgrind``: user-space instructions per GiB per side, the figure
  that does not move with the machine's noise (kernel work is not in it).

    python3 bench/cost.py                                   # veth 1500 + loopback, 100M,400M,1G,auto, x5
    python3 bench/cost.py --paths veth --rates 1G --repeat 3 --tools hurtle
    python3 bench/cost.py --paths veth --rates 100M,1G --tools tcp,tcp-b3 --profile   # paced TCP's floor
    python3 bench/cost.py --paths veth,veth9000 --rates 1G,auto --profile --callgrind
    python3 bench/cost.py --variant base=/tmp/hurtle-a,/tmp/hurtle-a --variant new=/tmp/hurtle-b,/tmp/hurtle-a
    python3 bench/cost.py --paths loopback --rates auto --no-encryption   # each variant also without encryption

A variant is ``NAME=SENDBIN,RECVBIN`` (optionally ``,no-encryption``); without ``--variant``
there is one, ``hurtle`` = ``--send-bin``/``--recv-bin`` (default target/release/hurtle). Every
repeat runs every configuration once, in an order that rotates between repeats. Needs root
(namespaces). Everything it creates is named with ``hc<pid>`` and removed at the end, on
Ctrl-C and on failure (``--cleanup`` removes what a SIGKILLed run left). The Markdown tables
go to stdout, progress to stderr, one CSV row per run to ``--csv`` (default
bench/results/cost-<UTC time>.csv).
"""
from __future__ import annotations

import argparse
import csv
import datetime as dt
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))

from hbench.sysutil import REG, Interrupted, Proc, install_signal_handlers, log, recover_stale, sh  # noqa: E402
from run import cpu_jiffies, parse_size, source_file, warm_memory  # noqa: E402

# Both ends of every hurtle run get the same code (the session is encrypted unless a variant
# says --no-encryption), and every run starts cold: no memory of the last run's path.
os.environ.setdefault("HURTLE_CODE", "4242-banjo-cello-drum")
os.environ["HURTLE_PATH_MEMORY"] = "off"

GIB = 1 << 30
NS_RE = r"^hc(\d+)-"
TIME_FMT = "HCTIME %e %U %S %M %c %w"

# System calls counted per side (tracepoints syscalls:sys_enter_<name>), and the other events.
SYSCALLS = [
    "sendmsg", "sendmmsg", "sendto", "sendfile64", "recvmmsg", "recvmsg", "recvfrom", "read",
    "write", "pread64", "pwrite64", "futex", "sched_yield", "clock_nanosleep", "nanosleep",
    "poll", "ppoll", "epoll_wait", "epoll_pwait", "fsync", "fdatasync",
]
EVENTS = ["task-clock", "context-switches", "cpu-migrations"] + [f"syscalls:sys_enter_{s}" for s in SYSCALLS]
# Columns of the syscall table (per GiB), each the sum of the named counters.
SYSCALL_COLUMNS = [
    ("send", ["sendmsg", "sendmmsg", "sendto", "sendfile64"]),
    ("recv", ["recvmmsg", "recvmsg", "recvfrom"]),
    ("read", ["read", "pread64"]),
    ("write", ["write", "pwrite64"]),
    ("futex", ["futex"]),
    ("yield", ["sched_yield"]),
    ("sleep", ["clock_nanosleep", "nanosleep"]),
    ("poll", ["poll", "ppoll", "epoll_wait", "epoll_pwait"]),
    ("csw", ["context-switches"]),
]

# The profile's stages: a sample belongs to the first stage (in this order) one of whose
# patterns matches any frame of its call chain (kernel frames are always unwound; user frames
# as far as frame pointers go, so a user-space leaf is mostly what decides there). `sides`
# limits a rule to the sender (s) or the receiver (r).
STAGES: list[tuple[str, str, str]] = [
    ("hash", "sr", r"blake3"),
    ("seal/open", "sr", r"aes|gcm|ghash|polyval|aead|chacha|ring::|aws_lc"),
    ("net softirq", "sr", r"net_rx_action|__do_softirq|handle_softirqs|do_softirq|process_backlog"
                          r"|__netif_receive_skb|ip_rcv|ip_local_deliver|tcp_v4_rcv|udp_rcv"),
    ("send", "sr", r"udp_sendmsg|tcp_sendmsg|__sys_sendmsg|__sys_sendmmsg|__x64_sys_sendmsg"
                   r"|__x64_sys_sendmmsg|__x64_sys_sendto|do_sendfile|__x64_sys_sendfile|sock_sendmsg"),
    ("receive", "sr", r"udp_recvmsg|tcp_recvmsg|__sys_recvmmsg|__x64_sys_recvmmsg|__x64_sys_recvmsg"
                      r"|__x64_sys_recvfrom|sock_recvmsg|skb_copy_datagram_iter|__skb_recv_udp"),
    ("gather", "r", r"gathering|hrtimer_nanosleep|__x64_sys_clock_nanosleep|do_nanosleep"),
    ("read", "sr", r"__x64_sys_pread64|ksys_pread64|shmem_file_read_iter|filemap_read|ext4_file_read_iter"
                   r"|__x64_sys_read$|ksys_read"),
    ("write", "sr", r"__x64_sys_pwrite64|ksys_pwrite64|shmem_file_write_iter|generic_perform_write"
                    r"|copy_folio_from_iter|shmem_write_begin|ext4_buffered_write_iter|ext4_file_write_iter"
                    r"|__x64_sys_write$|ksys_write|fsync|fdatasync"),
    ("pace/sleep/switch", "sr", r"schedule|finish_task_switch|futex|nanosleep|sched_yield|park"
                                r"|__x64_sys_poll|__x64_sys_ppoll|epoll_wait|do_sys_poll"),
    ("user copy", "sr", r"^__memmove|^__memcpy|^memcpy|^memmove|__memmove_avx|__memcpy_avx"),
]
STAGE_NAMES = [s[0] for s in STAGES] + ["other"]


# -- paths ---------------------------------------------------------------------------------

@dataclass
class Path_:
    name: str
    kind: str  # veth | loopback
    mtu: int
    send_ns: str = ""
    recv_ns: str = ""
    recv_addr: str = ""


class Lab:
    """The namespaces, built on first use: ``hc<pid>-lo`` (loopback), ``hc<pid>-s<mtu>`` and
    ``hc<pid>-r<mtu>`` joined by a veth pair of that MTU (no delay, no qdisc changes)."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.built: dict[str, Path_] = {}

    def _mkns(self, name: str) -> str:
        sh(["ip", "netns", "add", name])
        REG.add_netns(name)
        sh(["ip", "-n", name, "link", "set", "lo", "up"])
        # Big TCP autotuning limits for the TCP baselines (per namespace; nothing global).
        sh(["sysctl", "-qw", "net.ipv4.tcp_rmem=4096 131072 67108864"], ns=name)
        sh(["sysctl", "-qw", "net.ipv4.tcp_wmem=4096 16384 67108864"], ns=name)
        sh(["sysctl", "-qw", "net.ipv4.tcp_no_metrics_save=1"], ns=name)
        return name

    def get(self, name: str) -> Path_:
        if name in self.built:
            return self.built[name]
        if name == "loopback":
            ns = self._mkns(f"{self.prefix}-lo")
            p = Path_(name, "loopback", 65536, ns, ns, "127.0.0.1")
        else:
            m = re.fullmatch(r"veth(\d*)", name)
            if not m:
                raise ValueError(f"unknown path {name!r} (loopback, veth, veth9000, veth<MTU>)")
            mtu = int(m.group(1) or 1500)
            if not 576 <= mtu <= 65535:
                raise ValueError(f"MTU {mtu} out of range")
            s, r = self._mkns(f"{self.prefix}-s{mtu}"), self._mkns(f"{self.prefix}-r{mtu}")
            sh(["ip", "link", "add", "vs", "netns", s, "type", "veth", "peer", "name", "vr", "netns", r])
            for ns, dev, addr in ((s, "vs", "10.203.1.1/24"), (r, "vr", "10.203.1.2/24")):
                sh(["ip", "-n", ns, "addr", "add", addr, "dev", dev])
                sh(["ip", "-n", ns, "link", "set", dev, "mtu", str(mtu), "up"])
            p = Path_(name, "veth", mtu, s, r, "10.203.1.2")
        self.built[name] = p
        log(f"path {name}: {p.send_ns} -> {p.recv_ns} ({p.recv_addr}, MTU {p.mtu})")
        return p


# -- what runs ------------------------------------------------------------------------------

@dataclass
class Variant:
    name: str
    send_bin: str
    recv_bin: str
    encrypt: bool = True


@dataclass
class Job:
    """One configuration: a tool (hurtle variant, tcp, tcp-b3, tcp-sendfile) on a path at a rate."""

    tool: str  # hurtle | tcp | tcp-b3 | tcp-sendfile
    path: str
    rate: str  # "auto" (hurtle's rate control; TCP unpaced) or a fixed rate: "100M", ...
    variant: Variant | None = None

    @property
    def label(self) -> str:
        return self.variant.name if self.variant else self.tool

    @property
    def key(self) -> tuple:
        return (self.path, self.label, self.rate)

    def timeout(self, size: int, slow: float = 1.0) -> float:
        bps = 200e6 if self.rate == "auto" else parse_rate(self.rate)
        return min(1800.0, 60.0 + slow * 3 * size * 8 / max(bps, 10e6))

    def sides(self, p: Path_, port: int, src: Path, out: Path, tcphash: str) -> tuple[list[str], list[str]]:
        """(sender argv, receiver argv)."""
        dst = f"{p.recv_addr}:{port}"
        paced = self.rate != "auto"
        if self.tool == "tcp-sendfile":
            py = str(BENCH / "hbench" / "tcpcopy.py")
            send = (["python3", str(Path(__file__).resolve()), "_tcp-send-paced", str(src), dst, self.rate]
                    if paced else ["python3", py, "send", str(src), "--to", dst])
            return send, ["python3", py, "recv", "--listen", dst, "--out", str(out / src.name)]
        if self.tool in ("tcp", "tcp-b3"):
            opts = (["--no-hash"] if self.tool == "tcp" else []) + (["--pacing-rate", self.rate] if paced else [])
            return ([tcphash, "send", str(src), "--to", dst] + opts,
                    [tcphash, "recv", "--listen", dst, "--out", str(out / src.name)])
        v = self.variant
        enc = [] if v.encrypt else ["--no-encryption"]
        rate = [] if self.rate == "auto" else ["--rate-fixed", self.rate]
        return ([v.send_bin, "send", str(src), "--to", dst, "--json", "-q"] + rate + enc,
                [v.recv_bin, "receive", "--listen", dst, "--out", str(out), "--json", "-q"] + enc)


def tcp_send_paced(argv: list[str]) -> int:
    """``cost.py _tcp-send-paced FILE HOST:PORT RATE``: tcpcopy.py's sender (sendfile, then wait
    for the receiver to close) with SO_MAX_PACING_RATE set to RATE bit/s. Without the fq qdisc
    the kernel paces inside TCP (tcp_internal_pacing, an hrtimer per burst)."""
    import socket

    path, dst, rate = argv
    host, _, port = dst.rpartition(":")
    so_max_pacing_rate = getattr(socket, "SO_MAX_PACING_RATE", 47)
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.settimeout(None)
        s.setsockopt(socket.SOL_SOCKET, so_max_pacing_rate, int(parse_rate(rate) / 8))
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            sent = s.sendfile(f)
        s.shutdown(socket.SHUT_WR)
        s.recv(1)
    if sent != size:
        print(f"sent {sent} of {size} bytes", file=sys.stderr)
        return 1
    return 0


def parse_rate(s: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgG]?)", s.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"bad rate {s!r} (e.g. 400M, 1G, auto)")
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2).lower()]


# -- one run --------------------------------------------------------------------------------

@dataclass
class Run:
    job: Job
    repeat: int
    mode: str  # measure | stat | profile | callgrind | callgrind2
    ok: bool = False
    wall: float | None = None
    goodput: float | None = None
    size: int = 0
    cpu: dict = field(default_factory=dict)  # side -> (user, sys)
    machine_busy_s: float | None = None
    steal_s: float | None = None
    load_before: float | None = None
    counts: dict = field(default_factory=dict)  # side -> {event: count}
    stages: dict = field(default_factory=dict)  # side -> {stage: samples}
    other_syms: dict = field(default_factory=dict)  # side -> [(sym, samples)]
    threads: dict = field(default_factory=dict)  # side -> [(thread name, samples)]
    instr: dict = field(default_factory=dict)  # side -> instructions (callgrind)
    note: str = ""


def parse_time(path: Path) -> tuple[float, float] | None:
    try:
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("HCTIME"):
                f = line.split()
                return float(f[2]), float(f[3])
    except OSError:
        pass
    return None


def parse_stat(path: Path) -> dict:
    """perf stat -x, output -> {event: count} (syscalls:sys_enter_X as X)."""
    res = {}
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return res
    for line in text.splitlines():
        f = line.split(",")
        if len(f) < 3 or not f[0] or f[0].startswith("#"):
            continue
        try:
            v = float(f[0])
        except ValueError:
            continue
        res[f[2].replace("syscalls:sys_enter_", "")] = v
    return res


def classify(side: str, frames: list[str]) -> str:
    for name, sides, rx in STAGE_RES:
        if side not in sides:
            continue
        for fr in frames:
            if rx.search(fr):
                return name
    return "other"


STAGE_RES = [(n, s, re.compile(rx)) for n, s, rx in STAGES]


def profile_split(data: Path, side: str, timeout: float = 300) -> tuple[dict, list, list]:
    """Samples of a perf.data per stage, the most frequent leaf symbols left as 'other', and the
    samples per thread name (the busiest thread bounds what one transfer can do)."""
    r = subprocess.run(["perf", "script", "-i", str(data), "-F", "comm,tid,ip,sym", "--no-inline"],
                       capture_output=True, text=True, timeout=timeout)
    counts = {s: 0 for s in STAGE_NAMES}
    other: dict[str, int] = {}
    threads: dict[str, int] = {}
    frames: list[str] = []

    def flush():
        if not frames:
            return
        st = classify(side, frames)
        counts[st] += 1
        if st == "other":
            other[frames[0]] = other.get(frames[0], 0) + 1
        frames.clear()

    for raw in r.stdout.splitlines():
        line = raw.strip()
        if not line:
            flush()
            continue
        if not raw[0].isspace():  # a sample's header: "comm tid"
            flush()
            comm = line.rsplit(None, 1)[0] if " " in line else line
            threads[comm] = threads.get(comm, 0) + 1
            continue
        parts = line.split(None, 1)
        sym = parts[1] if len(parts) > 1 else "[unknown]"
        sym = re.sub(r"\+0x[0-9a-f]+$", "", sym)
        frames.append(sym)
    flush()
    return (counts, sorted(other.items(), key=lambda kv: -kv[1])[:8],
            sorted(threads.items(), key=lambda kv: -kv[1])[:6])


def callgrind_total(path: Path) -> float | None:
    try:
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("summary:") or line.startswith("totals:"):
                return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


class Runner:
    def __init__(self, args, lab: Lab, src: Path, small: tuple[Path, Path] | None):
        self.args = args
        self.lab = lab
        self.src = src
        self.small_src, self.small2_src = small or (None, None)
        self.work = args.workdir
        self.port = 21000
        self.seq = 0
        self.logs = args.workdir / f"logs-{os.getpid()}"

    def wrap(self, argv: list[str], side: str, d: Path, mode: str) -> list[str]:
        timed = ["/usr/bin/time", "-o", str(d / f"{side}.time"), "-f", TIME_FMT] + argv
        if mode == "measure":
            return timed
        if mode == "stat":
            return ["perf", "stat", "-x,", "-o", str(d / f"{side}.stat"), "-e", ",".join(EVENTS), "--"] + timed
        if mode == "profile":
            return ["perf", "record", "-q", "-g", "-F", str(self.args.profile_freq), "-o",
                    str(d / f"{side}.data"), "--"] + timed
        return ["/usr/bin/time", "-o", str(d / f"{side}.time"), "-f", TIME_FMT, "valgrind", "-q",
                "--tool=callgrind", f"--callgrind-out-file={d / f'{side}.cg'}"] + argv

    def run(self, job: Job, repeat: int, mode: str) -> Run:
        res = Run(job, repeat, mode)
        p = self.lab.get(job.path)
        src = {"callgrind": self.small_src, "callgrind2": self.small2_src}.get(mode, self.src)
        res.size = src.stat().st_size
        self.port = 21000 + (self.port - 20999) % 4000
        port = self.port
        self.seq += 1
        d = self.logs / f"{self.seq:04d}-{mode}-{job.path}-{job.label}-{job.rate}"
        d.mkdir(parents=True, exist_ok=True)
        out = self.work / "out"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        snd, rcv = job.sides(p, port, src, out, str(self.args.tcphash_bin))
        cg = mode.startswith("callgrind")
        timeout = job.timeout(res.size, slow=30 if cg else 1)
        if not cg and self.args.warm:
            warm_memory(min(2 * res.size, 4 << 30))
        if self.args.wait_quiet > 0:
            res.load_before = wait_quiet(self.args.wait_quiet)
        recv = send = None
        try:
            recv = Proc(self.wrap(rcv, "recv", d, mode), "recv", d, ns=p.recv_ns, timed=False)
            if not recv.wait_listening(port, "tcp", timeout=60 if cg else 15):
                res.note = "receiver never listened: " + recv.stderr()[-300:].strip()
                return res
            b0, t0j, st0 = cpu_jiffies()
            t0 = time.monotonic()
            send = Proc(self.wrap(snd, "send", d, mode), "send", d, ns=p.send_ns, timed=False)
            rc_s = send.wait(timeout)
            rc_r = recv.wait(max(5.0, timeout - (time.monotonic() - t0)))
            wall = time.monotonic() - t0
            b1, t1j, st1 = cpu_jiffies()
            if rc_s is None or rc_r is None:
                res.note = f"timeout after {timeout:.0f} s (sender rc {rc_s}, receiver rc {rc_r})"
                return res
            if rc_s != 0 or rc_r != 0:
                res.note = (f"sender rc {rc_s}, receiver rc {rc_r}: "
                            + (send.stderr()[-200:] + " | " + recv.stderr()[-200:]).strip())
                return res
            got = out / src.name
            if not got.exists() or got.stat().st_size != res.size:
                res.note = f"received file missing or of the wrong size ({got})"
                return res
            hz = os.sysconf("SC_CLK_TCK") or 100
            res.steal_s = (st1 - st0) / hz
            res.machine_busy_s = (b1 - b0) / hz - res.steal_s
            res.wall = wall
            res.goodput = res.size * 8 / wall / 1e6
            for side in ("send", "recv"):
                t = parse_time(d / f"{side}.time")
                if t:
                    res.cpu[side] = t
                if mode == "stat":
                    res.counts[side] = parse_stat(d / f"{side}.stat")
                elif mode == "profile":
                    res.stages[side], res.other_syms[side], res.threads[side] = profile_split(
                        d / f"{side}.data", side[0])
                elif cg:
                    total = sum(filter(None, (callgrind_total(f) for f in d.glob(f"{side}.cg*"))))
                    res.instr[side] = total or None
            res.ok = True
            return res
        finally:
            for pr in (send, recv):
                if pr is not None:
                    pr.stop(grace=2.0)
                    pr.close()
            shutil.rmtree(out, ignore_errors=True)
            if res.ok and not self.args.keep_logs:
                shutil.rmtree(d, ignore_errors=True)


def wait_quiet(max_wait: float, threshold: float = 0.5) -> float:
    """Wait (bounded) until fewer than ``threshold`` CPUs are busy; the busy CPUs seen last."""
    end = time.monotonic() + max_wait
    while True:
        b0, t0, _ = cpu_jiffies()
        time.sleep(0.5)
        b1, t1, _ = cpu_jiffies()
        busy = (b1 - b0) / max(1, t1 - t0) * (os.cpu_count() or 1)
        if busy <= threshold or time.monotonic() >= end:
            return busy


# -- output ---------------------------------------------------------------------------------

CSV_FIELDS = ["timestamp", "mode", "path", "mtu", "tool", "rate", "encrypted", "send_bin", "recv_bin",
              "size", "repeat", "ok", "wall_s", "goodput_mbps", "send_user_s", "send_sys_s", "recv_user_s",
              "recv_sys_s", "send_cpu_per_gib", "recv_cpu_per_gib", "machine_cpu_per_gib",
              "machine_excess_cpu_per_gib", "steal_s", "load_before"] + [f"{side}_{c}_per_gib" for side in ("send", "recv")
                                for c in [n for n, _ in SYSCALL_COLUMNS]] \
    + [f"{side}_{s}_share" for side in ("send", "recv") for s in STAGE_NAMES] \
    + ["send_instr_per_gib", "recv_instr_per_gib", "note"]


def per_gib(x, size):
    return None if x is None else x * GIB / size


def machine_excess(r: Run):
    """The machine's busy CPU-s per GiB less what was busy just before the run (others' work,
    measured over half a second by --wait-quiet, assumed to go on at that rate)."""
    if not r.ok or r.machine_busy_s is None or r.load_before is None:
        return None
    return per_gib(max(0.0, r.machine_busy_s - r.load_before * r.wall), r.size)


def cpu_side(r: Run, side: str):
    t = r.cpu.get(side)
    return None if t is None else (t[0] + t[1]) * GIB / r.size


def sys_col(r: Run, side: str, names: list[str]):
    c = r.counts.get(side)
    if not c:
        return None
    return sum(c.get(n, 0) for n in names) * GIB / r.size


def csv_row(r: Run, path_mtu: int) -> dict:
    j = r.job
    row = {
        "timestamp": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "mode": r.mode, "path": j.path, "mtu": path_mtu, "tool": j.label, "rate": j.rate,
        "encrypted": "" if not j.variant else int(j.variant.encrypt),
        "send_bin": j.variant.send_bin if j.variant else "", "recv_bin": j.variant.recv_bin if j.variant else "",
        "size": r.size, "repeat": r.repeat, "ok": int(r.ok), "wall_s": r.wall, "goodput_mbps": r.goodput,
        "send_user_s": r.cpu.get("send", (None, None))[0], "send_sys_s": r.cpu.get("send", (None, None))[1],
        "recv_user_s": r.cpu.get("recv", (None, None))[0], "recv_sys_s": r.cpu.get("recv", (None, None))[1],
        "send_cpu_per_gib": cpu_side(r, "send"), "recv_cpu_per_gib": cpu_side(r, "recv"),
        "machine_cpu_per_gib": per_gib(r.machine_busy_s, r.size) if r.ok else None,
        "machine_excess_cpu_per_gib": machine_excess(r),
        "steal_s": r.steal_s, "load_before": r.load_before, "note": r.note,
    }
    for side in ("send", "recv"):
        for n, names in SYSCALL_COLUMNS:
            row[f"{side}_{n}_per_gib"] = sys_col(r, side, names)
        st = r.stages.get(side)
        tot = sum(st.values()) if st else 0
        for s in STAGE_NAMES:
            row[f"{side}_{s}_share"] = st[s] / tot if tot else None
        row[f"{side}_instr_per_gib"] = per_gib(r.instr.get(side), r.size)
    return {k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in row.items()}


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, spec=".2f"):
    return "–" if x is None else format(x, spec)


def print_tables(runs: list[Run], jobs: list[Job], args):
    keys = []
    for j in jobs:
        if j.key not in keys:
            keys.append(j.key)
    meas = [r for r in runs if r.mode == "measure"]
    print(f"\n### Cost per GiB ({human_size(args.size)} file on /dev/shm; medians of ok runs; CPU-s per GiB)\n")
    print("| path | tool | rate | runs ok | goodput Mbit/s | sender user+sys | receiver user+sys "
          "| machine (minus idle) | machine less load before | steal s | load before (CPUs) |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for k in keys:
        rs = [r for r in meas if r.job.key == k and r.ok]
        n = len([r for r in meas if r.job.key == k])
        if not n:
            continue

        def ud(side):
            u = med([r.cpu[side][0] * GIB / r.size for r in rs if side in r.cpu])
            s = med([r.cpu[side][1] * GIB / r.size for r in rs if side in r.cpu])
            t = med([cpu_side(r, side) for r in rs])
            return f"{fmt(t)} ({fmt(u)}+{fmt(s)})"

        print(f"| {k[0]} | {k[1]} | {k[2]} | {len(rs)}/{n} | {fmt(med([r.goodput for r in rs]), ',.0f')} "
              f"| {ud('send')} | {ud('recv')} | {fmt(med([per_gib(r.machine_busy_s, r.size) for r in rs]))} "
              f"| {fmt(med([machine_excess(r) for r in rs]))} "
              f"| {fmt(med([r.steal_s for r in rs]))} | {fmt(med([r.load_before for r in rs]))} |")
    stat = [r for r in runs if r.mode == "stat"]
    if any(r.counts for r in stat):
        cols = [n for n, _ in SYSCALL_COLUMNS]
        print(f"\n### System calls and context switches per GiB (perf stat runs, medians of "
              f"{args.stat_repeat}; sender / receiver)\n")
        print("| path | tool | rate | " + " | ".join(cols) + " |")
        print("|---|---|---|" + "---:|" * len(cols))
        for k in keys:
            rs = [r for r in stat if r.job.key == k and r.ok and r.counts]
            if not rs:
                continue
            cells = []
            for n, names in SYSCALL_COLUMNS:
                s = med([sys_col(r, "send", names) for r in rs])
                v = med([sys_col(r, "recv", names) for r in rs])
                cells.append(f"{fmt(s, ',.0f')} / {fmt(v, ',.0f')}")
            print(f"| {k[0]} | {k[1]} | {k[2]} | " + " | ".join(cells) + " |")
    prof = [r for r in runs if r.mode == "profile" and r.ok]
    if prof:
        print("\n### Profile split by stage (perf record -g, share of each side's samples, %)\n")
        print("| path | tool | rate | side | samples | " + " | ".join(STAGE_NAMES) + " |")
        print("|---|---|---|---|---:|" + "---:|" * len(STAGE_NAMES))
        for r in prof:
            for side in ("send", "recv"):
                st = r.stages.get(side) or {}
                tot = sum(st.values())
                if not tot:
                    continue
                cells = [f"{100 * st[s] / tot:.1f}" for s in STAGE_NAMES]
                print(f"| {r.job.path} | {r.job.label} | {r.job.rate} | {side} | {tot} | " + " | ".join(cells) + " |")
        print("\n### The same in CPU-s/GiB (each share x the side's median CPU-s/GiB of the measured runs)\n")
        print("| path | tool | rate | side | CPU-s/GiB | " + " | ".join(STAGE_NAMES) + " |")
        print("|---|---|---|---|---:|" + "---:|" * len(STAGE_NAMES))
        for r in prof:
            for side in ("send", "recv"):
                st = r.stages.get(side) or {}
                tot = sum(st.values())
                cpu = med([cpu_side(x, side) for x in meas if x.ok and x.job.key == r.job.key])
                if not tot or cpu is None:
                    continue
                cells = [f"{cpu * st[s] / tot:.2f}" for s in STAGE_NAMES]
                print(f"| {r.job.path} | {r.job.label} | {r.job.rate} | {side} | {cpu:.2f} | " + " | ".join(cells) + " |")
        print("\nMost frequent leaf symbols of 'other' samples:\n")
        for r in prof:
            for side in ("send", "recv"):
                tot = sum((r.stages.get(side) or {}).values()) or 1
                syms = ", ".join(f"{s[:60]} {100 * c / tot:.1f}%" for s, c in r.other_syms.get(side, [])[:6])
                print(f"- {r.job.path} {r.job.label} {r.job.rate} {side}: {syms or '–'}")
        print("\nBusiest threads (share of the side's samples, and CPU-s/GiB at the side's median; "
              "1 / that is the most one such thread can move, in GiB/s):\n")
        for r in prof:
            for side in ("send", "recv"):
                tot = sum((r.stages.get(side) or {}).values()) or 1
                cpu = med([cpu_side(x, side) for x in meas if x.ok and x.job.key == r.job.key])
                ths = ", ".join(f"{t} {100 * c / tot:.0f}%" + (f" ({cpu * c / tot:.2f})" if cpu else "")
                                for t, c in r.threads.get(side, [])[:4])
                print(f"- {r.job.path} {r.job.label} {r.job.rate} {side}: {ths or '–'}")
    cg = [r for r in runs if r.mode == "callgrind" and r.ok]
    if cg:
        small = human_size(args.callgrind_size)
        print(f"\n### Instructions, user space (callgrind; files of {small} and twice that)\n")
        print("Per GiB = the difference between the two runs, scaled to a GiB (what each further byte "
              "costs); fixed = the rest (start, handshake, tables, end).\n")
        print("| path | tool | rate | sender per GiB | receiver per GiB | sender fixed | receiver fixed "
              f"| sender per GiB at {small} alone | receiver same |")
        print("|---|---|---|---:|---:|---:|---:|---:|---:|")
        for r in cg:
            r2 = next((x for x in runs if x.mode == "callgrind2" and x.ok and x.job is r.job), None)
            cells = []
            for side in ("send", "recv"):
                m, f = marginal(r, r2, side)
                cells.append((m, f))
            alone = [per_gib(r.instr.get(x), r.size) for x in ("send", "recv")]
            print(f"| {r.job.path} | {r.job.label} | {r.job.rate} | {gi(cells[0][0])} | {gi(cells[1][0])} "
                  f"| {gi(cells[0][1])} | {gi(cells[1][1])} | {gi(alone[0])} | {gi(alone[1])} |")
    bad = [r for r in runs if not r.ok]
    if bad:
        print("\nFailed runs:\n")
        for r in bad:
            print(f"- {r.mode} {r.job.path} {r.job.label} {r.job.rate} repeat {r.repeat}: {r.note}")


def marginal(r1: Run, r2: Run | None, side: str):
    """(instructions per GiB from the difference of two sizes, fixed instructions) or Nones."""
    a = r1.instr.get(side)
    b = r2.instr.get(side) if r2 else None
    if a is None or b is None or r2.size == r1.size:
        return None, None
    per_byte = (b - a) / (r2.size - r1.size)
    return per_byte * GIB, a - per_byte * r1.size


def gi(x):
    return "–" if x is None else f"{x / 1e9:.2f} G"


def human_size(n: int) -> str:
    for u, m in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= m and n % m == 0:
            return f"{n // m} {u}"
    return f"{n} B"


# -- main -----------------------------------------------------------------------------------

def parse_variant(spec: str) -> Variant:
    name, _, rest = spec.partition("=")
    parts = [x for x in rest.split(",") if x]
    enc = True
    if parts and parts[-1] == "no-encryption":
        enc = False
        parts = parts[:-1]
    if not name or len(parts) != 2:
        raise argparse.ArgumentTypeError(f"expected NAME=SENDBIN,RECVBIN[,no-encryption], got {spec!r}")
    for b in parts:
        if not os.access(b, os.X_OK):
            raise argparse.ArgumentTypeError(f"{b} is not an executable")
    return Variant(name, str(Path(parts[0]).resolve()), str(Path(parts[1]).resolve()), enc)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--paths", default="veth,loopback",
                    help="comma list of loopback, veth (MTU --mtu), veth9000, veth<MTU> (default veth,loopback)")
    ap.add_argument("--mtu", type=int, default=1500, help="MTU of the plain 'veth' path (default 1500)")
    ap.add_argument("--rates", default="100M,400M,1G,auto",
                    help="hurtle: --rate-fixed R, or auto; TCP: SO_MAX_PACING_RATE R, or unpaced "
                         "(default 100M,400M,1G,auto)")
    ap.add_argument("--tools", default="hurtle,tcp,tcp-b3",
                    help="comma list of hurtle, tcp (tcphash --no-hash), tcp-b3 (tcphash: TCP + BLAKE3), "
                         "tcp-sendfile (tcpcopy.py), each at every rate (default hurtle,tcp,tcp-b3)")
    ap.add_argument("--size", type=parse_size, default=GIB, help="file size (default 1G)")
    ap.add_argument("--repeat", type=int, default=5, help="runs of each configuration, interleaved (default 5)")
    ap.add_argument("--send-bin", type=Path, default=REPO / "target/release/hurtle")
    ap.add_argument("--recv-bin", type=Path, default=REPO / "target/release/hurtle")
    ap.add_argument("--variant", action="append", type=parse_variant, default=[],
                    metavar="NAME=SENDBIN,RECVBIN[,no-encryption]", help="a hurtle variant (repeatable)")
    ap.add_argument("--no-encryption", action="store_true",
                    help="also run every hurtle variant with --no-encryption on both ends (NAME-noenc)")
    ap.add_argument("--tcphash-bin", type=Path, default=REPO / "target/release/tcphash",
                    help="the tcp and tcp-b3 binary (cargo build --release -p tcphash)")
    ap.add_argument("--profile", action="store_true", help="also one perf record -g run per configuration")
    ap.add_argument("--profile-freq", type=int, default=1999, help="perf record -F (default 1999)")
    ap.add_argument("--callgrind", action="store_true",
                    help="also one run per configuration under valgrind --tool=callgrind")
    ap.add_argument("--callgrind-size", type=parse_size, default=32 << 20, help="its file size (default 32M)")
    ap.add_argument("--no-syscalls", action="store_true", help="no perf stat runs (system call counts)")
    ap.add_argument("--stat-repeat", type=int, default=1,
                    help="runs per configuration under perf stat, for the system call counts, after the "
                         "measured runs (default 1; the tracepoints cost CPU, so these runs' CPU is not in "
                         "the cost table)")
    ap.add_argument("--workdir", type=Path, default=Path("/dev/shm/hurtle-cost"),
                    help="source file, received files, logs (default /dev/shm/hurtle-cost)")
    ap.add_argument("--no-warm", dest="warm", action="store_false",
                    help="do not write and free twice the file in /dev/shm before each run (see run.py)")
    ap.add_argument("--wait-quiet", type=float, default=10.0,
                    help="before each run wait up to S s for fewer than half a CPU busy (default 10; 0 = off)")
    ap.add_argument("--csv", type=Path, help="CSV of every run (default bench/results/cost-<UTC time>.csv)")
    ap.add_argument("--keep-logs", action="store_true", help="keep each run's logs (failed runs' are always kept)")
    ap.add_argument("--cleanup", action="store_true", help="remove what a SIGKILLed run left, and exit")
    args = ap.parse_args()

    if os.geteuid() != 0:
        sys.exit("cost.py needs root (network namespaces)")
    recover_stale(args.workdir / "state.json", NS_RE)
    if args.cleanup:
        return
    if not 1 <= args.repeat <= 50 or not 1 <= args.stat_repeat <= 50:
        sys.exit("--repeat and --stat-repeat must be 1 to 50")
    paths = [p for p in args.paths.split(",") if p]
    tools = [t for t in args.tools.split(",") if t]
    for t in tools:
        if t not in ("hurtle", "tcp", "tcp-b3", "tcp-sendfile"):
            sys.exit(f"unknown tool {t!r} (hurtle, tcp, tcp-b3, tcp-sendfile)")
    rates = [r for r in args.rates.split(",") if r]
    for r in rates:
        if r != "auto":
            parse_rate(r)
    for p in paths:
        if p != "loopback" and not re.fullmatch(r"veth\d*", p):
            sys.exit(f"unknown path {p!r} (loopback, veth, veth9000, veth<MTU>)")
    paths = [f"veth{args.mtu}" if p == "veth" else p for p in paths]
    variants = args.variant or []
    if "hurtle" in tools and not variants:
        for b in (args.send_bin, args.recv_bin):
            if not os.access(b, os.X_OK):
                sys.exit(f"{b} is not an executable (cargo build --release -p hurtle, or --send-bin/--recv-bin)")
        variants = [Variant("hurtle", str(args.send_bin.resolve()), str(args.recv_bin.resolve()))]
    if args.no_encryption:
        variants = variants + [Variant(v.name + "-noenc", v.send_bin, v.recv_bin, False)
                               for v in variants if v.encrypt]
    if {"tcp", "tcp-b3"} & set(tools) and not os.access(args.tcphash_bin, os.X_OK):
        sys.exit(f"{args.tcphash_bin} missing: cargo build --release -p tcphash, or --tcphash-bin")
    for tool in ("perf",) + (("valgrind",) if args.callgrind else ()):
        if not shutil.which(tool):
            sys.exit(f"{tool} not installed")

    jobs: list[Job] = []
    for p in paths:
        if "hurtle" in tools:
            for v in variants:
                for r in rates:
                    jobs.append(Job("hurtle", p, r, v))
        for t in ("tcp", "tcp-b3", "tcp-sendfile"):
            if t in tools:
                for r in rates:
                    jobs.append(Job(t, p, r))
    if not jobs:
        sys.exit("nothing to run")

    install_signal_handlers()
    args.workdir.mkdir(parents=True, exist_ok=True)
    csv_path = args.csv or BENCH / "results" / f"cost-{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%SZ}.csv"
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    new = not csv_path.exists()
    runs: list[Run] = []
    lab = Lab(f"hc{os.getpid()}")
    mtus = {}
    try:
        src = source_file(args.size, args.workdir)
        small = None
        if args.callgrind:
            small = (source_file(args.callgrind_size, args.workdir),
                     source_file(2 * args.callgrind_size, args.workdir))
        runner = Runner(args, lab, src, small)
        with open(csv_path, "a", newline="") as fcsv:
            w = csv.DictWriter(fcsv, fieldnames=CSV_FIELDS)
            if new:
                w.writeheader()

            def do(job, rep, mode):
                mtus[job.path] = lab.get(job.path).mtu
                r = runner.run(job, rep, mode)
                runs.append(r)
                w.writerow(csv_row(r, mtus[job.path]))
                fcsv.flush()
                desc = f"{mode} {job.path} {job.label} {job.rate} #{rep + 1}"
                if r.ok:
                    extra = ""
                    if r.instr:
                        extra = " instr/GiB s {:.2f}G r {:.2f}G".format(
                            *((per_gib(r.instr.get(x), r.size) or 0) / 1e9 for x in ("send", "recv")))
                    log(f"{desc}: {r.goodput:,.0f} Mbit/s, CPU-s/GiB sender {fmt(cpu_side(r, 'send'))} "
                        f"receiver {fmt(cpu_side(r, 'recv'))} machine {fmt(per_gib(r.machine_busy_s, r.size))}, "
                        f"steal {r.steal_s:.2f} s{extra}")
                else:
                    log(f"{desc}: FAILED: {r.note}")

            for rep in range(args.repeat):
                k = rep % len(jobs)
                for job in jobs[k:] + jobs[:k]:
                    do(job, rep, "measure")
            if not args.no_syscalls:
                for rep in range(args.stat_repeat):
                    for job in jobs:
                        do(job, rep, "stat")
            if args.profile:
                for job in jobs:
                    do(job, 0, "profile")
            if args.callgrind:
                for job in jobs:
                    do(job, 0, "callgrind")
                    do(job, 0, "callgrind2")
    except Interrupted as e:
        log(f"interrupted ({e}); cleaning up")
    finally:
        REG.cleanup()
        print_tables(runs, jobs, args)
        bufs = "/".join(Path(f"/proc/sys/net/core/{k}").read_text().strip() for k in ("rmem_max", "wmem_max"))
        print(f"\nCSV: {csv_path}; load average {os.getloadavg()[0]:.2f} at the end; "
              f"net.core.rmem_max/wmem_max {bufs}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_tcp-send-paced":
        sys.exit(tcp_send_paced(sys.argv[2:]))
    main()
