#!/usr/bin/env python3
"""Plain single-stream TCP file copy, the simplest baseline.

    tcpcopy.py recv --listen ADDR:PORT --out FILE [--cc NAME]
    tcpcopy.py send FILE --to ADDR:PORT [--cc NAME]

The sender uses sendfile(2) (zero copy); the receiver reads into a 4 MiB
buffer and writes the file. No framing: the receiver writes until EOF. Socket
buffers are left to the kernel's autotuning (tcp_rmem/tcp_wmem). ``--cc`` sets the
congestion control of the socket (TCP_CONGESTION; root may pick any the kernel has),
so bbr and cubic baselines can run in the same namespaces.
"""
import argparse
import os
import socket
import sys


def split(hp):
    host, _, port = hp.rpartition(":")
    return host.strip("[]"), int(port)


def set_cc(sock, cc):
    if cc:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc.encode())


def recv(args):
    host, port = split(args.listen)
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(fam, socket.SOCK_STREAM) as ls:
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        set_cc(ls, args.cc)
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
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(fam, socket.SOCK_STREAM) as s:
        set_cc(s, args.cc)  # before connecting: the handshake already uses it
        s.settimeout(30)
        s.connect((host, port))
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
    r.add_argument("--cc", help="TCP congestion control of the socket (default: the namespace's)")
    s = sub.add_parser("send")
    s.add_argument("file")
    s.add_argument("--to", required=True)
    s.add_argument("--cc", help="TCP congestion control of the socket (default: the namespace's)")
    a = p.parse_args()
    recv(a) if a.cmd == "recv" else send(a)


if __name__ == "__main__":
    main()
