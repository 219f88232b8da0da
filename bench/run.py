#!/usr/bin/env python3
"""hurtle benchmark harness: runs hurtle and baseline transfer tools side by
side over emulated long/fat/lossy paths and appends one CSV row per run to
bench/results/results.csv. See bench/README.md.

Examples:
    sudo bench/run.py --quick
    sudo bench/run.py --profiles continental,satellite --tools tcp,hurtle --size 1G --repeat 3
    sudo bench/run.py --profiles continental --sweep channels
    sudo bench/run.py --measure-ceiling
    sudo bench/run.py --cleanup          # undo leftovers of a killed run
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
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))

from hbench import netlab, tools  # noqa: E402
from hbench.sysutil import (REG, Interrupted, Proc, cargo_build, ensure_packages, install_signal_handlers,  # noqa: E402
                            log, recover_stale, sh)

RESULTS = BENCH / "results"
CSV_PATH = RESULTS / "results.csv"
CEILING_PATH = RESULTS / "ceiling.json"
STATE_PATH = RESULTS / "tmp" / "sysctl-state.json"
NS_RE = r"^hb(\d+)-"

CSV_FIELDS = [
    "timestamp", "tool", "settings", "profile", "file_size", "wall_s", "goodput_mbps",
    "cpu_s_sender", "cpu_s_receiver", "peak_rss_kb_sender", "peak_rss_kb_receiver",
    "resent_share", "socket_drops", "ok", "note",
    "run_id", "repeat", "path", "emu_ceiling_mbps", "emu_pre_drops", "machine",
]

PACKAGES = [
    "iproute2", "nftables", "time", "iperf3", "openssh-server", "openssh-client", "rsync",
    "uftp", "globus-gass-copy-progs", "globus-gridftp-server-progs", "libglobus-xio-udt-driver",
    "python3-matplotlib", "iputils-ping",
]

QUICK_PROFILES = ["loopback", "continental", "intercontinental"]
QUICK_TOOLS = ["tcp", "iperf3", "scp", "rsync", "gridftp-p4", "uftp-fixed", "hurtle-default"]
FULL_TOOLS = ["tcp", "iperf3", "iperf3-p4", "scp", "rsync", "gridftp", "gridftp-udt", "uftp", "hurtle"]


# -- setup -------------------------------------------------------------------

def parse_size(s: str) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgG]?)(i?[bB])?", s.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {s!r}")
    mul = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[m.group(2).lower()]
    return int(float(m.group(1)) * mul)


def human(n: int) -> str:
    for u, m in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= m and n % m == 0:
            return f"{n // m}{u}"
    return str(n)


def source_file(size: int, d: Path) -> Path:
    """A random (incompressible) file of ``size`` bytes in ``d``, made once and kept."""
    d.mkdir(parents=True, exist_ok=True)
    p = d / f"src-{human(size)}.bin"
    if p.exists() and p.stat().st_size == size:
        return p
    log(f"creating {p} ({size} bytes of random data)")
    tmp = p.with_suffix(".part")
    with open(tmp, "wb") as f:
        left = size
        while left:
            n = min(left, 8 << 20)
            f.write(os.urandom(n))
            left -= n
    tmp.rename(p)
    os.chmod(p, 0o644)
    return p


def cpu_name() -> str:
    """The CPU as /proc/cpuinfo names it, with its family and model and the widest SIMD it has
    (BLAKE3, which both hurtle and tcp-b3 run on every byte, is about twice as fast with AVX-512
    as with AVX2). A VM's host can change from one day to the next behind the same model name
    ("AMD EPYC" has been an AVX2 part and a family-26 AVX-512 one), so rows from different
    machines are told apart here."""
    fields: dict[str, str] = {}
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if not line.strip():
            break  # the first processor is enough
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    flags = set(fields.get("flags", "").split())
    simd = next((label for flag, label in (("avx512f", "avx512"), ("avx2", "avx2"),
                                            ("sse4_1", "sse4.1")) if flag in flags), "no-simd")
    return (f"{fields.get('model name', '?')} (family {fields.get('cpu family', '?')} "
            f"model {fields.get('model', '?')}, {simd})")


def machine_info(ceiling: dict | None, sock_buf: int, tcp_cc: str | None) -> dict:
    cpu = cpu_name()
    mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
    cc = Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()
    info = {
        "cores": os.cpu_count(),
        "cpu": cpu,
        "memory_gib": round(mem_kb / (1 << 20), 1),
        "kernel": platform.release(),
        "os": _os_release(),
        "tcp_congestion_control": tcp_cc or f"{cc} (kernel default)",
        "socket_buffer_max_during_runs": sock_buf,
    }
    if ceiling:
        info["emulator_ceiling"] = ceiling
    return info


def _os_release():
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    return ""


def write_machine_txt(info: dict):
    lines = [
        f"date: {dt.datetime.now(dt.timezone.utc).isoformat(timespec='seconds')}",
        f"cores: {info['cores']}",
        f"cpu: {info['cpu']}",
        f"memory: {info['memory_gib']} GiB",
        f"kernel: {info['kernel']}",
        f"os: {info['os']}",
        f"tcp congestion control: {info['tcp_congestion_control']}",
        f"net.core.rmem_max/wmem_max during runs: {info['socket_buffer_max_during_runs']}",
    ]
    c = info.get("emulator_ceiling")
    if c:
        lines += [
            "emulator ceiling (linkem, no impairment, 1500 MTU, measured "
            f"{c.get('date', '?')} with iperf3; see bench/README.md):",
            f"  TCP 1 stream: {c['tcp1_mbps']:.0f} Mbit/s goodput ({c['tcp1_pps']:.0f} packets/s through linkem)",
            f"  TCP 4 streams: {c['tcp4_mbps']:.0f} Mbit/s goodput",
            f"  UDP flood (1400 B): linkem forwarded {c['udp_linkem_mbps']:.0f} Mbit/s = "
            f"{c['udp_linkem_pps']:.0f} packets/s (offered {c['udp_offered_mbps']:.0f}, "
            f"receiver got {c['udp_recv_mbps']:.0f})",
            f"  ceiling used for flagging (min of TCP and UDP): {c['ceiling_mbps']:.0f} Mbit/s "
            "(rows above 80% of it are flagged NEAR-EMU-CEILING, above it invalid)",
        ]
    (RESULTS / "machine.txt").write_text("\n".join(lines) + "\n")


def machine_short(info: dict) -> str:
    c = info.get("emulator_ceiling", {})
    return (f"{info['cores']}c {info['cpu'][:60]} {info['memory_gib']}GiB linux-{info['kernel']} "
            f"cc={info['tcp_congestion_control'].split()[0]} "
            f"emu-ceiling={c.get('ceiling_mbps', 0):.0f}Mbps")


# -- ceiling -----------------------------------------------------------------

def measure_ceiling(lab: netlab.Lab, work: Path) -> dict:
    """iperf3 through linkem with no impairment: TCP 1 and 4 streams, and a
    UDP flood counted at linkem's output."""
    lab.build_emu()
    ends = lab.ends(netlab.PROFILES["lan"])
    clean = netlab.Profile("ceiling", "emu", "no impairment", rtt_ms=0, rate_mbps=None, queue="4M")
    res = {"date": dt.date.today().isoformat(), "rt_priority": lab.rt_priority}
    port = 46000
    for name, extra in (("tcp1", []), ("tcp4", ["-P", "4"]), ("udp", ["-u", "-b", "0", "-l", "1400"])):
        d = work / f"ceiling-{name}"
        lab.start_linkem(clean, 1, d)
        srv = Proc(["iperf3", "-s", "-1", "-p", str(port), "-B", ends.recv_addr], "srv", d, ns=ends.recv_ns)
        srv.wait_listening(port, timeout=10)
        cli = Proc(["iperf3", "-c", ends.recv_addr, "-p", str(port), "-t", "8", "-J"] + extra, "cli", d,
                   ns=ends.send_ns)
        cli.wait(40)
        srv.wait(10)
        st = lab.stop_linkem().get("a2b", {})
        srv.stop()
        cli.stop()
        j = json.loads(cli.stdout())
        dur = j["end"]["sum_sent"]["seconds"] if "sum_sent" in j["end"] else 8.0
        if name.startswith("tcp"):
            res[f"{name}_mbps"] = j["end"]["sum_received"]["bits_per_second"] / 1e6
            res[f"{name}_pps"] = st.get("out", 0) / dur
        else:
            s = j["end"]["sum"]
            res["udp_offered_mbps"] = s["bytes"] * 8 / s["seconds"] / 1e6 if s.get("seconds") else 0
            res["udp_linkem_pps"] = st.get("out", 0) / dur
            res["udp_linkem_mbps"] = st.get("bytes_out", 0) * 8 / dur / 1e6
            res["udp_recv_mbps"] = s["bits_per_second"] * (1 - s.get("lost_percent", 0) / 100) / 1e6
        port += 1
        log(f"ceiling {name}: {json.dumps({k: v for k, v in res.items() if k.startswith(name[:3])})}")
    # Flag against the lower of the TCP and UDP figures: UDP tools (hurtle,
    # uftp) cost linkem one read+write per datagram with no GSO help.
    res["ceiling_mbps"] = min(max(res["tcp1_mbps"], res["tcp4_mbps"]), res["udp_linkem_mbps"])
    CEILING_PATH.write_text(json.dumps(res, indent=1) + "\n")
    return res


# -- main loop ---------------------------------------------------------------

def cpu_jiffies():
    """(busy, total, steal) jiffies over all CPUs from /proc/stat. Steal is time the
    hypervisor ran something else while this VM wanted the CPU; it counts as busy."""
    f = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = f[3] + (f[4] if len(f) > 4 else 0)
    return sum(f) - idle, sum(f), (f[7] if len(f) > 7 else 0)


def foreign_load() -> float:
    """CPUs' worth of busy time over the last second, for the 'wait for a
    quiet machine' check (other people's builds share the cores)."""
    b0, t0, _ = cpu_jiffies()
    time.sleep(1.0)
    b1, t1, _ = cpu_jiffies()
    return (b1 - b0) / max(1, t1 - t0) * (os.cpu_count() or 1)


def wait_quiet(max_wait: float, threshold=0.5):
    """Wait (bounded) until less than ``threshold`` CPUs are busy."""
    end = time.monotonic() + max_wait
    busy = foreign_load()
    while busy > threshold and time.monotonic() < end:
        time.sleep(2)
        busy = foreign_load()
    return busy


def warm_memory(nbytes: int):
    """Touch ``nbytes`` of fresh pages and free them again, right before a run.

    This VM's balloon driver reports free memory to the host ("Free page reporting enabled"
    in dmesg), which takes it back; the next guest to touch such a page waits for the host
    to fault it in. A run that writes 1 GiB into tmpfs then pays for it in whichever copy
    first touches the pages: hurtle's receiver spent 171 to 1418 perf samples (at 2 kHz) in
    the kernel's copy into tmpfs for the same 1 GiB over 11 runs (0.99 to 1.92 s). Pages freed
    just now are not reported yet (the driver waits a couple of seconds), so the run that
    follows gets pages the host still backs: 212-219 samples in four warmed runs.
    """
    if nbytes <= 0:
        return
    path = Path("/dev/shm") / f"hbench-warm-{os.getpid()}"
    chunk = b"\0" * (1 << 20)
    try:
        with open(path, "wb") as f:
            for _ in range(nbytes >> 20):
                f.write(chunk)
    finally:
        path.unlink(missing_ok=True)


def append_row(row: dict):
    new = not CSV_PATH.exists()
    CSV_PATH.parent.mkdir(parents=True, exist_ok=True)
    with open(CSV_PATH, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        if new:
            w.writeheader()
        w.writerow({k: row.get(k, "") for k in CSV_FIELDS})


def fmt(v, nd=3):
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return v


def main():
    global CSV_PATH
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--quick", action="store_true",
                    help=f"profiles {','.join(QUICK_PROFILES)}, tools {','.join(QUICK_TOOLS)}, 64M, repeat 3")
    ap.add_argument("--profiles", help="comma list; one of: " + ",".join(netlab.PROFILES) + " or 'all'")
    ap.add_argument("--tools", help="comma list of: tcp,tcp-bbr,tcp-cubic (16 MiB at most),tcp-b3,iperf3,"
                    "iperf3-p4,scp,rsync,hurtle-cp (over the scp sshd),gridftp (p=1,4,8),gridftp-p4,gridftp-udt,uftp (tfmcc+fixed),uftp-fixed,"
                    "hurtle (default+channels=4),hurtle-default,hurtle-base (--hurtle-base PATH),hurtle-warm (after an untimed 128 MiB transfer),hurtle-oracle (--rate-fixed at bottleneck x (1-loss))")
    ap.add_argument("--size", type=parse_size, help="file size (e.g. 64M, 1G); default 64M quick, 1G otherwise")
    ap.add_argument("--repeat", type=int, help="runs per tool and profile (default 3)")
    ap.add_argument("--sweep", choices=["channels", "payload", "tcpgrid", "gridftp"],
                    help="instead of --tools: hurtle --channels 1..16; hurtle --payload sizes; hurtle "
                    "--transport tcp connections x --chunk-size (heat map); globus-url-copy -p x -bs")
    ap.add_argument("--timeout", type=float, help="per-run timeout, s (default 30 + size at 20 Mbit/s, max 900)")
    ap.add_argument("--sock-buf", type=parse_size, default=32 << 20,
                    help="raise net.core.rmem_max/wmem_max to this for the run (restored after; 0 = leave)")
    ap.add_argument("--tcp-cc", help="set TCP congestion control in the endpoint namespaces (default: kernel's)")
    ap.add_argument("--rt-priority", type=int, default=20, help="linkem SCHED_FIFO priority (0 = off)")
    ap.add_argument("--linkem-slack", default=netlab.LINKEM_SLACK,
                    help="linkem --slack: release packets due this soon after a due one with it "
                    "(0 = each at its own time: a wake-up per packet)")
    ap.add_argument("--linkem-gso", action=argparse.BooleanOptionalAction, default=netlab.LINKEM_GSO,
                    help="linkem --gso: write packets of one flow released together as one GSO write")
    ap.add_argument("--no-build", action="store_true", help="don't cargo build linkem/hurtle")
    ap.add_argument("--no-install", action="store_true", help="don't apt-get install missing packages")
    ap.add_argument("--measure-ceiling", action="store_true", help="(re)measure linkem's ceiling and exit")
    ap.add_argument("--keep-logs", action="store_true", help="keep per-run logs of successful runs too")
    ap.add_argument("--wait-quiet", type=float, default=60, metavar="S",
                    help="before each run, wait up to S s for the machine to be idle (<0.5 CPU busy); "
                    "the busy level is recorded in the note either way (0 = don't wait)")
    ap.add_argument("--max-steal", type=float, metavar="PCT",
                    help="reject a run whose steal time (the hypervisor's, from /proc/stat) was over PCT%% "
                    "of the CPUs' time during it, and run it again (see --steal-retries); the steal is "
                    "in every row's note either way (default: keep every run)")
    ap.add_argument("--steal-retries", type=int, default=2, metavar="N",
                    help="with --max-steal: run a rejected run again at most N times (default 2)")
    ap.add_argument("--warm", type=parse_size, metavar="SIZE",
                    help="before each run, write and delete this much in /dev/shm so that the run gets "
                    "memory the VM's host still backs (see warm_memory; default twice the file size, "
                    "at most 4G; 0 = off)")
    ap.add_argument("--cleanup", action="store_true", help="remove leftovers of killed runs and exit")
    ap.add_argument("--workdir", type=Path, default=RESULTS / "tmp",
                    help="where source files and received files live (e.g. /dev/shm/hbench for tmpfs, "
                         "so the disk is out of the picture); default bench/results/tmp")
    ap.add_argument("--hurtle-base", type=Path, metavar="PATH",
                    help="a second hurtle binary for the tool hurtle-base (e.g. the build before a change)")
    ap.add_argument("--csv", type=Path, default=CSV_PATH, help=f"append rows here (default {CSV_PATH})")
    args = ap.parse_args()
    CSV_PATH = args.csv.resolve()

    if os.geteuid() != 0:
        sys.exit("run as root (network namespaces, TUN, tc, sysctl)")
    recover_stale(STATE_PATH, NS_RE)
    if args.cleanup:
        return
    install_signal_handlers()
    REG.state_file = STATE_PATH

    profiles = (args.profiles or (",".join(QUICK_PROFILES) if args.quick else "all")).split(",")
    if profiles == ["all"]:
        profiles = list(netlab.PROFILES)
    for p in profiles:
        if p not in netlab.PROFILES:
            sys.exit(f"unknown profile {p!r}; known: {', '.join(netlab.PROFILES)}")
    if args.sweep:
        # A sweep runs its own variants, plus any tools named as baselines beside it.
        tool_names = args.tools.split(",") if args.tools else []
    else:
        tool_names = (args.tools or ",".join(QUICK_TOOLS if args.quick else FULL_TOOLS)).split(",")
    size = args.size or ((64 << 20) if args.quick else (1 << 30))
    repeat = args.repeat or 3
    timeout = args.timeout or min(900.0, 30 + size * 8 / 20e6)

    RESULTS.mkdir(exist_ok=True)
    work = args.workdir / f"run-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    unavailable_pkgs = {} if args.no_install else ensure_packages(PACKAGES)
    for p, e in unavailable_pkgs.items():
        log(f"package {p} unavailable: {e}")

    linkem_bin = REPO / "target" / "release" / "linkem"
    hurtle_bin = REPO / "target" / "release" / "hurtle"
    hurtle_build_err = None
    if not args.no_build:
        err = cargo_build("linkem")
        if err:
            sys.exit(err)
        if "tcp-b3" in tool_names and (err := cargo_build("tcphash")):
            log(err)
        if any(t.startswith("hurtle") for t in tool_names) or args.sweep in ("channels", "payload", "tcpgrid"):
            hurtle_build_err = cargo_build("hurtle")
            if hurtle_build_err:
                log(hurtle_build_err)

    prefix = f"hb{os.getpid()}"
    lab = netlab.Lab(prefix, work, linkem_bin, rt_priority=args.rt_priority, slack=args.linkem_slack,
                     gso=args.linkem_gso)
    try:
        if args.tcp_cc:
            # A namespace may only make a congestion control its default if the host allows it
            # (net.ipv4.tcp_allowed_congestion_control is global): allow it for the run.
            key = "net.ipv4.tcp_allowed_congestion_control"
            allowed = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control").read_text().split()
            if args.tcp_cc not in allowed:
                REG.set_sysctl(key, " ".join(allowed + [args.tcp_cc]))
        if args.sock_buf:
            for k in ("net.core.rmem_max", "net.core.wmem_max"):
                cur = int(Path("/proc/sys/" + k.replace(".", "/")).read_text())
                if cur < args.sock_buf:
                    REG.set_sysctl(k, args.sock_buf)
        ceiling = None
        if CEILING_PATH.exists() and not args.measure_ceiling:
            ceiling = json.loads(CEILING_PATH.read_text())
        elif any(netlab.PROFILES[p].kind == "emu" for p in profiles) or args.measure_ceiling:
            log("measuring the emulator ceiling (about 30 s)")
            ceiling = measure_ceiling(lab, work)
        info = machine_info(ceiling, args.sock_buf, args.tcp_cc)
        write_machine_txt(info)
        if args.measure_ceiling:
            print((RESULTS / "machine.txt").read_text())
            return
        mshort = machine_short(info)
        ceil_mbps = (ceiling or {}).get("ceiling_mbps")

        env = tools.Env(repo=REPO, work=work, hurtle_bin=hurtle_bin, hurtle_base_bin=args.hurtle_base,
                        sock_buf=args.sock_buf or 4 << 20)
        tl = tools.make_tools(tool_names, args.sweep, iperf_secs=5 if args.quick else 10)
        src = source_file(size, args.workdir)
        tools.sha256(src)
        # Tools too slow for the full size (cubic on a long lossy path) move a smaller file.
        small_srcs = {t.max_size: source_file(t.max_size, args.workdir)
                      for t in tl if t.max_size and t.max_size < size}
        pkg_reason = {t.name: f"package(s) unavailable: {', '.join(p for p in t.packages if p in unavailable_pkgs)}"
                      for t in tl if any(p in unavailable_pkgs for p in t.packages)}
        port = 47000
        n_runs = len(profiles) * repeat * len(tl)
        log(f"{n_runs} runs: profiles={profiles} tools={[t.label for t in tl]} size={human(size)} "
            f"repeat={repeat} timeout={timeout:.0f}s")
        k = 0
        t_begin = time.monotonic()
        for pname in profiles:
            prof = netlab.PROFILES[pname]
            lab.prepare(prof, args.tcp_cc)
            ends = lab.ends(prof)
            for rep in range(repeat):
                for tool in tl:
                    # A run the hypervisor stole more than --max-steal from is recorded as
                    # rejected and run again, at most --steal-retries times.
                    for attempt in range(1 + max(0, args.steal_retries)):
                        k += 1
                        ts = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
                        run_id = f"{prefix}-{k:04d}"
                        tsrc = small_srcs.get(tool.max_size, src)
                        row = {"timestamp": ts, "tool": tool.name, "settings": tool.settings + (f" [tcp cc {args.tcp_cc}]" if args.tcp_cc else ""),
                               "profile": pname, "file_size": tsrc.stat().st_size, "run_id": run_id, "repeat": rep + 1,
                               "path": prof.summary(), "machine": mshort,
                               "emu_ceiling_mbps": fmt(ceil_mbps, 0) if prof.kind == "emu" else ""}
                        why = pkg_reason.get(tool.name) or tool.unavailable(env)
                        if why:
                            if rep == 0:
                                row.update(ok=0, note=f"unavailable: {why}")
                                append_row(row)
                                log(f"[{k}/{n_runs}] {pname} {tool.label}: unavailable: {why}")
                            break
                        idle_busy = wait_quiet(args.wait_quiet) if args.wait_quiet > 0 else None
                        warm = min(2 * size, 4 << 30) if args.warm is None else args.warm
                        warm_memory(warm)
                        rundir = work / run_id
                        rundir.mkdir(parents=True, exist_ok=True)
                        port = 47000 + (port - 47000 + 1) % 2000
                        notes = []
                        drops0 = 0
                        if prof.kind == "emu":
                            lab.start_linkem(prof, seed=rep + 1, logdir=rundir)
                            drops0 = lab.tun_drops()
                        prep = tool.prepare(env, ends, prof, port + 2000, rundir)
                        if prep:
                            notes.append("prepare failed: " + prep)
                        j0 = cpu_jiffies()
                        # A small file for a slow tool may go at 1 Mbit/s (cubic at 1% loss, 150 ms).
                        t_out = timeout if tsrc is src else max(timeout, min(900.0, 30 + tsrc.stat().st_size * 8 / 1e6))
                        res = tools.run_once(tool, env, ends, prof, tsrc, port, rundir, t_out)
                        j1 = cpu_jiffies()
                        busy = (j1[0] - j0[0]) / max(1, j1[1] - j0[1]) * 100
                        steal_ms = (j1[2] - j0[2]) * 1000 // (os.sysconf("SC_CLK_TCK") or 100)
                        steal_pct = steal_ms / 10 / max(res.wall_s or 0, 1e-3) / (os.cpu_count() or 1)
                        stolen = args.max_steal is not None and steal_pct > args.max_steal
                        notes.append(f"cpu_busy={busy:.0f}% of {os.cpu_count()} cores, steal {steal_ms} ms"
                                     + (f", idle-before={idle_busy:.2f} CPUs busy" if idle_busy is not None else "")
                                     + (f", warmed {human(warm)}" if warm > 0 else ""))
                        if stolen:
                            notes.append(f"STEAL-HEAVY: {steal_pct:.1f}% of the CPUs' time over "
                                         f"--max-steal {args.max_steal:g}%, rejected")
                            res.ok = False
                        if idle_busy is not None and idle_busy > 0.5:
                            notes.append("MACHINE-BUSY: other processes were using the CPUs before this run")
                        if prof.kind == "emu":
                            # Read TUN drops while linkem is still attached: once it
                            # detaches, stray packets are dropped there too.
                            pre = lab.tun_drops() - drops0
                            st = lab.stop_linkem()
                            row["emu_pre_drops"] = pre
                            a = st.get("a2b", {})
                            notes.append("linkem a2b: in={:.0f} lost={:.0f} qdrop={:.0f} late_avg={:.0f}us stalled={:.0f}ms sleeps={:.0f}".format(
                                a.get("in", 0), a.get("lost", 0), a.get("queue_drop", 0), a.get("late_avg_us", 0),
                                a.get("stall_ms", 0), a.get("sleeps", 0)))
                            notes.append(f"linkem slack={args.linkem_slack} gso={int(args.linkem_gso)} "
                                         f"writes={a.get('writes', 0):.0f}")
                            if pre > 0:
                                notes.append(f"EMU-OVERLOAD: {pre} packets dropped before linkem")
                            if res.goodput_mbps and ceil_mbps:
                                if res.goodput_mbps > ceil_mbps:
                                    notes.append("ABOVE-EMU-CEILING: invalid")
                                    res.ok = False
                                elif res.goodput_mbps > 0.8 * ceil_mbps:
                                    notes.append("NEAR-EMU-CEILING")
                        row.update(
                            wall_s=fmt(res.wall_s), goodput_mbps=fmt(res.goodput_mbps, 1) if res.ok else "",
                            cpu_s_sender=fmt(res.cpu_s_sender, 2), cpu_s_receiver=fmt(res.cpu_s_receiver, 2),
                            peak_rss_kb_sender=fmt(res.peak_rss_kb_sender),
                            peak_rss_kb_receiver=fmt(res.peak_rss_kb_receiver),
                            resent_share=fmt(res.resent_share, 4), socket_drops=fmt(res.socket_drops),
                            ok=int(res.ok), note="; ".join(res.notes + notes))
                        if prep:
                            # Not the run the tool stands for (a warm start without its memory).
                            res.ok = False
                            row.update(ok=0, goodput_mbps="")
                        if not res.ok:
                            if tool.name == "hurtle" and hurtle_build_err:
                                row["note"] += f"; {hurtle_build_err[:200]}"
                            logs = rundir.relative_to(REPO) if rundir.is_relative_to(REPO) else rundir
                            row["note"] += f"; logs: {logs}"
                        append_row(row)
                        log(f"[{k}/{n_runs}] {pname} rep{rep + 1} {tool.label}: "
                            + (f"{res.goodput_mbps:.1f} Mbit/s in {res.wall_s:.2f}s" if res.ok
                               else "REJECTED, steal" if stolen else "FAILED")
                            + f" ({row['note'][:160]})")
                        if res.ok and not args.keep_logs:
                            shutil.rmtree(rundir, ignore_errors=True)
                        if not stolen:
                            break
        log(f"done: {k} runs in {time.monotonic() - t_begin:.0f}s; results in {CSV_PATH}")
        log("plots: python3 bench/plot.py --markdown")
    except Interrupted as e:
        log(f"interrupted ({e}); cleaning up")
        raise SystemExit(130)
    finally:
        try:
            lab.stop_linkem()
        except Exception:
            pass
        REG.cleanup()
        # Keep only the logs of failed runs.
        shutil.rmtree(work / "ssh", ignore_errors=True)
        for d in work.glob("ceiling-*"):
            shutil.rmtree(d, ignore_errors=True)
        try:
            work.rmdir()
        except OSError:
            pass


if __name__ == "__main__":
    main()
