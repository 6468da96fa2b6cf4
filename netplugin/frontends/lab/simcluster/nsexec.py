"""Network namespace plumbing for the simulated cluster: ``ip`` commands and sockets in a netns."""

from __future__ import annotations

import json
import os
import socket
from typing import Any

from netplugin.core.errors import SystemFailure
from netplugin.core.execplugin.invoke import SpawnError, run
from netplugin.core.netns import run_in_netns

__all__ = ["ip", "ip_json", "netns_exists", "socket_in_netns"]


def ip(*args: str, check: bool = True, timeout: float = 20.0) -> str:
    """Run ``ip ARGS``; its stdout. SystemFailure naming the command when it fails (and ``check``)."""
    try:
        done = run(["ip", *args], env=os.environ, timeout=timeout)
    except SpawnError as e:
        raise SystemFailure("cannot run ip (install iproute2)", None, e.reason) from e
    if check and done.returncode != 0:
        raise SystemFailure("ip " + " ".join(args), None, done.stderr.decode(errors="replace").strip())
    return done.stdout.decode()


def ip_json(*args: str) -> list[dict[str, Any]]:
    out = ip("-j", *args).strip()
    doc = json.loads(out) if out else []
    return doc if isinstance(doc, list) else []


def netns_exists(name: str) -> bool:
    return os.path.exists(f"/var/run/netns/{name}")


def socket_in_netns(netns: str, family: socket.AddressFamily, address: tuple[Any, ...]) -> socket.socket:
    """A TCP socket bound to ``address`` inside network namespace ``netns``.

    ``setns(2)`` moves only the calling thread, so a throwaway thread enters the namespace,
    binds, and ends; the socket stays in that namespace for its whole life, and this
    process can serve on it from any thread.
    """

    def bind() -> socket.socket:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
        except BaseException:
            sock.close()
            raise
        return sock

    try:
        return run_in_netns(f"/var/run/netns/{netns}", bind)
    except Exception as out:
        reason = out.strerror if isinstance(out, OSError) and out.strerror else str(out)
        raise SystemFailure(f"cannot open a socket in netns {netns} at", str(address[0]), reason) from out
