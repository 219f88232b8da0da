"""Process, sysctl and cleanup plumbing for the benchmark harness.

Everything the harness creates (processes, network namespaces, raised
sysctls) is entered in the global ``REG`` registry the moment it exists, and
``REG.cleanup()`` undoes all of it. cleanup runs from a ``finally`` in
run.py, from ``atexit``, and — via the signal handlers installed by
``install_signal_handlers`` — on SIGINT/SIGTERM/SIGHUP. It is idempotent.

Processes are only ever signalled by PID: a process we started, its
descendants (found through /proc/<pid>/task/*/children), and any process
still carrying the session id of one we started (each is started in a new
session, so a daemon that re-parented itself to init is still found).
"""
from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

TIME_FMT = "HBTIME %e %U %S %M"


class Interrupted(Exception):
    """Raised in the main thread when a stop signal arrives."""


def log(*a):
    print("[bench]", *a, file=sys.stderr, flush=True)


def sh(argv, check=True, ns=None, timeout=60, capture=True, env=None):
    """Run a short command (optionally inside netns ``ns``); return stdout."""
    if ns:
        argv = ["ip", "netns", "exec", ns] + list(argv)
    r = subprocess.run(
        argv,
        stdout=subprocess.PIPE if capture else None,
        stderr=subprocess.PIPE if capture else None,
        timeout=timeout,
        env=env,
        text=True,
    )
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({r.returncode}): {(r.stderr or '').strip()}")
    return r.stdout if capture else ""


def _children(pid: int) -> list[int]:
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    out += [int(x) for x in f.read().split()]
            except OSError:
                pass
    except OSError:
        pass
    return out


def descendants(pid: int) -> list[int]:
    """All live descendants of ``pid``, parents before children."""
    seen, todo = [], [pid]
    while todo:
        p = todo.pop(0)
        for c in _children(p):
            if c not in seen:
                seen.append(c)
                todo.append(c)
    return seen


def _session_members(sid: int) -> list[int]:
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
            fields = stat[stat.rfind(")") + 2 :].split()
            if int(fields[3]) == sid:  # field 6 (session) after state,ppid,pgrp
                pids.append(int(d))
        except (OSError, ValueError, IndexError):
            pass
    return pids


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _kill(pid: int, sig) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        pass


def _exited_within(pid: int, timeout: float) -> bool | None:
    """Whether process ``pid`` (a child not yet reaped) ends within ``timeout`` seconds, seen
    through a pidfd the moment it does; None where pidfds are missing (the caller then waits
    the usual way)."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None
    try:
        p = select.poll()
        p.register(fd, select.POLLIN)
        return bool(p.poll(max(0.0, timeout) * 1000))
    finally:
        os.close(fd)


class Proc:
    """A process started by the harness, optionally in a netns and under
    ``/usr/bin/time`` (for CPU seconds and peak RSS)."""

    def __init__(self, argv, name, logdir: Path, ns=None, timed=True, env=None, cwd=None):
        self.name = name
        self.argv = list(argv)
        self.logdir = Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.out_path = self.logdir / f"{name}.out"
        self.err_path = self.logdir / f"{name}.err"
        self.time_path = self.logdir / f"{name}.time" if timed else None
        full = list(argv)
        if timed:
            full = ["/usr/bin/time", "-o", str(self.time_path), "-f", TIME_FMT] + full
        if ns:
            full = ["ip", "netns", "exec", ns] + full
        self.full = full
        e = dict(os.environ)
        if env:
            e.update(env)
        self._out = open(self.out_path, "wb")
        self._err = open(self.err_path, "wb")
        self.t_start = time.monotonic()
        self.popen = subprocess.Popen(
            full,
            stdin=subprocess.DEVNULL,
            stdout=self._out,
            stderr=self._err,
            start_new_session=True,
            env=e,
            cwd=cwd,
        )
        self.pid = self.popen.pid
        self.t_end = None
        REG.procs.append(self)

    # -- state -------------------------------------------------------------
    def poll(self):
        rc = self.popen.poll()
        if rc is not None and self.t_end is None:
            self.t_end = time.monotonic()
        return rc

    def wait(self, timeout):
        """Wait up to ``timeout`` s; return the exit code or None. The end is seen when it
        happens (a pidfd, where the kernel has them): ``Popen.wait(timeout)`` polls with
        sleeps of up to 50 ms, steps of 5% in a one-second run's goodput."""
        rc = self.popen.poll()
        if rc is None:
            ended = _exited_within(self.pid, timeout)
            if ended is False:
                return None
            try:
                rc = self.popen.wait(timeout=0.5 if ended else max(0.0, timeout))
            except subprocess.TimeoutExpired:
                return None
        if self.t_end is None:
            self.t_end = time.monotonic()
        return rc

    @property
    def running(self):
        return self.poll() is None

    def stop(self, grace=3.0, sig=signal.SIGTERM):
        """Stop the process tree: signal the command (the child of ip/time)
        first so /usr/bin/time survives to report, then escalate."""
        if self.poll() is not None:
            self._reap_session()
            return self.popen.returncode
        targets = descendants(self.pid) or [self.pid]
        for p in targets:
            _kill(p, sig)
        rc = self.wait(grace)
        if rc is None:
            for p in [self.pid] + descendants(self.pid):
                _kill(p, signal.SIGKILL)
            rc = self.wait(2.0)
        self._reap_session()
        return rc

    def _reap_session(self):
        # Anything still in our session (e.g. re-parented grandchildren).
        for p in _session_members(self.pid):
            if p != os.getpid():
                _kill(p, signal.SIGKILL)

    def close(self):
        for f in (self._out, self._err):
            try:
                f.close()
            except OSError:
                pass

    # -- results -----------------------------------------------------------
    def stdout(self) -> str:
        return self.out_path.read_text(errors="replace")

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def usage(self):
        """(wall_s, cpu_s, maxrss_kb) from /usr/bin/time, or Nones."""
        if not self.time_path or not self.time_path.exists():
            return None, None, None
        for line in self.time_path.read_text(errors="replace").splitlines():
            if line.startswith("HBTIME"):
                try:
                    _, e, u, s, m = line.split()
                    return float(e), float(u) + float(s), int(m)
                except ValueError:
                    break
        return None, None, None

    def listening(self, port: int, proto="tcp") -> bool:
        """Is a socket of this process's netns bound/listening on ``port``?
        Reads /proc/<pid>/net/*, which shows the process's own namespace."""
        tables = ["tcp", "tcp6"] if proto == "tcp" else ["udp", "udp6"]
        hexport = f":{port:04X}"
        for t in tables:
            try:
                with open(f"/proc/{self.pid}/net/{t}") as f:
                    next(f)
                    for line in f:
                        parts = line.split()
                        if parts[1].endswith(hexport) and (proto == "udp" or parts[3] == "0A"):
                            return True
            except (OSError, StopIteration):
                pass
        return False

    def wait_listening(self, port, proto="tcp", timeout=10.0) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.poll() is not None:
                return False
            if self.listening(port, proto):
                return True
            time.sleep(0.02)
        return False


class Registry:
    """What to undo at exit."""

    def __init__(self):
        self.procs: list[Proc] = []
        self.netns: list[str] = []
        self.sysctls: dict[str, str] = {}
        self.state_file: Path | None = None
        self.done = False

    def add_netns(self, name):
        self.netns.append(name)

    def set_sysctl(self, key, value):
        """Set a global sysctl, remembering the original for restore (also
        on disk, so ``run.py --cleanup`` can restore after a hard kill)."""
        path = "/proc/sys/" + key.replace(".", "/")
        orig = Path(path).read_text().strip()
        if key not in self.sysctls:
            self.sysctls[key] = orig
            self._save_state()
        Path(path).write_text(str(value))
        log(f"sysctl {key}: {orig} -> {value} (restored at exit)")

    def _save_state(self):
        if self.state_file:
            self.state_file.parent.mkdir(parents=True, exist_ok=True)
            self.state_file.write_text(json.dumps({"pid": os.getpid(), "sysctls": self.sysctls}))

    def cleanup(self):
        if self.done:
            return
        self.done = True
        for p in reversed(self.procs):
            try:
                p.stop(grace=2.0)
                p.close()
            except Exception as e:  # keep going: cleanup must finish
                log(f"cleanup: stopping {p.name}: {e}")
        for ns in reversed(self.netns):
            subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL)
        for key, orig in self.sysctls.items():
            try:
                Path("/proc/sys/" + key.replace(".", "/")).write_text(orig)
                log(f"sysctl {key} restored to {orig}")
            except OSError as e:
                log(f"cleanup: restoring {key}: {e}")
        if self.state_file and self.state_file.exists():
            self.state_file.unlink()


REG = Registry()


def install_signal_handlers():
    def handler(signum, _frame):
        # Ignore further signals while we unwind; cleanup runs in finally.
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)
        raise Interrupted(f"signal {signum}")

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, handler)
    atexit.register(REG.cleanup)


def recover_stale(state_file: Path, prefix_re):
    """Undo what a killed earlier run left: restore sysctls it raised and
    delete its namespaces — only if that run's PID is gone."""
    import re

    if state_file.exists():
        try:
            st = json.loads(state_file.read_text())
            if not _alive(int(st.get("pid", 0))):
                for key, orig in st.get("sysctls", {}).items():
                    Path("/proc/sys/" + key.replace(".", "/")).write_text(orig)
                    log(f"recovered: sysctl {key} restored to {orig}")
                state_file.unlink()
        except (ValueError, OSError) as e:
            log(f"recover: {e}")
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        name = line.split()[0] if line.split() else ""
        m = re.match(prefix_re, name)
        if m and not _alive(int(m.group(1))):
            subprocess.run(["ip", "netns", "del", name])
            log(f"recovered: deleted stale netns {name}")


# -- what the harness needs installed -------------------------------------------

def ensure_packages(pkgs) -> dict[str, str]:
    """apt-get install what is missing; return {package: error} for failures."""
    def installed(p):
        r = subprocess.run(["dpkg-query", "-W", "-f=${Status}", p], capture_output=True, text=True)
        return r.returncode == 0 and "install ok installed" in r.stdout

    missing = [p for p in pkgs if not installed(p)]
    failed = {}
    if not missing:
        return failed
    log(f"installing {' '.join(missing)}")
    envv = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    apt = ["apt-get", "install", "-y", "--no-install-recommends"]
    r = subprocess.run(apt + missing, env=envv, capture_output=True, text=True)
    if r.returncode != 0:
        subprocess.run(["apt-get", "update"], env=envv, capture_output=True)
        for p in missing:
            r = subprocess.run(apt + [p], env=envv, capture_output=True, text=True)
            if r.returncode != 0:
                failed[p] = (r.stderr.strip().splitlines() or ["apt-get failed"])[-1]
    return failed


def cargo_build(pkg, timeout=1800) -> str | None:
    """cargo build --release -p PKG in the repository; None on success, else the error."""
    log(f"cargo build --release -p {pkg}")
    try:
        r = subprocess.run(["cargo", "build", "--release", "-p", pkg], cwd=Path(__file__).resolve().parents[2],
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"cargo build -p {pkg} timed out"
    if r.returncode != 0:
        lines = [l for l in r.stderr.splitlines() if l.startswith("error")]
        return f"cargo build -p {pkg} failed: " + ("; ".join(lines[:3]) or r.stderr[-300:])
    return None


def last_json(text: str):
    """The last JSON object printed in ``text`` (hurtle's ``--json`` prints one summary line; a
    log may have other lines before it), or the whole text as JSON; ``None`` if neither parses."""
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    try:
        return json.loads(text)
    except ValueError:
        return None


def matplotlib_or_reexec(script: str) -> None:
    """Makes sure matplotlib imports: Debian's python3-matplotlib belongs to /usr/bin/python3,
    which may not be the python3 first on PATH (e.g. under pyenv), so the script is started
    again under that one; exits with what to install if neither has it."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        syspy = "/usr/bin/python3"
        if os.path.exists(syspy) and os.path.realpath(sys.executable) != os.path.realpath(syspy):
            os.execv(syspy, [syspy, script] + sys.argv[1:])
        sys.exit("matplotlib missing: apt-get install python3-matplotlib (or pip install matplotlib)")
