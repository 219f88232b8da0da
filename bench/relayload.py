#!/usr/bin/env python3
"""Many paired sessions on one relay, on loopback: what each costs the relay, and whether a new
pairing is still quick with all the others open.

For each of N sessions: a receiver registers (its agent connection stays open, pinging), a
sender looks the nameplate up, asks for one UDP allocation, and both ends bind a UDP socket to
it; then every pair sends a few datagrams each way through the relay. With all N open, a last
session is paired and timed. Prints the relay's memory (RSS) before and with N sessions, its
CPU seconds, the pairing times (register to allocated) and what its metrics endpoint counted.

    python3 bench/relayload.py --sessions 1000 --bin target/release/hurtle

Everything runs on 127.0.0.1; the relay is this script's child and ends with it.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import struct
import subprocess
import sys
import time
import threading
import urllib.request


def frame(msg: dict) -> bytes:
    body = json.dumps(msg).encode()
    return struct.pack(">H", len(body)) + body


def read_msg(s: socket.socket) -> dict:
    def exact(n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = s.recv(n - len(out))
            if not chunk:
                raise ConnectionError("closed")
            out += chunk
        return out
    (n,) = struct.unpack(">H", exact(2))
    return json.loads(exact(n))


def bind_request(token_hex: str) -> bytes:
    # TAG, 'b', token (16), nonce (8), padding to 64 (relay::udp::bind_request).
    return bytes([0xF1, ord("b")]) + bytes.fromhex(token_hex) + os.urandom(8) + bytes(64 - 26)


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Session:
    def __init__(self, relay: tuple[str, int], index: int):
        self.relay = relay
        # Each sender from a loopback address of its own, as senders come from many hosts (the
        # relay caps allocations per client address).
        me = (f"127.{100 + index // 62500}.{index // 250 % 250}.{index % 250 + 1}", 0)
        t0 = time.monotonic()
        self.agent = socket.create_connection(relay, timeout=10)
        self.agent.sendall(frame({"t": "register", "port": 9, "candidates": []}))
        nameplate = read_msg(self.agent)["nameplate"]
        read_msg(self.agent)  # registered
        look = socket.create_connection(relay, timeout=10, source_address=me)
        look.sendall(frame({"t": "lookup", "nameplate": nameplate}))
        ticket = read_msg(look)["ticket"]
        look.sendall(frame({"t": "path", "relayed": True}))
        look.close()
        alloc = socket.create_connection(relay, timeout=10, source_address=me)
        alloc.sendall(frame({"t": "allocate", "ticket": ticket, "channels": 1}))
        got = read_msg(alloc)
        alloc.close()
        if got.get("t") != "allocated":
            raise RuntimeError(f"allocate: {got}")
        mine, port = got["tokens"][0], got["port"]
        while True:
            m = read_msg(self.agent)
            if m["t"] == "udp":
                theirs = m["tokens"][0]
                break
        self.paired_s = time.monotonic() - t0
        self.udp = (relay[0], port)
        self.a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.a.bind(("127.0.0.1", 0))
        self.b.bind(("127.0.0.1", 0))
        for s in (self.a, self.b):
            s.settimeout(2.0)
        self.a.sendto(bind_request(mine), self.udp)
        self.a.recvfrom(128)
        self.b.sendto(bind_request(theirs), self.udp)
        self.b.recvfrom(128)

    def exchange(self, count: int) -> int:
        got = 0
        for _ in range(count):
            self.a.sendto(b"\x21" * 1200, self.udp)
            try:
                self.b.recvfrom(2048)
                got += 1
            except socket.timeout:
                pass
        return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--datagrams", type=int, default=10, help="each way per session")
    ap.add_argument("--bin", default="target/release/hurtle")
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))
    relay = subprocess.Popen(
        [args.bin, "relay", "--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0",
         "--max-connections", str(args.sessions + 64), "--max-codes", str(args.sessions + 64),
         # Every receiver registers from 127.0.0.1: one address, above the per-address defaults.
         "--codes-per-address", str(args.sessions + 64),
         "--connections-per-address", str(args.sessions + 64),
         "--lookup-burst", str(args.sessions * 4), "--lookup-per-sec", "100000"],
        stderr=subprocess.PIPE, text=True)
    try:
        listen = metrics = None
        while listen is None or metrics is None:
            line = relay.stderr.readline()
            if not line:
                sys.exit("the relay did not start")
            if "listening on" in line:
                host, port = line.rsplit(" ", 1)[1].strip().rsplit(":", 1)
                listen = (host, int(port))
            if "metrics on" in line:
                metrics = line.rsplit(" ", 1)[1].strip()
        # The relay logs a line per pairing: keep reading them, or its writes block.
        threading.Thread(target=lambda: [None for _ in relay.stderr], daemon=True).start()
        idle_rss = rss_kib(relay.pid)
        cpu0 = cpu_s(relay.pid)
        sessions = []
        t0 = time.monotonic()
        for i in range(args.sessions):
            sessions.append(Session(listen, i))
            if (i + 1) % 100 == 0:
                print(f"{i + 1} sessions", file=sys.stderr, flush=True)
        setup_s = time.monotonic() - t0
        delivered = sum(s.exchange(args.datagrams) for s in sessions)
        rss = rss_kib(relay.pid)
        # One more pairing with all the others open.
        last = Session(listen, args.sessions)
        cpu = cpu_s(relay.pid) - cpu0
        times = sorted(s.paired_s for s in sessions)
        counted = urllib.request.urlopen(metrics).read().decode()
        forwarded = next((l.split()[-1] for l in counted.splitlines()
                          if l.startswith("hurtle_relay_udp_forwarded_datagrams_total")), "?")
        print(f"sessions={args.sessions} set_up_in_s={setup_s:.2f} "
              f"pairing_ms_p50={statistics.median(times) * 1e3:.1f} "
              f"pairing_ms_p99={times[int(len(times) * 0.99) - 1] * 1e3:.1f} "
              f"pairing_ms_with_all_open={last.paired_s * 1e3:.1f}")
        print(f"relay_rss_kib idle={idle_rss} with_sessions={rss} "
              f"per_session_kib={(rss - idle_rss) / args.sessions:.1f} relay_cpu_s={cpu:.2f}")
        print(f"datagrams delivered={delivered} of {args.sessions * args.datagrams}; "
              f"relay counted forwarded={forwarded}")
    finally:
        relay.kill()
        relay.wait()


if __name__ == "__main__":
    main()
