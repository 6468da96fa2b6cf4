"""A worker process of the daemon: runs the CNI calls the daemon hands it, with a GIL of its own.

The daemon (:mod:`.callpool`) starts it as ``python -m netplugin.frontends.daemon.callworker``
with one end of a socket pair as its standard input. Messages both ways are a 4-byte big-endian
length and a pickle (the pair is private to the two processes: nothing else can write to it).

1. The daemon sends the settings the worker serves with: ``(config, snapshot, socket_path)``;
   the worker builds its own manager from them and answers ``("ready", pid)``.
2. Then, one at a time, a call ``(environ, stdin, lent)``: ``lent`` is what the daemon's host
   answered for it (:func:`.callpool.lend`: this node, and the call's pod when the call names it),
   from the daemon's list+watch caches with a cluster host, so a worker asks the API server
   nothing the daemon knows and works while the API is away as the daemon does. The answer is
   ``(outcome, timed, observed)``: ``outcome`` is ``("ok", code, document)``, ``("unavailable",
   reason)`` (the daemon answers the shim ``U``, as it would have itself) or ``("bug", text)``;
   ``timed`` the pod operations the call ran as ``(op, seconds, raised)``; ``observed`` each
   chain member's call as the manager tells its observer. The daemon adds both to its metrics,
   so ``/metrics`` counts every call once.

The call runs exactly as in the daemon's own threads (:func:`.cnicalls.run_cni_call`), under the
same per-pod flock and durable records the CLI, the shims and the daemon all share, so a call
needs nothing from the daemon's memory. Each pod action's log line is written here, in the
daemon's format, on the standard error the worker shares with it. The worker ends when the
daemon closes its end (after its current call and its pending link deletions); it ignores
SIGINT, SIGTERM and SIGHUP, which are the daemon's to act on.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable
from typing import Any

from netplugin.core.errors import DaemonUnavailable
from netplugin.core.execplugin.invoke import adopt_orphans, reap_adopted
from netplugin.core.node import NodeInfo
from netplugin.frontends.daemon.actionlog import log_action
from netplugin.frontends.daemon.cnicalls import run_cni_call
from netplugin.frontends.daemon.reconfig import ServedSettings
from netplugin.frontends.daemon.systemd import configure_logging
from netplugin.hosts import Host, make_host
from netplugin.hosts.base import Pod
from netplugin.manager.manager import Manager
from netplugin.manager.reporting import Hooks

__all__ = ["HEADER", "Lent", "LentHost", "encode", "message_size", "read_message"]

log = logging.getLogger("netplugin.daemon")

#: a message's length limit: a CNI call's stdin and environment are bounded far below it
MAX_FRAME = 64 << 20
#: a message's header: its length
HEADER = struct.Struct(">I")


def message_size(header: bytes) -> int:
    """The length a message's header gives (ValueError past the limit)."""
    size: int = HEADER.unpack(header)[0]
    if size > MAX_FRAME:
        raise ValueError(f"message of {size} bytes (limit {MAX_FRAME})")
    return size


def encode(message: Any) -> bytes:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(data)) + data


def read_message(sock: socket.socket) -> Any:
    """The next message on ``sock``; EOFError when the other end closed it."""
    return pickle.loads(_read_exactly(sock, message_size(_read_exactly(sock, HEADER.size))))


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    buf = bytearray()
    while len(buf) < size:
        chunk = sock.recv(size - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def write_message(sock: socket.socket, message: Any) -> None:
    sock.sendall(encode(message))


#: what the daemon's host answered for one call: this node (None: it could not say), and the
#: call's pod as ``(namespace, name, pod or None)`` (None: not looked up)
Lent = tuple["NodeInfo | None", "tuple[str, str, Pod | None] | None"]


class LentHost:
    """A worker's host: what the daemon's host answered for the current call, else its own."""

    def __init__(self, inner: Host) -> None:
        self.inner = inner
        self.lent: Lent = (None, None)

    def get_pod_by_name(self, namespace: str, name: str) -> Pod | None:
        pod = self.lent[1]
        if pod is not None and pod[:2] == (namespace, name):
            return pod[2]
        return self.inner.get_pod_by_name(namespace, name)

    def kube_client(self) -> Any | None:
        return self.inner.kube_client()

    @property
    def node_name(self) -> str:
        return self.inner.node_name

    def node_info(self) -> NodeInfo:
        node = self.lent[0]
        return node if node is not None else self.inner.node_info()

    def list_nodes(self) -> list[NodeInfo]:
        return self.inner.list_nodes()


def _serve(sock: socket.socket) -> int:
    config, snapshot, socket_path = read_message(sock)
    configure_logging(os.environ, config)
    observed: list[tuple[str, str, float, str]] = []
    host = LentHost(make_host(config))
    hooks = Hooks(observe=lambda *a: observed.append(a), on_action=log_action)
    manager = Manager(config, host, hooks=hooks)
    live = ServedSettings.of(config, manager, snapshot)
    if adopt_orphans():  # a bash plugin's leftovers are found among this process's children
        signal.signal(signal.SIGCHLD, lambda *_: reap_adopted(wait=False))
    write_message(sock, ("ready", os.getpid()))
    timed: list[tuple[str, float, bool]] = []

    def time_op(op: str, fn: Callable[[], Any]) -> Any:
        start, raised = time.monotonic(), True
        try:
            result = fn()
            raised = False
            return result
        finally:
            timed.append((op, time.monotonic() - start, raised))

    while True:
        try:
            environ, stdin, host.lent = read_message(sock)
        except EOFError:
            return 0
        observed.clear()
        timed.clear()
        outcome: tuple[Any, ...]
        try:
            code, doc = run_cni_call(environ, stdin, live, socket_path, time_op)
            outcome = ("ok", code, doc)
        except DaemonUnavailable as e:
            outcome = ("unavailable", e.message)
        except Exception as e:  # a bug: the daemon answers U (the shim falls back) and logs it
            log.exception("internal error in a cni call")
            outcome = ("bug", f"{type(e).__name__}: {e}")
        write_message(sock, (outcome, list(timed), list(observed)))


def main() -> int:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    sock = socket.socket(fileno=sys.stdin.fileno())
    try:
        return _serve(sock)
    except (EOFError, BrokenPipeError, ConnectionError):
        return 0  # the daemon went away between calls
    finally:
        sock.close()


if __name__ == "__main__":
    sys.exit(main())
