#!/usr/bin/env python3
"""What resuming a nearly finished file costs the sender, on loopback into tmpfs.

Each round sends a random file (4 GiB by default) at a fixed rate, interrupts the sender with
SIGINT once the receiver's journal lists 95% of its blocks, and resumes it twice over, side by
side in alternate rounds: with the sender's cache of block values off (`HURTLE_VALUE_CACHE=off`:
it reads and hashes every block the receiver holds) and on (the values kept by the interrupted
send). Prints one JSON line per resume (the sender's CPU-seconds, wall time, first new byte,
held blocks valued from the cache and read, the receiver's rejected blocks), then the medians.
Every resumed file is compared with its source.

    python3 bench/resume_cost.py [ROUNDS] [SIZE_GIB]

HURTLE_BIN names the binary (default target/release/hurtle). Needs about three times the file
size free in /dev/shm. Traffic stays on 127.0.0.1.
"""
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import time

BIN = os.environ.get("HURTLE_BIN", "target/release/hurtle")
ROOT = f"/dev/shm/hurtle-resume-cost-{os.getpid()}"
SRC, OUT, CACHE = f"{ROOT}/src/big.bin", f"{ROOT}/out", f"{ROOT}/cache"
MIB = 1 << 20
ENV = dict(os.environ, HURTLE_CODE="1234-acorn-bison-cedar", HURTLE_WAIT="0",
           HURTLE_PATH_MEMORY="off")
ARGS = ["--chunk-size", "1M", "--channels", "2"]


def receiver(extra=()):
    p = subprocess.Popen([BIN, "receive", "--listen", "127.0.0.1:0", "--out", OUT, *extra],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=ENV, text=True)
    deadline = time.time() + 10
    while time.time() < deadline:
        line = p.stdout.readline()
        if line.startswith("hurtle: listening on "):
            return p, line[len("hurtle: listening on "):].split(", receiving into")[0]
    p.kill()
    raise SystemExit("the receiver did not start")


def interrupt(blocks):
    """Sends until the journal lists 95% of the blocks, then SIGINT to the sender."""
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    r, addr = receiver()
    env = dict(ENV, HURTLE_VALUE_CACHE=CACHE)
    s = subprocess.Popen([BIN, "send", SRC, "--to", addr, "--rate", "1500M", *ARGS],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    journal = f"{OUT}/.big.bin.hurtle-blocks"
    deadline = time.time() + 300
    while time.time() < deadline and s.poll() is None:
        try:
            with open(journal) as f:
                if sum(1 for _ in f) - 1 >= int(blocks * 0.95):
                    break
        except FileNotFoundError:
            pass
        time.sleep(0.02)
    if s.poll() is not None:
        raise SystemExit("the send finished before it was interrupted")
    s.send_signal(signal.SIGINT)
    s.wait(60)
    r.wait(60)


def resume(cache):
    r, addr = receiver(["--json"])
    env = dict(ENV, HURTLE_VALUE_CACHE=CACHE if cache else "off")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    s = subprocess.run([BIN, "send", SRC, "--to", addr, "--json", *ARGS],
                       capture_output=True, env=env, text=True, timeout=300)
    wall = time.time() - t0
    # The receiver is reaped after this: only the sender's time is counted.
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    rout = r.stdout.read()
    r.wait(60)
    if s.returncode != 0:
        raise SystemExit(f"the resume failed: {s.stderr}")
    sj = json.loads([l for l in s.stdout.splitlines() if l.startswith("{")][-1])
    rj = json.loads([l for l in rout.splitlines() if l.startswith("{")][-1])
    subprocess.run(["cmp", SRC, f"{OUT}/big.bin"], check=True)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return dict(cache=cache, sender_cpu_s=round(cpu, 3), wall_s=round(wall, 3),
                first_data_ms=sj.get("first_data_ms"), resumed_mib=sj["resumed_bytes"] // MIB,
                cached=sj["resume_blocks_cached"], read=sj["resume_blocks_read"],
                rejected=rj.get("rejected_blocks"))


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    gib = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    blocks = gib * 1024
    os.makedirs(os.path.dirname(SRC))
    try:
        subprocess.run(["dd", "if=/dev/urandom", f"of={SRC}", "bs=4M", f"count={blocks // 4}",
                        "status=none"], check=True)
        # A source changed less than 3 s before a send opens it is not cached.
        time.sleep(3.5)
        rows = []
        for i in range(rounds):
            for cache in ((False, True) if i % 2 == 0 else (True, False)):
                interrupt(blocks)
                row = dict(round=i, **resume(cache))
                rows.append(row)
                print(json.dumps(row), flush=True)
        for cache in (False, True):
            mine = [r for r in rows if r["cache"] == cache]
            print(f"cache {'on ' if cache else 'off'}: median sender CPU-s "
                  f"{statistics.median(r['sender_cpu_s'] for r in mine):.3f}, "
                  f"median wall {statistics.median(r['wall_s'] for r in mine):.3f} s, "
                  f"over {len(mine)} resumes")
    finally:
        shutil.rmtree(ROOT, ignore_errors=True)


if __name__ == "__main__":
    main()
