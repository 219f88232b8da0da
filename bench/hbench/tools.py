"""The transfer tools compared by the harness, and how one run of one tool
is carried out and measured.

Every tool is a receiver (started first, in the receiving namespace, waited
for until its port is open) and a sender (in the sending namespace). Both
run under ``/usr/bin/time`` for CPU seconds and peak RSS. Wall time runs
from the sender's start until the file is complete: the later of the two
exits for one-shot receivers, the sender's exit for servers (sshd, gridftp
server, uftpd), which are then stopped. The received file is SHA-256-checked
against the source; a missing or different file gets no throughput figure.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from .netlab import PathEnds, Profile
from .sysutil import Proc, descendants, last_json, log, sh

HERE = Path(__file__).resolve().parent


@dataclass
class Env:
    """What tools need to know about the run."""

    repo: Path
    work: Path  # scratch dir of this harness run
    hurtle_bin: Path
    sock_buf: int  # bytes, for tools with an explicit buffer option
    ssh_dir: Path | None = None
    hurtle_base_bin: Path | None = None  # a second hurtle build, run beside the first (hurtle-base)


@dataclass
class Result:
    ok: bool
    wall_s: float | None = None
    goodput_mbps: float | None = None
    cpu_s_sender: float | None = None
    cpu_s_receiver: float | None = None
    peak_rss_kb_sender: int | None = None
    peak_rss_kb_receiver: int | None = None
    resent_share: float | None = None
    socket_drops: int | None = None
    notes: list[str] = field(default_factory=list)
    goodput_override: tuple | None = None  # (mbps, seconds) for time-based tools


@dataclass
class Spec:
    """One side's command."""

    argv: list[str]
    env: dict | None = None


class Tool:
    """Base class: a tool + one setting."""

    name = "?"
    packages: list[str] = []
    binaries: list[str] = []
    oneshot_receiver = True  # receiver exits by itself after one transfer
    ready_proto = "tcp"
    file_output = True  # False: memory-to-memory (iperf3)
    max_size: int | None = None  # a smaller source file for tools too slow for the full size

    def __init__(self, settings="default", **opts):
        self.settings = settings
        self.opts = opts

    @property
    def label(self):
        return f"{self.name}[{self.settings}]"

    def unavailable(self, env: Env) -> str | None:
        for b in self.binaries:
            if not shutil.which(b) and not Path(b).exists():
                return f"{b} not installed"
        return None

    def receiver(self, env, ends: PathEnds, port, outdir: Path, src: Path, prof: Profile) -> Spec | None:
        raise NotImplementedError

    def sender(self, env, ends: PathEnds, port, outdir: Path, src: Path, prof: Profile) -> Spec:
        raise NotImplementedError

    def inspect(self, sender: Proc, receiver: Proc | None, src: Path, res: Result) -> bool:
        """Tool-specific parsing; return False if the tool itself says the
        transfer failed."""
        return True

    def prepare(self, env: Env, ends: PathEnds, prof: Profile, port: int, rundir: Path) -> str | None:
        """Untimed work before the measured run, on the same path (e.g. a transfer that leaves
        a memory of the path); returns why it failed, or None."""
        return None


class PlainTcp(Tool):
    """One TCP connection; ``cc`` names its congestion control (default: the namespace's, which
    is the kernel's default or ``--tcp-cc``)."""

    name = "tcp"

    def __init__(self, settings="default", cc: str | None = None, max_size: int | None = None, **opts):
        super().__init__(settings, **opts)
        self.cc = cc
        self.max_size = max_size
        if cc:
            self.name = f"tcp-{cc}"

    def _cc(self) -> list[str]:
        return ["--cc", self.cc] if self.cc else []

    def receiver(self, env, ends, port, outdir, src, prof):
        return Spec(["python3", str(HERE / "tcpcopy.py"), "recv", "--listen",
                     f"{ends.recv_addr}:{port}", "--out", str(outdir / src.name)] + self._cc())

    def sender(self, env, ends, port, outdir, src, prof):
        return Spec(["python3", str(HERE / "tcpcopy.py"), "send", str(src), "--to",
                     f"{ends.recv_addr}:{port}"] + self._cc())


class HashedTcp(Tool):
    """One TCP connection doing the integrity work hurtle does: BLAKE3 of every byte on both
    ends (``bench/tcphash``, Rust, the same blake3 crate), reads and writes in 1 MiB pieces."""

    name = "tcp-b3"

    def _bin(self, env) -> Path:
        return env.repo / "target" / "release" / "tcphash"

    def unavailable(self, env):
        if not self._bin(env).exists():
            return f"{self._bin(env)} missing (cargo build --release -p tcphash failed?)"
        return None

    def receiver(self, env, ends, port, outdir, src, prof):
        return Spec([str(self._bin(env)), "recv", "--listen", f"{ends.recv_addr}:{port}",
                     "--out", str(outdir / src.name)])

    def sender(self, env, ends, port, outdir, src, prof):
        return Spec([str(self._bin(env)), "send", str(src), "--to", f"{ends.recv_addr}:{port}"])


class Iperf3(Tool):
    """Memory-to-memory TCP bound: a time-based iperf3 test (``-t``), whose
    receiver-side rate is reported as goodput. Size-based (``-n``) tests are
    not used: the client stops when it has *sent* n bytes, so on a long path
    the receiver-side figure misses everything still in flight."""

    name = "iperf3"
    packages = ["iperf3"]
    binaries = ["iperf3"]
    file_output = False

    def receiver(self, env, ends, port, outdir, src, prof):
        return Spec(["iperf3", "-s", "-1", "-p", str(port), "-B", ends.recv_addr])

    def sender(self, env, ends, port, outdir, src, prof):
        a = ["iperf3", "-c", ends.recv_addr, "-p", str(port), "-t", str(self.opts.get("secs", 10)), "-J"]
        if self.opts.get("streams", 1) > 1:
            a += ["-P", str(self.opts["streams"])]
        return Spec(a)

    def inspect(self, sender, receiver, src, res):
        try:
            d = json.loads(sender.stdout())
            r = d["end"]["sum_received"]
            res.goodput_override = (r["bits_per_second"] / 1e6, r["seconds"])
            res.notes.append(f"memory-to-memory TCP bound, {r['seconds']:.0f}s time-based test, "
                             f"{r['bytes']} bytes")
            retr = d["end"].get("sum_sent", {}).get("retransmits")
            if retr is not None:
                res.notes.append(f"retransmits={retr}")
            return r["bytes"] > 0
        except (ValueError, KeyError) as e:
            res.notes.append(f"iperf3 json: {e}")
            return False


SSH_OPTS = ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o",
            "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR"]


def prepare_ssh(env: Env):
    """Throwaway host and client keys plus an sshd_config, once per run."""
    d = env.work / "ssh"
    if env.ssh_dir:
        return
    d.mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    for k in ("host_key", "client_key"):
        if not (d / k).exists():
            sh(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "hurtle-bench", "-f", str(d / k)])
    shutil.copy(d / "client_key.pub", d / "authorized_keys")
    (d / "sshd_config").write_text(
        f"HostKey {d / 'host_key'}\n"
        f"AuthorizedKeysFile {d / 'authorized_keys'}\n"
        "PermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "UsePAM no\n"
        "StrictModes no\n"
        "UseDNS no\n"
        "PidFile none\n"
        "LogLevel ERROR\n"
        "Subsystem sftp internal-sftp\n"
    )
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege-separation dir
    env.ssh_dir = d


class _SshBased(Tool):
    packages = ["openssh-server", "openssh-client"]
    binaries = ["/usr/sbin/sshd", "ssh"]
    oneshot_receiver = False

    def receiver(self, env, ends, port, outdir, src, prof):
        prepare_ssh(env)
        return Spec(["/usr/sbin/sshd", "-D", "-e", "-f", str(env.ssh_dir / "sshd_config"),
                     "-p", str(port), "-o", f"ListenAddress={ends.recv_addr}"])


class Scp(_SshBased):
    name = "scp"

    def sender(self, env, ends, port, outdir, src, prof):
        return Spec(["scp", "-q", "-P", str(port), "-i", str(env.ssh_dir / "client_key")] + SSH_OPTS
                    + [str(src), f"root@{ends.recv_addr}:{outdir}/"])


class Rsync(_SshBased):
    name = "rsync"
    packages = _SshBased.packages + ["rsync"]
    binaries = _SshBased.binaries + ["rsync"]

    def sender(self, env, ends, port, outdir, src, prof):
        ssh = " ".join(["ssh", "-p", str(port), "-i", str(env.ssh_dir / "client_key")] + SSH_OPTS)
        return Spec(["rsync", "-a", "-e", ssh, str(src), f"root@{ends.recv_addr}:{outdir}/"])


class HurtleCp(_SshBased):
    """`hurtle cp` over the same throwaway sshd as scp and rsync: ssh starts the far hurtle
    (`ssh-serve receive`, the binary under test named with --remote-hurtle), which receives
    directly over UDP (or parallel TCP) on an ephemeral port. The wall time includes ssh's
    connection and the far side's start: against `hurtle` (started by hand) it is the cost of
    starting over ssh."""

    name = "hurtle-cp"

    def unavailable(self, env):
        if not env.hurtle_bin.exists():
            return f"{env.hurtle_bin} missing (cargo build --release -p hurtle failed?)"
        return super().unavailable(env)

    def sender(self, env, ends, port, outdir, src, prof):
        ssh = " ".join(["ssh", "-i", str(env.ssh_dir / "client_key")] + SSH_OPTS)
        return Spec([str(env.hurtle_bin), "cp", "-e", ssh, "-P", str(port), "--remote-hurtle",
                     str(env.hurtle_bin), "--json", "-q", str(src), f"root@{ends.recv_addr}:{outdir}"])

    def inspect(self, sender, receiver, src, res):
        s = last_json(sender.stdout())
        if s is None:
            res.notes.append("hurtle cp printed no JSON")
            return True
        sent = s.get("datagrams_sent") or 0
        if sent:
            res.resent_share = (s.get("datagrams_resent") or 0) / sent
        res.notes.append("hurtle cp says {:.0f} Mbit/s over the session, channels={}, transport={}".format(
            (s.get("goodput_bps") or 0) / 1e6, s.get("channels"), s.get("transport")))
        return True


class GridFtp(Tool):
    """globus-url-copy -> globus-gridftp-server (anonymous ftp://, MODE E,
    -p parallel TCP streams)."""

    name = "gridftp"
    packages = ["globus-gass-copy-progs", "globus-gridftp-server-progs"]
    binaries = ["globus-url-copy", "globus-gridftp-server"]
    # The client exits only after the server's "226 Transfer Complete"; the
    # -single server then lingers for seconds before exiting, so it is
    # treated as a server (stopped) rather than waited for.
    oneshot_receiver = False

    def receiver(self, env, ends, port, outdir, src, prof):
        os.chmod(outdir, 0o777)  # anonymous sessions run as 'nobody'
        return Spec(["globus-gridftp-server", "-aa", "-anonymous-user", "nobody", "-p", str(port),
                     "-no-fork", "-single", "-home-dir", "/", "-data-interface", ends.recv_addr,
                     "-c", "/dev/null", "-d", "ERROR"])

    def sender(self, env, ends, port, outdir, src, prof):
        a = ["globus-url-copy", "-fast", "-p", str(self.opts.get("parallel", 4))]
        if self.opts.get("bs"):
            a += ["-bs", str(self.opts["bs"])]
        return Spec(a + [f"file://{src}", f"ftp://{ends.recv_addr}:{port}{outdir}/{src.name}"])


class GridFtpUdt(GridFtp):
    name = "gridftp-udt"
    packages = GridFtp.packages + ["libglobus-xio-udt-driver"]

    def unavailable(self, env):
        return ("globus-url-copy applies -udt (the 'udt' data-channel stack) only to gsiftp:// "
                "URLs, i.e. with GSI/X.509 authentication; with anonymous ftp:// it silently "
                "uses TCP (verified with nft counters), and no throwaway GSI CA is set up here")


class Uftp(Tool):
    """uftp (sender) -> uftpd (receiver daemon), unicast to the receiver's
    address. ``cc=tfmcc`` is UFTP's congestion control; ``rate=...`` a fixed
    send rate (UFTP's default mode, cc none)."""

    name = "uftp"
    packages = ["uftp"]
    binaries = ["uftp", "uftpd"]
    oneshot_receiver = False
    ready_proto = "udp"

    def receiver(self, env, ends, port, outdir, src, prof):
        tmp = outdir.parent / "uftp-tmp"
        tmp.mkdir(exist_ok=True)
        return Spec(["uftpd", "-d", "-q", "-p", str(port), "-D", str(outdir), "-T", str(tmp),
                     "-B", str(min(env.sock_buf, 104857600)), "-x", "1"])

    def sender(self, env, ends, port, outdir, src, prof):
        a = ["uftp", "-M", ends.recv_addr, "-p", str(port), "-B", str(min(env.sock_buf, 104857600)),
             "-x", "1"]
        if self.opts.get("cc"):
            a += ["-C", self.opts["cc"]]
        else:
            a += ["-R", str(int(self.rate_mbps(prof) * 1000))]
        return Spec(a + [str(src)])

    @staticmethod
    def rate_mbps(prof):
        return 0.9 * (prof.rate_mbps or 1000)

    def inspect(self, sender, receiver, src, res):
        out = sender.stdout() + sender.stderr()
        for line in out.splitlines():
            if "Status:" in line and "Completed" not in line:
                res.notes.append("uftp: " + " ".join(line.split()))
        return True


class Hurtle(Tool):
    name = "hurtle"

    def _bin(self, env) -> Path | None:
        return env.hurtle_base_bin if self.opts.get("base") else env.hurtle_bin

    def unavailable(self, env):
        b = self._bin(env)
        if b is None:
            return "hurtle-base needs --hurtle-base PATH"
        if not b.exists():
            return f"{b} missing (cargo build --release -p hurtle failed?)"
        return None

    # What a transfer learnt of the path (hurtle's path memory) is kept in the run's directory:
    # every run starts cold, as on a path never seen, unless the tool is `hurtle-warm`, whose
    # untimed transfer before the run leaves it (see `prepare`).
    SEED_SIZE = 128 << 20

    @staticmethod
    def _memory_env(outdir: Path) -> dict:
        return {"HURTLE_PATH_MEMORY": str(outdir.parent / "path-memory")}

    def _encryption(self) -> list[str]:
        # Both ends must agree to leave the data unencrypted (`--no-encryption` on each).
        return ["--no-encryption"] if self.opts.get("no_encryption") else []

    def receiver(self, env, ends, port, outdir, src, prof):
        return Spec([str(self._bin(env)), "receive", "--listen", f"{ends.recv_addr}:{port}",
                     "--out", str(outdir), "--json", "-q"] + self._encryption())

    def prepare(self, env, ends, prof, port, rundir):
        memory = rundir / "path-memory"
        memory.unlink(missing_ok=True)
        if not self.opts.get("warm"):
            return None
        seed = env.work / f"seed-{self.SEED_SIZE >> 20}M.bin"
        if not seed.exists():
            with open(seed, "wb") as f:
                for _ in range(self.SEED_SIZE >> 20):
                    f.write(os.urandom(1 << 20))
        seed_out = rundir / "seed-out"
        seed_out.mkdir(parents=True, exist_ok=True)
        recv = send = None
        try:
            recv = Proc(self.receiver(env, ends, port, seed_out, seed, prof).argv, "seed-receiver",
                        rundir, ns=ends.recv_ns, timed=False)
            if not recv.wait_listening(port, "tcp", timeout=15):
                return "the seed transfer's receiver never listened: " + _tail(recv)
            spec = self.sender(env, ends, port, seed_out, seed, prof)
            send = Proc(spec.argv, "seed-sender", rundir, ns=ends.send_ns, timed=False, env=spec.env)
            rc = send.wait(300)
            recv.wait(30)
            if rc != 0:
                return f"the seed transfer failed ({rc}): " + _tail(send)
            if not memory.exists():
                return "the seed transfer left no memory of the path"
            return None
        finally:
            _end(send, recv, dirs=[seed_out])

    def sender(self, env, ends, port, outdir, src, prof):
        a = [str(self._bin(env)), "send", str(src), "--to", f"{ends.recv_addr}:{port}", "--json", "-q"]
        a += self._encryption()
        for k in ("transport", "channels", "chunk_size", "payload", "rate", "rate_fixed"):
            if self.opts.get(k) is not None:
                v = self.opts[k]
                if v == "bottleneck":
                    v = f"{int(prof.rate_mbps or 1000)}M"
                elif v == "oracle":
                    # The path's bound: what the bottleneck carries after random loss.
                    if not prof.rate_mbps:
                        raise ValueError(f"profile {prof.name} has no bottleneck rate for an oracle")
                    v = f"{int(prof.rate_mbps * (1 - prof.loss))}M"
                a += ["--" + k.replace("_", "-"), str(v)]
        return Spec(a, env=self._memory_env(outdir))

    @staticmethod
    def _json(text):
        return last_json(text)

    def inspect(self, sender, receiver, src, res):
        # target/release/hurtle is rebuilt by others while benchmarks run:
        # say which build this row measured.
        argv0 = Path(sender.argv[0])
        if argv0.exists():
            st = argv0.stat()
            import datetime as _dt

            res.notes.append("bin sha256:{} built {}".format(
                sha256(argv0)[:12],
                _dt.datetime.fromtimestamp(st.st_mtime, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")))
        s = self._json(sender.stdout())
        if s is None:
            res.notes.append("hurtle send printed no JSON")
        else:
            sent = s.get("datagrams_sent") or 0
            resent = s.get("datagrams_resent") or 0
            if sent:
                res.resent_share = resent / sent
            res.notes.append(
                "hurtle says {:.0f} Mbit/s, channels={}, nacks={}, payload={}, first_data_ms={}, "
                "transport={}, fallback_seconds={}".format(
                    (s.get("goodput_bps") or 0) / 1e6, s.get("channels"), s.get("nacks"),
                    s.get("payload"), s.get("first_data_ms"), s.get("transport"),
                    s.get("fallback_seconds")))
            if s.get("new_data_sent_ms") is not None and s.get("seconds"):
                # The tail: from the last new datagram to the end (repairs, confirmations).
                res.notes.append("tail_ms={:.0f}, parity={}".format(
                    s["seconds"] * 1e3 - s["new_data_sent_ms"], s.get("parity_sent")))
            resumed = (s.get("rate") or {}).get("resumed")
            if resumed:
                res.notes.append("resumed from {:.0f} Mbit/s ({} s old), started at {:.0f}".format(
                    resumed["remembered_bps"] / 1e6, resumed["age_s"],
                    s["rate"]["start_bps"] / 1e6))
            elif self.opts.get("warm"):
                res.notes.append("NOT RESUMED: the seed transfer's memory was not used")
        r = self._json(receiver.stdout()) if receiver else None
        if r is not None and r.get("socket_drops") is not None:
            res.socket_drops = int(r["socket_drops"])
        return True


def make_tools(names: list[str], sweep: str | None, iperf_secs: int = 10) -> list[Tool]:
    """Expand tool names into (tool, setting) variants."""
    out: list[Tool] = []
    for n in names:
        if n == "tcp":
            out.append(PlainTcp("1 stream, sendfile"))
        elif n in ("tcp-bbr", "tcp-cubic"):
            # The congestion control named on the socket, whatever the namespace's default.
            # cubic crawls on long lossy paths (a few Mbit/s): it moves at most 16 MiB.
            cc = n.split("-")[1]
            out.append(PlainTcp(f"1 stream, sendfile, {cc}", cc=cc,
                                max_size=(16 << 20) if cc == "cubic" else None))
        elif n == "tcp-b3":
            out.append(HashedTcp("1 stream, BLAKE3 both ends"))
        elif n == "iperf3":
            out.append(Iperf3(f"1 stream, {iperf_secs}s mem-to-mem", streams=1, secs=iperf_secs))
        elif n == "iperf3-p4":
            out.append(Iperf3(f"4 streams, {iperf_secs}s mem-to-mem", streams=4, secs=iperf_secs))
        elif n == "scp":
            out.append(Scp("default cipher"))
        elif n == "rsync":
            out.append(Rsync("-a over ssh"))
        elif n == "hurtle-cp":
            out.append(HurtleCp("default, started over ssh"))
        elif n == "gridftp":
            for p in (1, 4, 8):
                out.append(GridFtp(f"p={p}", parallel=p))
        elif n == "gridftp-p4":
            out.append(GridFtp("p=4", parallel=4))
        elif n == "gridftp-udt":
            out.append(GridFtpUdt("udt"))
        elif n == "uftp":
            out.append(Uftp("cc=tfmcc", cc="tfmcc"))
            out.append(Uftp("rate=0.9x bottleneck"))
        elif n == "uftp-fixed":
            out.append(Uftp("rate=0.9x bottleneck"))
        elif n == "hurtle":
            out.append(Hurtle("default"))
            out.append(Hurtle("channels=4", channels=4))
            out.append(Hurtle("transport=tcp", transport="tcp"))
        elif n == "hurtle-default":
            out.append(Hurtle("default"))
        elif n == "hurtle-noenc":
            # The defaults with the data left unencrypted (both ends' --no-encryption; every
            # block still checked by BLAKE3): the figure to set beside tcp-b3.
            out.append(Hurtle("default, --no-encryption", no_encryption=True))
        elif n == "hurtle-base":
            # The defaults, with the build given by --hurtle-base: before against after, side by side.
            out.append(Hurtle("default, base build", base=True))
        elif n == "hurtle-warm":
            # The defaults, on a path a 128 MiB transfer (untimed, just before) has been over:
            # the start from its memory of the path.
            out.append(Hurtle("default, resumed (a 128 MiB transfer before)", warm=True))
        elif n == "hurtle-oracle":
            # --rate-fixed at the path's bound (bottleneck x (1 - loss)): what a controller that
            # knew the path would get, the figure automatic rate control is measured against.
            out.append(Hurtle("rate-fixed=bottleneck*(1-loss)", rate_fixed="oracle"))
        else:
            raise SystemExit(f"unknown tool {n!r}")
    # A sweep comes first; tools named with it (e.g. tcp) run beside it as baselines.
    if sweep == "channels":
        out = out + [Hurtle(f"channels={c}", channels=c) for c in (1, 2, 4, 8, 16)]
    elif sweep == "payload":
        out = out + [Hurtle(f"payload={p}", payload=p) for p in (512, 1024, 1396, 4096, 8900)]
    elif sweep == "tcpgrid":
        out = out + [Hurtle(f"transport=tcp,channels={c},chunk={ch}", transport="tcp", channels=c, chunk_size=ch)
                     for c in (1, 2, 4, 8, 16) for ch in ("64K", "256K", "1M", "4M", "16M")]
    elif sweep == "gridftp":
        out = out + [GridFtp(f"p={p},bs={bs}", parallel=p, bs=bs)
               for p in (1, 2, 4, 8, 16) for bs in (65536, 1048576, 4194304)]
    return out


# ---------------------------------------------------------------------------

_HASHES: dict[tuple, str] = {}


def sha256(path: Path) -> str:
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key in _HASHES:
        return _HASHES[key]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(4 << 20)
            if not b:
                break
            h.update(b)
    _HASHES[key] = h.hexdigest()
    return _HASHES[key]


def run_once(tool: Tool, env: Env, ends: PathEnds, prof: Profile, src: Path, port: int,
             rundir: Path, timeout: float) -> Result:
    """One transfer of ``src`` with ``tool`` over ``ends``; never raises for
    tool failures (they become ok=False results)."""
    outdir = rundir / "out"
    outdir.mkdir(parents=True, exist_ok=True)
    res = Result(ok=False)
    recv = send = None
    try:
        rspec = tool.receiver(env, ends, port, outdir, src, prof)
        if rspec:
            recv = Proc(rspec.argv, "receiver", rundir, ns=ends.recv_ns, env=rspec.env)
            if not recv.wait_listening(port, tool.ready_proto, timeout=15):
                recv.stop()
                res.notes.append("receiver never listened: " + _tail(recv))
                return res
        sspec = tool.sender(env, ends, port, outdir, src, prof)
        send = Proc(sspec.argv, "sender", rundir, ns=ends.send_ns, env=sspec.env)
        rc = send.wait(timeout)
        if rc is None:
            res.notes.append(f"timeout after {timeout:.0f}s (killed)")
            send.stop()
            if recv:
                recv.stop()
            return res
        end = send.t_end
        if recv:
            if tool.oneshot_receiver:
                rrc = recv.wait(max(5.0, min(30.0, timeout * 0.1)))
                if rrc is None:
                    res.notes.append("receiver did not exit after the sender (killed)")
                    recv.stop()
                else:
                    end = max(end, recv.t_end)
                    if rrc != 0:
                        res.notes.append(f"receiver exit {rrc}: " + _tail(recv))
            else:
                # Let per-connection children (sshd sessions) finish so their
                # CPU is counted, then stop the server.
                t = time.monotonic() + 3
                while time.monotonic() < t and len(descendants(recv.pid)) > 1:
                    time.sleep(0.05)
                recv.stop()
        if rc != 0:
            res.notes.append(f"sender exit {rc}: " + _tail(send))
        tool_ok = tool.inspect(send, recv, src, res)
        res.wall_s = end - send.t_start
        _, res.cpu_s_sender, res.peak_rss_kb_sender = send.usage()
        if recv:
            _, res.cpu_s_receiver, res.peak_rss_kb_receiver = recv.usage()
        verified = True
        if tool.file_output:
            out = outdir / src.name
            if not out.exists():
                verified = False
                res.notes.append("output file missing")
            elif out.stat().st_size != src.stat().st_size or sha256(out) != sha256(src):
                verified = False
                res.notes.append(f"output differs from source ({out.stat().st_size} bytes)")
        res.ok = rc == 0 and tool_ok and verified
        if res.ok and res.goodput_override:
            res.goodput_mbps, res.wall_s = res.goodput_override
        elif res.ok and res.wall_s > 0:
            res.goodput_mbps = src.stat().st_size * 8 / res.wall_s / 1e6
        return res
    finally:
        _end(send, recv, dirs=[outdir, rundir / "uftp-tmp"])


def _end(*procs: Proc | None, dirs: list[Path]) -> None:
    """Stops the processes of a run that are still there and removes its scratch dirs."""
    for p in procs:
        if p:
            p.stop(grace=1.0)
            p.close()
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


def _tail(p: Proc, n=300) -> str:
    t = (p.stderr().strip() + " " + p.stdout().strip()).strip()
    return " ".join(t[-n:].split())


def tool_version(tool: Tool, env: Env) -> str:
    cmds = {
        "iperf3": ["iperf3", "--version"],
        "scp": ["ssh", "-V"],
        "rsync": ["rsync", "--version"],
        "gridftp": ["globus-url-copy", "-version"],
        "uftp": ["uftp", "-v"],
        "hurtle": [str(env.hurtle_bin), "--version"],
        "hurtle-cp": [str(env.hurtle_bin), "--version"],
        "tcp": ["python3", "--version"],
    }
    c = cmds.get(tool.name)
    if not c:
        return ""
    try:
        r = subprocess.run(c, capture_output=True, text=True, timeout=5)
        return ((r.stdout or "") + (r.stderr or "")).strip().splitlines()[0][:80]
    except (OSError, subprocess.TimeoutExpired, IndexError):
        return ""
