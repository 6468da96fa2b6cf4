"""A node's pods at once: every shim connecting while the daemon is busy lands in its listen backlog.

A node that gets its ``maxPods`` (110) in one wave starts that many ``netplugin-cni`` processes at
once. A unix socket refuses a connection outright (EAGAIN) when its listen backlog is full, and
asyncio's default backlog is 100. The daemon is stopped (SIGSTOP: it accepts nothing), 150
connections are made, then it goes on and answers every one of them: an ordering test, no timing.
"""

from __future__ import annotations

import json
import os
import signal
import socket
from typing import Any

from netplugin.frontends.daemon.listener import BACKLOG

AT_ONCE = 150  # more than a node's default maxPods, and than asyncio's default backlog


def test_a_node_worth_of_connections_at_once_is_accepted_and_answered(start_daemon: Any) -> None:
    assert BACKLOG >= AT_ONCE
    d = start_daemon()
    socks: list[socket.socket] = []
    os.kill(d.proc.pid, signal.SIGSTOP)
    try:
        for _ in range(AT_ONCE):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)
            s.connect(d.socket)  # BlockingIOError (EAGAIN) once the backlog is full
            socks.append(s)
    finally:
        os.kill(d.proc.pid, signal.SIGCONT)
    for s in socks:
        s.setblocking(True)
        s.settimeout(60)
        s.sendall(json.dumps({"v": 1, "op": "health"}).encode() + b"\n")
    for s in socks:
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            assert chunk, "the daemon closed a connection without answering"
            buf += chunk
        s.close()
        assert json.loads(buf)["ok"] is True
