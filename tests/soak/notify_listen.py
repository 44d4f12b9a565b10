#!/usr/bin/env python3
"""notify_listen.py: stands in for systemd's notification socket. Binds a unix datagram
socket at PATH (give it to a daemon as NOTIFY_SOCKET) and appends every message it receives,
one line per field (READY=1, STATUS=..., WATCHDOG=1), to LOG, until SIGTERM."""
import os
import signal
import socket
import sys

path, log = sys.argv[1], sys.argv[2]
try:
    os.unlink(path)
except FileNotFoundError:
    pass
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(path)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
with open(log, "a", buffering=1) as out:
    out.write("LISTENING=1\n")
    try:
        while True:
            msg = s.recv(65536).decode("utf-8", "replace")
            for field in msg.split("\n"):
                if field:
                    out.write(field + "\n")
    finally:
        os.unlink(path)
