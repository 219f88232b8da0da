"""hurtle's Python bindings, installed from the built wheel: files moved between two Python
processes on loopback (directly, and paired by code through a `hurtle relay` the test starts),
a wrong code, a usage error, Ctrl-C (of a sender, and of a receiver still waiting), a cancel and
a resume."""

import _thread
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

import hurtle

PEER = os.path.join(os.path.dirname(__file__), "peer.py")
CODE = "4242-acid-acorn-actor"

# A process a non-interactive shell starts in the background (`cmd &`) inherits SIGINT
# ignored: Python then installs no KeyboardInterrupt handler, `_thread.interrupt_main` does
# nothing, and the peers started below (which inherit it too) ignore the Ctrl-C these tests
# send: the Ctrl-C tests would fail or wait forever. Take Ctrl-C back (a handler, unlike an
# ignored signal, is reset to the default in the peers by exec).
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


class Peer:
    """A peer.py process and the JSON lines it prints."""

    def __init__(self, role, **opts):
        self.proc = subprocess.Popen(
            [sys.executable, PEER, role, json.dumps(opts)],
            stdout=subprocess.PIPE,
            text=True,
        )

    def line(self, timeout=30):
        """The next JSON line (the process is killed if none comes within `timeout`)."""
        timer = threading.Timer(timeout, self.proc.kill)
        timer.start()
        try:
            text = self.proc.stdout.readline()
        finally:
            timer.cancel()
        assert text, "the peer ended without a line (exit code %s)" % self.proc.poll()
        return json.loads(text)

    def until(self, pred, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            obj = self.line(timeout=deadline - time.monotonic())
            if pred(obj):
                return obj
        raise AssertionError("no such line within %s s" % timeout)

    def end(self, timeout=30):
        """The last line and the exit code."""
        last = None
        timer = threading.Timer(timeout, self.proc.kill)
        timer.start()
        try:
            for text in self.proc.stdout:
                last = json.loads(text)
            code = self.proc.wait()
        finally:
            timer.cancel()
        return last, code

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def peers():
    started = []

    def start(role, **opts):
        p = Peer(role, **opts)
        started.append(p)
        return p

    yield start
    for p in started:
        p.kill()


def receiver(peers, out, code=CODE, **opts):
    r = peers("receive", out=str(out), listen="127.0.0.1:0", code=code, **opts)
    ready = r.line()
    assert ready["code"] == code
    return r, ready["ready"]


def random_file(path, size):
    path.write_bytes(os.urandom(size))
    return path


def test_a_transfer_between_two_processes_is_byte_exact(tmp_path, peers):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    random_file(src / "a.bin", 5 << 20)
    random_file(src / "sub" / "b.bin", 123457)
    (src / "empty").write_bytes(b"")
    r, addr = receiver(peers, tmp_path / "out")
    s = peers("send", paths=[str(src)], to=addr, code=CODE, cold_start=True, channels=2)
    sent, code = s.end()
    assert code == 0, sent
    received, code = r.end()
    assert code == 0, received
    assert sent["summary"]["files"] == received["summary"]["files"] == 3
    assert sent["summary"]["bytes"] == (5 << 20) + 123457
    for name in ["a.bin", "sub/b.bin", "empty"]:
        assert (tmp_path / "out" / "src" / name).read_bytes() == (src / name).read_bytes()


def test_the_gil_is_released_and_events_come_while_it_runs(tmp_path, peers):
    random_file(tmp_path / "f.bin", 32 << 20)
    r, addr = receiver(peers, tmp_path / "out")
    ticks, stop = [], threading.Event()

    def sleeper():
        # Each pass needs the GIL back: it comes about once per 100 ms look if the transfer
        # holds the GIL, every millisecond or so if it does not.
        while not stop.is_set():
            time.sleep(0.001)
            ticks.append(time.monotonic())

    thread = threading.Thread(target=sleeper)
    thread.start()
    events = []
    try:
        summary = hurtle.send(
            str(tmp_path / "f.bin"),
            to=addr,
            code=CODE,
            cold_start=True,
            rate_fixed="400M",
            progress=lambda e: events.append((time.monotonic(), e)),
            progress_interval=0.05,
        )
    finally:
        stop.set()
        thread.join()
    assert r.end()[1] == 0
    assert summary["bytes"] == 32 << 20
    assert summary["rate"]["mode"] == "fixed"
    kinds = {e["event"] for _, e in events}
    assert {"phase", "progress", "file_started"} <= kinds, kinds
    moving = [t for t, e in events if e["event"] == "progress"]
    t0, t1 = moving[0], moving[-1]
    assert t1 - t0 > 0.2, "too short a transfer to judge"
    per_second = sum(1 for t in ticks if t0 <= t <= t1) / (t1 - t0)
    assert per_second > 100, per_second
    last = [e for _, e in events if e["event"] == "progress"][-1]
    assert last["confirmed"] == last["total"] == 32 << 20


def test_a_wrong_code_raises_refused(tmp_path, peers):
    (tmp_path / "f").write_bytes(b"x")
    r, addr = receiver(peers, tmp_path / "out")
    with pytest.raises(hurtle.RefusedError) as e:
        hurtle.send(str(tmp_path / "f"), to=addr, code="4242-acid-acorn-adobe", cold_start=True)
    assert isinstance(e.value, hurtle.Error)
    assert (e.value.kind, e.value.exit_code) == ("refused", 3)
    # The receiver is still waiting; Ctrl-C ends it cleanly.
    r.proc.send_signal(signal.SIGINT)
    last, code = r.end()
    assert (last, code) == ({"interrupted": True}, 130)
    assert not (tmp_path / "out" / "f").exists()


def test_bad_options_raise_usage_errors_before_anything_starts(tmp_path):
    (tmp_path / "f").write_bytes(b"x")
    with pytest.raises(hurtle.UsageError, match="ambiguous") as e:
        hurtle.send(str(tmp_path / "f"), to="127.0.0.1:9", code=CODE, rate="100Mb")
    assert e.value.exit_code == 2
    with pytest.raises(hurtle.UsageError, match="channels"):
        hurtle.send(str(tmp_path / "f"), to="127.0.0.1:9", code=CODE, channels=0)
    with pytest.raises(hurtle.UsageError, match="bad code"):
        hurtle.receive(str(tmp_path / "out"), listen="127.0.0.1:0", code="nope")
    with pytest.raises(hurtle.StorageError):
        hurtle.receive(str(tmp_path / "f"), listen="127.0.0.1:0", code=CODE)


def test_ctrl_c_cancels_the_sender_and_keeps_what_was_verified(tmp_path, peers):
    big = random_file(tmp_path / "big.bin", 64 << 20)
    r, addr = receiver(peers, tmp_path / "out")
    s = peers(
        "send",
        paths=[str(big)],
        to=addr,
        code=CODE,
        cold_start=True,
        rate_fixed="200M",
        events=True,
        progress_interval=0.05,
    )
    s.until(lambda o: o.get("event") == "progress" and o["confirmed"] > (4 << 20))
    s.proc.send_signal(signal.SIGINT)
    last, code = s.end()
    assert (last, code) == ({"interrupted": True}, 130)
    last, code = r.end()
    # The receiver hears that the sender was interrupted: a network failure on its side.
    assert (last["error"], last["kind"], code) == ("NetworkError", "network", 4), last
    assert not (tmp_path / "out" / "big.bin").exists()
    parts = [p for p in os.listdir(tmp_path / "out") if p.endswith(".hurtle-part")]
    assert parts, os.listdir(tmp_path / "out")


def test_a_cancelled_transfer_resumes(tmp_path, peers):
    big = random_file(tmp_path / "big.bin", 48 << 20)
    out = tmp_path / "out"
    r, addr = receiver(peers, out)
    kept = []

    def cancel_at_a_quarter(e):
        if e["event"] == "progress" and e["total"] and e["confirmed"] >= e["total"] // 4:
            kept.append(e["confirmed"])
            raise RuntimeError("enough")

    with pytest.raises(RuntimeError, match="enough"):
        hurtle.send(
            str(big),
            to=addr,
            code=CODE,
            cold_start=True,
            rate_fixed="200M",
            progress=cancel_at_a_quarter,
            progress_interval=0.05,
        )
    assert r.end()[1] == 4
    r, addr = receiver(peers, out)
    summary = hurtle.send(str(big), to=addr, code=CODE, cold_start=True)
    assert r.end()[1] == 0
    assert summary["bytes"] == 48 << 20
    # What was confirmed at the cancel is not sent again (less the blocks still being written
    # then: one 1 MiB block per channel at most).
    assert summary["resumed_bytes"] > 0
    assert summary["resumed_bytes"] + (8 << 20) >= kept[0], (summary["resumed_bytes"], kept)
    assert (out / "big.bin").read_bytes() == big.read_bytes()


def test_ctrl_c_ends_a_waiting_receiver_at_once_and_frees_its_port(tmp_path, peers):
    heard = {}

    def ready(addr, code):
        heard["addr"] = addr
        # Ctrl-C, as the main thread gets it, while the receiver waits for a sender.
        threading.Timer(0.3, _thread.interrupt_main).start()

    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        hurtle.receive(str(tmp_path / "out"), listen="127.0.0.1:0", code=CODE, ready=ready)
    assert time.monotonic() - started < 2.5
    # The wait has ended, not just been left: its port is free for the next receiver.
    data = random_file(tmp_path / "f.bin", 300_000)
    r = peers("receive", out=str(tmp_path / "out"), listen=heard["addr"], code=CODE)
    assert r.line() == {"ready": heard["addr"], "code": CODE}
    summary = hurtle.send(str(data), to=heard["addr"], code=CODE, cold_start=True)
    assert summary["bytes"] == 300_000
    assert r.end()[1] == 0
    assert (tmp_path / "out" / "f.bin").read_bytes() == data.read_bytes()


def hurtle_binary():
    """The `hurtle` command (scripts/test-python.sh builds it and names it in HURTLE_BIN)."""
    path = os.environ.get("HURTLE_BIN") or os.path.join(
        os.path.dirname(__file__), "..", "..", "..", "target", "debug", "hurtle"
    )
    if not os.access(path, os.X_OK):
        pytest.fail("no hurtle binary at %s: build it (cargo build -p hurtle) or set HURTLE_BIN" % path)
    return path


@pytest.fixture
def relay():
    """A `hurtle relay` on loopback: its address."""
    proc = subprocess.Popen(
        [hurtle_binary(), "relay", "--listen", "127.0.0.1:0"],
        stderr=subprocess.PIPE,
        text=True,
    )
    timer = threading.Timer(30, proc.kill)
    timer.start()
    try:
        line = proc.stderr.readline()
    finally:
        timer.cancel()
    try:
        found = re.search(r"listening on (\S+)", line)
        assert found, "the relay said %r (exit code %s)" % (line, proc.poll())
        yield found.group(1)
    finally:
        proc.kill()
        proc.wait()


def test_a_send_and_a_receive_pair_by_code_through_a_relay(tmp_path, peers, relay):
    src = tmp_path / "src"
    src.mkdir()
    random_file(src / "a.bin", 3 << 20)
    random_file(src / "b.bin", 4097)
    r = peers("receive", out=str(tmp_path / "out"), listen="127.0.0.1:0", relay=relay)
    ready = r.line()
    code = ready["code"]
    assert re.fullmatch(r"\d+-[a-z]+-[a-z]+", code), code
    summary = hurtle.send(str(src), relay=relay, code=code, cold_start=True, checksum=True)
    assert summary["files"] == 2 and summary["bytes"] == (3 << 20) + 4097
    received, exit_code = r.end()
    assert exit_code == 0, received
    assert received["summary"]["bytes"] == summary["bytes"]
    for name in ["a.bin", "b.bin"]:
        assert (tmp_path / "out" / "src" / name).read_bytes() == (src / name).read_bytes()


def test_a_wrong_code_through_a_relay_raises_refused(tmp_path, peers, relay):
    (tmp_path / "f").write_bytes(b"secret")
    r = peers("receive", out=str(tmp_path / "out"), listen="127.0.0.1:0", relay=relay)
    code = r.line()["code"]
    # The relay finds the receiver by the number; the words are the receiver's to check.
    number, *words = code.split("-")
    wrong = "-".join([number] + words[:-1] + ["acid" if words[-1] != "acid" else "acorn"])
    with pytest.raises(hurtle.RefusedError) as e:
        hurtle.send(str(tmp_path / "f"), relay=relay, code=wrong, cold_start=True)
    assert (e.value.kind, e.value.exit_code) == ("refused", 3)
    # The receiver is still waiting for the right code; Ctrl-C ends it cleanly.
    r.proc.send_signal(signal.SIGINT)
    assert r.end() == ({"interrupted": True}, 130)
    assert not (tmp_path / "out" / "f").exists()


def listing(d):
    return sorted(n for n in os.listdir(d) if not n.startswith("."))


def test_filters_a_dry_run_and_delete_mirror_the_flags(tmp_path, peers):
    src = tmp_path / "src"
    src.mkdir()
    for name in ["a.bin", "b.tmp", "keep.tmp"]:
        random_file(src / name, 1000)
    out = tmp_path / "out"
    (out / "src").mkdir(parents=True)
    (out / "src" / "old.bin").write_bytes(b"old")
    opts = dict(include="keep.tmp", exclude=["*.tmp"], delete=True, cold_start=True)
    r, addr = receiver(peers, out, allow_delete=True)
    plan = hurtle.send(str(src), to=addr, code=CODE, dry_run=True, **opts)
    assert r.end()[1] == 0
    assert listing(out / "src") == ["old.bin"], "a dry run changes nothing"
    said = json.dumps(plan)
    assert "a.bin" in said and "keep.tmp" in said and "b.tmp" not in said, said
    r, addr = receiver(peers, out, allow_delete=True)
    hurtle.send(str(src), to=addr, code=CODE, **opts)
    assert r.end()[1] == 0
    assert listing(out / "src") == ["a.bin", "keep.tmp"]


def test_wait_lets_the_receiver_start_later(tmp_path, peers):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        addr = "127.0.0.1:%d" % s.getsockname()[1]
    data = random_file(tmp_path / "f.bin", 4096)
    with pytest.raises(hurtle.NetworkError):
        hurtle.send(str(data), to=addr, code=CODE, cold_start=True)
    started = []
    timer = threading.Timer(
        1.0,
        lambda: started.append(peers("receive", out=str(tmp_path / "out"), listen=addr, code=CODE)),
    )
    timer.start()
    try:
        summary = hurtle.send(str(data), to=addr, code=CODE, wait=20, cold_start=True)
    finally:
        timer.cancel()
    assert summary["bytes"] == 4096
    assert started[0].end()[1] == 0
    assert (tmp_path / "out" / "f.bin").read_bytes() == data.read_bytes()


def keygen_identity(path):
    """A new identity key in `path` (by the command): its public key line."""
    done = subprocess.run(
        [hurtle_binary(), "keygen", "--identity", "--out", str(path)],
        capture_output=True, text=True, timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_identity_keys_replace_the_code(tmp_path, peers):
    keygen_identity(tmp_path / "receiver.id")
    (tmp_path / "authorized").write_text(keygen_identity(tmp_path / "sender.id") + " lab\n")
    data = random_file(tmp_path / "f.bin", 70_000)
    r = peers(
        "receive",
        out=str(tmp_path / "out"),
        listen="127.0.0.1:0",
        identity=str(tmp_path / "receiver.id"),
        authorized=str(tmp_path / "authorized"),
    )
    ready = r.line()
    assert ready["code"] is None, ready
    known = tmp_path / "known_receivers"
    summary = hurtle.send(
        str(data),
        to=ready["ready"],
        identity=str(tmp_path / "sender.id"),
        known_receivers=str(known),
        cold_start=True,
    )
    assert summary["bytes"] == 70_000
    assert r.end()[1] == 0
    assert (tmp_path / "out" / "f.bin").read_bytes() == data.read_bytes()
    assert known.read_text().strip(), "the receiver is pinned"


def test_a_sender_first_prints_a_code_and_the_receiver_given_it_receives(tmp_path, peers, relay):
    data = random_file(tmp_path / "first.bin", 1 << 20)
    s = peers("send", paths=[str(data)], relay=relay, cold_start=True, events=True)
    offered = None
    for _ in range(50):
        line = s.line()
        if line.get("event") == "waiting":
            offered = line
            break
    assert offered and offered["for"] == "receiver" and offered["valid"] > 0, offered
    code = offered["code"]
    summary = hurtle.receive(
        str(tmp_path / "out"), listen="127.0.0.1:0", relay=relay, sender_code=code
    )
    assert summary["bytes"] == 1 << 20
    sent, exit_code = s.end()
    assert exit_code == 0, sent
    assert sent["summary"]["bytes"] == 1 << 20
    assert (tmp_path / "out" / "first.bin").read_bytes() == data.read_bytes()
