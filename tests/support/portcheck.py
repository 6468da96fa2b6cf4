"""Servers and clients for hostPort tests: a server in a netns answers each request with its token.

``Server`` listens on every address of its netns (TCP or UDP, IPv4 and IPv6) and answers any
datagram or connection with ``token``; :func:`ask` sends one request from a netns (None: the
test's own) and returns the answer, or "" when none came within the timeout.
"""

from __future__ import annotations

import subprocess
import sys

__all__ = ["Server", "ask"]

_SERVE = r"""
import socket, sys, threading
proto, port, token = sys.argv[1], int(sys.argv[2]), sys.argv[3].encode()
kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
socks = []
for fam, addr in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
    s = socket.socket(fam, kind)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if fam == socket.AF_INET6:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    s.bind((addr, port))
    if kind == socket.SOCK_STREAM:
        s.listen(16)
    socks.append(s)
def serve(s):
    while True:
        if kind == socket.SOCK_STREAM:
            c, _ = s.accept()
            with c:
                c.recv(64)
                c.sendall(token)
        else:
            _, peer = s.recvfrom(64)
            s.sendto(token, peer)
for s in socks:
    threading.Thread(target=serve, args=(s,), daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
"""

_ASK = r"""
import socket, sys
proto, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
s = socket.socket(fam, kind)
s.settimeout(float(sys.argv[4]))
if int(sys.argv[5]) or sys.argv[6]:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[6] or ("::" if fam == socket.AF_INET6 else "0.0.0.0"), int(sys.argv[5])))
try:
    if kind == socket.SOCK_STREAM:
        s.connect((addr, port)); s.sendall(b"ping"); print(s.recv(64).decode())
    else:
        s.sendto(b"ping", (addr, port)); print(s.recv(64).decode())
except OSError:
    print("")
"""


def _argv(netns: str | None, *rest: str) -> list[str]:
    return ["ip", "netns", "exec", netns, sys.executable, *rest] if netns else [sys.executable, *rest]


class Server:
    """A token server in ``netns`` on ``port`` for ``protocol`` (tcp or udp); close() stops it."""

    def __init__(self, netns: str, port: int, token: str, protocol: str = "tcp") -> None:
        self.proc = subprocess.Popen(
            _argv(netns, "-c", _SERVE, protocol, str(port), token),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if line != "ready":
            self.close()
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise AssertionError(f"the server in {netns} did not start: {err}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


def ask(
    netns: str | None,
    address: str,
    port: int,
    protocol: str = "tcp",
    timeout: float = 3.0,
    source_port: int = 0,
    source: str = "",
) -> str:
    """The answer of whatever serves ``address``:``port`` as seen from ``netns``; "" for none.
    ``source_port``: send from that port (one UDP flow across calls), else any; ``source``: from
    that address (as ``curl --interface``), else the route's."""
    done = subprocess.run(
        _argv(netns, "-c", _ASK, protocol, address, str(port), str(timeout), str(source_port), source),
        capture_output=True,
        text=True,
        timeout=timeout + 30,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()

