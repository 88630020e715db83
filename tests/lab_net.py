"""A TCP stream between two lab hosts: ``lab_net.py serve ADDR PORT`` accepts one
connection and reads it to the end; ``lab_net.py send ADDR PORT BYTES`` sends BYTES and
prints the payload rate in bytes/s, timed from the first byte to the receiver's
acknowledgement of the last. Large buffers keep Python's own work per byte small, so
a host with a fraction of a core still keeps up with its link."""

from __future__ import annotations

import socket
import sys
import time

CHUNK = 4 << 20
mode, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "serve":
    srv = socket.create_server((addr, port))
    print("ready", flush=True)
    conn, _ = srv.accept()
    total = int.from_bytes(conn.recv(8, socket.MSG_WAITALL), "big")
    buf = memoryview(bytearray(CHUNK))
    got = 0
    while got < total:
        n = conn.recv_into(buf, min(CHUNK, total - got))
        if not n:
            break
        got += n
    conn.sendall(b"k")
else:
    total = int(float(sys.argv[4]))
    s = socket.create_connection((addr, port), timeout=60)
    chunk = memoryview(b"x" * CHUNK)
    t0 = time.perf_counter()
    s.sendall(total.to_bytes(8, "big"))
    sent = 0
    while sent < total:
        n = min(CHUNK, total - sent)
        s.sendall(chunk[:n])
        sent += n
    s.recv(1)
    print(total / (time.perf_counter() - t0))
