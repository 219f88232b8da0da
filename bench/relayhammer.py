#!/usr/bin/env python3
"""One address hammers a relay while honest clients pair through it: how long a new pairing
takes meanwhile, and what the relay refused.

For --seconds, threads at 127.0.0.2 open connections as fast as they can: registrations held
open, connections that say nothing, and lookups of random nameplates (each closed after its
answer). Meanwhile, every --every seconds, an honest receiver registers from 127.0.0.1 and a
sender (at 127.0.9.1, 127.0.9.2, ...) looks its nameplate up; the time from connecting to register until the
lookup's `found` is one pairing. Prints the pairing times, how many of the hammer's requests
were refused, and the relay's limits-hit counters.

    python3 bench/relayhammer.py --bin target/release/hurtle

Everything runs on loopback; the relay is this script's child and ends with it.
"""
from __future__ import annotations

import argparse
import json
import random
import resource
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
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


def connect(relay: tuple[str, int], source: str) -> socket.socket:
    return socket.create_connection(relay, timeout=10, source_address=(source, 0))


def hammer(relay: tuple[str, int], kind: str, until: float, held: list, counts: dict,
           lock: threading.Lock) -> None:
    while time.monotonic() < until:
        try:
            s = connect(relay, "127.0.0.2")
        except OSError:
            with lock:
                counts["connect_failed"] += 1
            continue
        try:
            if kind == "idle":
                s.settimeout(0.05)
                try:
                    answer = read_msg(s)  # refused at once, or nothing (held)
                    with lock:
                        counts[answer.get("kind", "?")] += 1
                    s.close()
                except (socket.timeout, OSError):
                    held.append(s)
                continue
            if kind == "register":
                s.sendall(frame({"t": "register", "port": 9, "candidates": []}))
            else:
                s.sendall(frame({"t": "lookup", "nameplate": random.randrange(1000, 10000)}))
            answer = read_msg(s)
            key = answer.get("kind", answer["t"])
            with lock:
                counts[key] += 1
            if kind == "register" and answer["t"] == "nameplate":
                held.append(s)
            else:
                s.close()
        except (OSError, ConnectionError, ValueError):
            with lock:
                counts["broken"] += 1
            s.close()


def pair(relay: tuple[str, int], i: int) -> float:
    t0 = time.monotonic()
    agent = connect(relay, "127.0.0.1")
    agent.sendall(frame({"t": "register", "port": 9, "candidates": []}))
    nameplate = read_msg(agent)["nameplate"]
    # Each sender from an address of its own (one address's lookups are rate limited).
    look = connect(relay, f"127.0.{9 + i // 250}.{i % 250 + 1}")
    look.sendall(frame({"t": "lookup", "nameplate": nameplate}))
    found = read_msg(look)
    took = time.monotonic() - t0
    if found.get("t") != "found":
        raise RuntimeError(f"honest lookup: {found}")
    look.close()
    agent.close()
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default="target/release/hurtle")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--every", type=float, default=0.1)
    ap.add_argument("--threads", type=int, default=2, help="per kind of hammering")
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))
    relay_proc = subprocess.Popen(
        [args.bin, "relay", "--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0"],
        stderr=subprocess.PIPE, text=True)
    try:
        listen = metrics = None
        while listen is None or metrics is None:
            line = relay_proc.stderr.readline()
            if not line:
                sys.exit("the relay did not start")
            if "listening on" in line:
                host, port = line.rsplit(" ", 1)[1].strip().rsplit(":", 1)
                listen = (host, int(port))
            if "metrics on" in line:
                metrics = line.rsplit(" ", 1)[1].strip()
        threading.Thread(target=lambda: [None for _ in relay_proc.stderr], daemon=True).start()
        until = time.monotonic() + args.seconds
        held: list = []
        counts: dict = {k: 0 for k in ["nameplate", "found", "limited", "rate_limited",
                                        "no_such_code", "busy", "timeout", "broken",
                                        "connect_failed", "?"]}
        lock = threading.Lock()
        hammers = [threading.Thread(target=hammer, args=(listen, kind, until, held, counts, lock))
                   for kind in ("register", "idle", "lookup") for _ in range(args.threads)]
        for h in hammers:
            h.start()
        times = []
        while time.monotonic() < until:
            times.append(pair(listen, len(times)))
            time.sleep(args.every)
        for h in hammers:
            h.join()
        text = urllib.request.urlopen(metrics, timeout=10).read().decode()
        limits = [l for l in text.splitlines()
                  if l.startswith(("hurtle_relay_limits_hit_total", "hurtle_relay_refusals_total"))
                  and not l.endswith(" 0")]
        ms = sorted(t * 1000 for t in times)
        print(f"hammer_seconds={args.seconds} held_by_hammer={len(held)} answers={counts}")
        print(f"pairings={len(ms)} pairing_ms_p50={statistics.median(ms):.1f} "
              f"p99={ms[int(0.99 * (len(ms) - 1))]:.1f} max={ms[-1]:.1f}")
        print("\n".join(limits))
        for s in held:
            s.close()
    finally:
        relay_proc.kill()
        relay_proc.wait()


if __name__ == "__main__":
    main()
