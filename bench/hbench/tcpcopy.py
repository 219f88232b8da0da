#!/usr/bin/env python3
"""Plain single-stream TCP file copy, the simplest baseline.

    tcpcopy.py recv --listen ADDR:PORT --out FILE
    tcpcopy.py send FILE --to ADDR:PORT

The sender uses sendfile(2) (zero copy); the receiver reads into a 4 MiB
buffer and writes the file. No framing: the receiver writes until EOF. Socket
buffers are left to the kernel's autotuning (tcp_rmem/tcp_wmem).
"""
import argparse
import os
import socket
import sys


def split(hp):
    host, _, port = hp.rpartition(":")
    return host.strip("[]"), int(port)


def recv(args):
    host, port = split(args.listen)
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(fam, socket.SOCK_STREAM) as ls:
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind((host, port))
        ls.listen(1)
        conn, _ = ls.accept()
        buf = bytearray(4 << 20)
        view = memoryview(buf)
        total = 0
        with conn, open(args.out, "wb") as f:
            while True:
                n = conn.recv_into(buf)
                if n == 0:
                    break
                f.write(view[:n])
                total += n
    print(total)


def send(args):
    host, port = split(args.to)
    with socket.create_connection((host, port), timeout=30) as s:
        s.settimeout(None)
        with open(args.file, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            sent = s.sendfile(f)
        s.shutdown(socket.SHUT_WR)
        # Wait for the receiver to close: it has then read everything.
        s.recv(1)
    if sent != size:
        sys.exit(f"sent {sent} of {size} bytes")
    print(sent)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("recv")
    r.add_argument("--listen", required=True)
    r.add_argument("--out", required=True)
    s = sub.add_parser("send")
    s.add_argument("file")
    s.add_argument("--to", required=True)
    a = p.parse_args()
    recv(a) if a.cmd == "recv" else send(a)


if __name__ == "__main__":
    main()
