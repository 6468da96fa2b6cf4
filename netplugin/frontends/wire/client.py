"""The transport to the netplugin daemon (``netplugin serve``): connect, send, receive, check the peer.

The messages themselves (version, ops, limits, codec, request builders) are
:mod:`netplugin.frontends.wire.protocol`'s. This module is on the CLI's cold path, so it uses the
standard library's ``_socket`` only: no asyncio, no psutil, nothing that imports the manager
or the plugin machinery. :func:`exchange` is one request without any other netplugin import
(it raises :class:`NotSent` or :class:`NoAnswer`, plain exceptions); :class:`Connection` and
:func:`request` re-raise the daemon's error as itself (DaemonUnavailable: not run; a connection
lost after the request was sent: SystemFailure, the operation may have run).
"""

# No `from __future__ import annotations`: it loads the __future__ module on every call (a fast path);
# annotations of names imported only for type checking are strings instead.

# The C module: ``socket`` adds enum wrappers and ``selectors`` this client does not use, and
# importing them costs more than everything else here.
# Imports inside this module's functions are kept for the per-call import set
# (tests/frontends/fastpath.py): each keeps a module off the calls that do not need it
# (BENCHMARKS.md rows H and Gpy: the CLI and the Python shim through the daemon).
import _socket as socket

# _struct, not struct: the same functions without loading struct.py on every call
import _struct as struct
import posix

from netplugin.core.defaults import CONNECT_TIMEOUT, answer_timeout
from netplugin.frontends.wire.codec import loads
from netplugin.frontends.wire.fingerprint import fingerprint
from netplugin.frontends.wire.protocol import MAX_MESSAGE, encode_line, is_progress
from netplugin.frontends.wire.protocol import request as build_request

# Not typing's TYPE_CHECKING: importing typing would put the CLI's daemon path (and the Python shim's) over its target.
TYPE_CHECKING = False

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from netplugin.core.config import Config

__all__ = [
    "CONNECT_TIMEOUT",
    "Connection",
    "NoAnswer",
    "NotSent",
    "exchange",
    "request",
]


def _peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


# --- the stdlib-only core, shared by Connection and the fast paths ------------------------------


class NotSent(Exception):
    """The daemon did not get the request (nobody answers, wrong owner): it was not run."""


class NoAnswer(Exception):
    """The request was sent but no usable answer came back: it may or may not have run."""


def connect(path: str, connect_timeout: float = CONNECT_TIMEOUT) -> socket.socket:
    """A connected socket to the daemon at ``path``, checked to be served by root or by us."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.settimeout(connect_timeout)
    try:
        sock.connect(path)
        uid = _peer_uid(sock)
    except (OSError, ValueError) as e:  # ValueError: a path too long for AF_UNIX
        sock.close()
        raise NotSent(e.strerror if isinstance(e, OSError) and e.strerror else str(e)) from e
    if uid not in (0, posix.geteuid()):
        sock.close()
        raise NotSent(f"the socket is served by uid {uid}, not by root")
    return sock


def send(sock: socket.socket, body: "dict[str, Any]", timeout: float | None) -> None:
    line = encode_line(body)
    try:
        sock.settimeout(timeout)
        sock.sendall(line)
    except OSError as e:
        # The daemon acts on whole lines only, and it closes connections only when idle.
        raise NotSent(f"cannot send the request: {e.strerror or e}") from e


def read_response(
    sock: socket.socket,
    buf: bytearray,
    op: str,
    timeout: float | None,
    on_progress: "Callable[[str], None] | None" = None,
) -> "dict[str, Any]":
    """The request's answer (``ok`` and ``result`` or ``error``); progress lines before it go to ``on_progress``."""
    while True:
        response = _read_line(sock, buf, op, timeout)
        if on_progress is None or not is_progress(response):
            return response
        on_progress(response["progress"])


def _read_line(sock: socket.socket, buf: bytearray, op: str, timeout: float | None) -> "dict[str, Any]":
    while True:
        end = buf.find(b"\n")
        if end >= 0:
            line = bytes(buf[:end])
            del buf[: end + 1]
            break
        if len(buf) > MAX_MESSAGE:
            raise NoAnswer("answer too long")
        try:
            chunk = sock.recv(1 << 16)
        except TimeoutError:
            raise NoAnswer(f"no answer to {op} after {timeout:g}s; the operation may still be running") from None
        except OSError as e:
            chunk = b""
            why = e.strerror or str(e)
        else:
            why = "it closed the connection"
        if not chunk:
            raise NoAnswer(f"{why} while it ran {op}, before answering; the operation may or may not have run")
        buf += chunk
    try:
        response = loads(line)
    except (ValueError, RecursionError) as e:
        raise NoAnswer(f"answer is not JSON: {e}") from None
    if not isinstance(response, dict) or not isinstance(response.get("ok"), bool):
        raise NoAnswer("answer is not a response object")
    return response


def exchange(path: str, body: "dict[str, Any]", *, timeout: float | None) -> "dict[str, Any]":
    """One request on a fresh connection; the raw response object. Raises NotSent or NoAnswer."""
    sock = connect(path)
    try:
        send(sock, body, timeout)
        return read_response(sock, bytearray(), str(body.get("op")), timeout)
    finally:
        sock.close()


class Connection:
    """One connection to the daemon, for one or more requests in turn. Not thread-safe."""

    def __init__(self, path: str, *, connect_timeout: float = CONNECT_TIMEOUT) -> None:
        self.path = path
        try:
            self._sock = connect(path, connect_timeout)
        except NotSent as e:
            from netplugin.core.errors import DaemonUnavailable

            raise DaemonUnavailable(path, str(e)) from e
        self._buf = bytearray()

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._sock.close()

    def call(
        self,
        op: str,
        *,
        timeout: float | None = None,
        on_progress: "Callable[[str], None] | None" = None,
        **args: "Any",
    ) -> "Any":
        """Send one request and return its ``result``; re-raises the daemon's error as itself.

        ``on_progress`` asks for progress lines (gc's) and gets each as it arrives."""
        from netplugin.core.errors import DaemonUnavailable, SystemFailure, error_from_dict

        body = build_request(op, progress=True if on_progress is not None else None, **args)
        try:
            send(self._sock, body, timeout)
            response = read_response(self._sock, self._buf, op, timeout, on_progress)
        except NotSent as e:
            raise DaemonUnavailable(self.path, str(e)) from e
        except NoAnswer as e:
            raise SystemFailure("no usable answer from the daemon at", self.path, str(e)) from None
        if response["ok"]:
            return response.get("result")
        err = response.get("error")
        if not isinstance(err, dict):
            raise SystemFailure("bad answer from the daemon at", self.path, "error without details")
        classes = response.get("classes")
        raise error_from_dict(err, [str(c) for c in classes] if isinstance(classes, list) else None)


def request(
    path: str,
    op: str,
    *,
    config: "Config | None" = None,
    timeout: float | None = None,
    on_progress: "Callable[[str], None] | None" = None,
    **args: "Any",
) -> "Any":
    """One request on a fresh connection. With ``config``, the daemon checks it runs the same settings.

    Raises :class:`DaemonUnavailable` when the request was not run (nobody answers on ``path``,
    the daemon is draining, or its settings differ); otherwise the operation's own error.
    """
    if config is not None:
        args["config"] = fingerprint(config)
        if timeout is None:
            timeout = answer_timeout(op, config.timeouts, config.timeout, config.kill_grace)
    with Connection(path) as conn:
        return conn.call(op, timeout=timeout, on_progress=on_progress, **args)
