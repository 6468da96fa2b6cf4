"""The thin client of the netplugin daemon (``netplugin serve``).

It is on the CLI's cold path, so it uses the standard library's ``_socket`` and
``json`` only: no asyncio, no prometheus_client, no psutil, nothing that
imports the manager or the plugin machinery.

Protocol (one unix stream socket, newline-delimited JSON, any number of
requests per connection, answered in order)::

    -> {"v": 1, "op": "setup", "namespace": "default", "pod": "web-0", "infra_id": "abc", "config": {...}}
    <- {"ok": true, "result": {"ip": "10.1.2.3"}}
    <- {"ok": false, "error": {"error": "PluginTimeout", "message": "...", ...}, "classes": [...]}

``op`` is one of setup, teardown, status (pod triple required), init (``force``),
plugins, pods, gc (``dry_run``), health, and cni (``environ``: the ``CNI_*`` and
``NETPLUGIN_*`` variables, ``stdin``: the network config; the result is
``{"code": exit status, "doc": what the shim prints}``, see
:mod:`netplugin.frontends.cni.fast`). ``error`` is
:meth:`~netplugin.core.errors.NetpluginError.to_dict` and ``classes`` the remote
class and its bases, so :func:`request` re-raises the very same error (same
class, message, details and so the same exit code) as the local run would.

``config`` is the caller's :func:`fingerprint`: the daemon refuses, with
:class:`~netplugin.core.errors.DaemonUnavailable`, a request made under different
settings (another plugin, dirs or timeouts), because it would not do what the
caller asked. :class:`~netplugin.core.errors.DaemonUnavailable` always means "not
run", so a caller may then do the work itself; a connection lost after the
request was sent is a :class:`~netplugin.core.errors.SystemFailure` instead (the
operation may have run).

Callers that cannot build a Config cheaply (the CNI shim, the CLI's fast path in
:mod:`netplugin.frontends.thin`) send ``settings`` instead of ``config``:
``{"config_path", "environ": {NETPLUGIN_*}, "overrides": {flag key: value}}``; the daemon
builds the config from them as the caller would have (same file, same precedence) and
compares its fingerprint. :func:`exchange` is the request without any netplugin import
(it raises :class:`NotSent` or :class:`NoAnswer`, plain exceptions).
"""

from __future__ import annotations

# The C module: ``socket`` adds enum wrappers and ``selectors`` this client does not use, and
# importing them costs more (a few ms) than everything else here.
import _socket as socket
import os
import struct

from netplugin.frontends.wire import dumps, loads

# Not typing's: importing typing costs this path more than the rest of it (~15 ms).
TYPE_CHECKING = False

if TYPE_CHECKING:
    from typing import Any

    from netplugin.core.config import Config

__all__ = [
    "CONNECT_TIMEOUT",
    "MAX_MESSAGE",
    "OPS",
    "POD_OPS",
    "PROTOCOL_VERSION",
    "Connection",
    "NoAnswer",
    "NotSent",
    "exchange",
    "fingerprint",
    "request",
    "response_timeout",
]

PROTOCOL_VERSION = 1
POD_OPS = ("setup", "teardown", "status")
OPS = (*POD_OPS, "init", "plugins", "pods", "gc", "health", "cni")
#: connecting to a live unix socket is immediate; this bounds a daemon whose backlog is full
CONNECT_TIMEOUT = 2.0
#: the longest line either side accepts (a plugins or pods listing is far smaller)
MAX_MESSAGE = 16 << 20

# Settings that do not change what an operation does, so caller and daemon may differ in them.
_NOT_BEHAVIOUR = frozenset({"config_path", "socket", "metrics_address", "use_daemon", "timeout", "timeouts"})


def fingerprint(config: Config) -> dict[str, Any]:
    """The settings that decide what an operation does, in JSON form (compared by the daemon)."""
    out: dict[str, Any] = {k: v for k, v in config.to_dict().items() if k not in _NOT_BEHAVIOUR}
    out["plugin"] = config.plugin or "kubernetes.io/no-op"
    # --timeout overrides the per-action limits: compare what each action really gets.
    out["timeouts"] = {a: config.timeout_for(a) for a in ("init", "setup", "teardown", "status")}
    import json

    normal: dict[str, Any] = json.loads(json.dumps(out, sort_keys=True, default=str))
    return normal


def response_timeout(config: Config, op: str) -> float | None:
    """How long to wait for the daemon's answer: past every time limit the operation may hit.

    A pod action may wait for the pod's lock (held by an action bounded by the same limits)
    and for init; gc and pods have no fixed bound, so they wait as long as it takes.
    """
    if op in ("gc", "pods"):
        return None
    grace = 2 * config.kill_grace + 5.0
    if op == "init":
        return 2 * (config.timeout_for("init") + grace)
    if op in POD_OPS:
        return config.timeout_for("init") + 2 * (config.timeout_for(op) + grace) + 5.0
    return 30.0


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
    if uid not in (0, os.geteuid()):
        sock.close()
        raise NotSent(f"the socket is served by uid {uid}, not by root")
    return sock


def send(sock: socket.socket, body: dict[str, Any], timeout: float | None) -> None:
    line = dumps(body).encode() + b"\n"
    try:
        sock.settimeout(timeout)
        sock.sendall(line)
    except OSError as e:
        # The daemon acts on whole lines only, and it closes connections only when idle.
        raise NotSent(f"cannot send the request: {e.strerror or e}") from e


def read_response(sock: socket.socket, buf: bytearray, op: str, timeout: float | None) -> dict[str, Any]:
    """The next answer line as a response object (``ok`` and ``result`` or ``error``)."""
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


def exchange(path: str, body: dict[str, Any], *, timeout: float | None) -> dict[str, Any]:
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

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._sock.close()

    def call(self, op: str, *, timeout: float | None = None, **args: Any) -> Any:
        """Send one request and return its ``result``; re-raises the daemon's error as itself."""
        from netplugin.core.errors import DaemonUnavailable, SystemFailure, error_from_dict

        body = {"v": PROTOCOL_VERSION, "op": op, **{k: v for k, v in args.items() if v is not None}}
        try:
            send(self._sock, body, timeout)
            response = read_response(self._sock, self._buf, op, timeout)
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
    config: Config | None = None,
    timeout: float | None = None,
    **args: Any,
) -> Any:
    """One request on a fresh connection. With ``config``, the daemon checks it runs the same settings.

    Raises :class:`DaemonUnavailable` when the request was not run (nobody answers on ``path``,
    the daemon is draining, or its settings differ); otherwise the operation's own error.
    """
    if config is not None:
        args["config"] = fingerprint(config)
        if timeout is None:
            timeout = response_timeout(config, op)
    with Connection(path) as conn:
        return conn.call(op, timeout=timeout, **args)
