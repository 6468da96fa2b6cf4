"""The daemon's event-loop side: read each connection's requests and answer them.

A connection carries JSON lines (:mod:`netplugin.frontends.wire.protocol`) or the compiled shim's
binary frames (:mod:`.nativecalls`), told apart by their first byte; only root and the daemon's own
user are served (``SO_PEERCRED``). A request for a pod, or a forwarded CNI call for a container,
waits for its turn in the event loop (:mod:`.podqueue`) and then runs in a worker thread. What a
request does is the daemon's (:class:`netplugin.frontends.daemon.server.Daemon`), which builds its
:class:`Connections` with it: ``dispatch``, ``health`` and ``plugin_ok``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from netplugin.core._yaml import load_json
from netplugin.core.errors import DaemonUnavailable, InvalidArgument, NetpluginError
from netplugin.frontends.daemon.actionlog import log_refusal
from netplugin.frontends.daemon.cnicalls import run_cni_call
from netplugin.frontends.daemon.envelope import check_request, pod_of, pod_text
from netplugin.frontends.daemon.metrics import INVALID_OP
from netplugin.frontends.daemon.nativecalls import read_frame, run_frame
from netplugin.frontends.daemon.podqueue import PodTurns, container_turn
from netplugin.frontends.daemon.recordops import PROGRESS, progress_sink
from netplugin.frontends.wire.codes import error_classes
from netplugin.frontends.wire.protocol import FRAME_MAGIC, POD_OPS, encode_unavailable

if TYPE_CHECKING:
    from netplugin.frontends.daemon.callpool import CallPool, Outcome
    from netplugin.frontends.daemon.metrics import Metrics
    from netplugin.frontends.daemon.reconfig import ServedSettings

__all__ = ["Connections", "Stats"]

log = logging.getLogger("netplugin.daemon")


@dataclass
class Stats:
    started: float
    requests: int = 0
    busy: int = 0
    reloads: int = 0


class Connections:
    """A daemon's socket connections: each request read, given its turn, run and answered.

    Built with what serving needs of the daemon: its socket path and metrics, its current settings
    (``live()``: a reload swaps them), and what a request does: ``dispatch(req)`` (in a worker
    thread; the result, or a NetpluginError), ``health()`` (in the event loop) and ``plugin_ok()``
    (a call succeeded: if it ran the plugin, a problem logged at start or reload is over).
    """

    def __init__(
        self,
        socket_path: str,
        metrics: Metrics,
        live: Callable[[], ServedSettings],
        *,
        dispatch: Callable[[dict[str, Any]], Any],
        health: Callable[[], dict[str, Any]],
        plugin_ok: Callable[[], None],
        pool: CallPool | None = None,
    ) -> None:
        self.socket_path = socket_path
        #: the worker processes a forwarded call may run in (None: always the daemon's own threads)
        self.pool = pool
        self.metrics = metrics
        self._live = live
        self._dispatch = dispatch
        self._health = health
        self._plugin_ok = plugin_ok
        self.stats = Stats(started=time.monotonic())
        #: set by the daemon's drain: requests read from now on are answered DaemonUnavailable
        self.stopping = False
        self._idle = asyncio.Event()
        self._idle.set()
        self._conns: set[asyncio.Task[None]] = set()
        #: each pod's turn (and each forwarded CNI call's container's), waited for in the event loop
        self.turns = PodTurns(socket_path, lambda: self.stopping)

    async def drain(self, bound: float) -> bool:
        """Wait (at most ``bound`` seconds) for the requests in flight; then close idle connections.

        False when requests were still running at the bound (their connections are left as they are).
        """
        try:
            await asyncio.wait_for(self._idle.wait(), bound)
        except TimeoutError:
            return False
        for task in list(self._conns):
            task.cancel()  # idle connections: nothing in flight
        return True

    async def _answer(self, line: bytes) -> dict[str, Any]:
        op = INVALID_OP
        req: Any = None
        try:
            try:  # bounded depth: a deep line is a clean error, not a RecursionError
                req = load_json(line, duplicates=True)
            except ValueError as e:  # DocumentError: not JSON, bad UTF-8, too deep
                raise InvalidArgument("request", line[:80].decode("utf-8", "replace"), f"not JSON: {e}") from None
            req = check_request(req, self._live().fingerprint, self.socket_path)
            op = req["op"]
            if self.stopping:
                raise DaemonUnavailable(self.socket_path, "it is shutting down")
            if op == "health":
                result = self._health()
            else:
                start = time.monotonic()
                if op in POD_OPS:
                    result = await self.metrics.timed_async(op, lambda: self._pod_request(req))
                elif op == "cni":
                    result = await self._cni_request(req)
                else:
                    result = await asyncio.to_thread(self._dispatch, req)
                if op not in POD_OPS:  # a pod action has its own line (log_action)
                    log.debug("%s %s: ok in %.3fs", op, pod_text(req), time.monotonic() - start)
            self.metrics.requests.labels(op, "ok").inc()
            return {"ok": True, "result": result}
        except NetpluginError as e:
            self.metrics.requests.labels(op, type(e).__name__).inc()
            log_refusal(req, e)
            return {"ok": False, "error": e.to_dict(), "classes": error_classes(type(e))}
        except Exception as e:
            # A bug: keep serving, and tell the caller exactly what happened.
            log.exception("internal error in %s", op)
            self.metrics.requests.labels(op, "InternalError").inc()
            return {
                "ok": False,
                "error": {"error": "InternalError", "message": f"{type(e).__name__}: {e}"},
                "classes": ["InternalError"],
            }

    async def _pod_request(self, req: dict[str, Any]) -> Any:
        """Run a pod request in a worker once the pod's earlier requests are done (:mod:`.podqueue`)."""
        pod = pod_of(req)
        async with self.turns.turn(pod.key, f"pod {pod}"):
            return await asyncio.to_thread(self._dispatch, req)

    async def _cni_request(self, req: dict[str, Any]) -> Any:
        """A forwarded CNI call waits for its container's turn (:func:`container_turn`) in the event
        loop, like a pod request."""
        environ = req.get("environ")
        container = environ.get("CNI_CONTAINERID") if isinstance(environ, dict) else None
        if not isinstance(container, str) or not container:
            return await asyncio.to_thread(self._dispatch, req)  # the shim's code reports what is missing
        async with self.turns.turn(*container_turn(container)):
            return await asyncio.to_thread(self._dispatch, req)

    async def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            sock = writer.get_extra_info("socket")
            pid, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
            if uid not in (0, os.geteuid()):
                log.warning("refused a connection from uid %d (pid %d)", uid, pid)
                return
            PROGRESS.set(progress_sink(writer))  # this connection's task (and the workers it starts) only
            while True:
                first = await reader.read(1)
                if first == FRAME_MAGIC[:1]:  # the compiled shim's binary frame (a JSON line starts with "{")
                    if await self._framed(first, reader, writer, pid):
                        continue
                    return
                try:
                    line = first if first in (b"", b"\n") else first + await reader.readuntil(b"\n")
                except asyncio.IncompleteReadError:
                    return  # the caller is done (or gave up mid-line: nothing to run)
                except asyncio.LimitOverrunError:
                    log.warning("request too long from pid %d; closing", pid)
                    return
                if not line:
                    return
                self._busy(+1)
                try:
                    self.stats.requests += 1
                    response = await self._answer(line)
                    writer.write(json.dumps(response, separators=(",", ":"), default=str).encode() + b"\n")
                    await writer.drain()
                finally:
                    self._busy(-1)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._conns.discard(task)
            writer.close()

    async def _framed(self, first: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pid: int) -> bool:
        """One frame of the compiled shim: read whole (or nothing runs), run as op ``cni``, answer."""
        body = await read_frame(first, reader, writer, pid)
        if body is None:
            return False
        self._busy(+1)
        try:
            self.stats.requests += 1
            answer, outcome = encode_unavailable("it is shutting down"), "DaemonUnavailable"
            if not self.stopping:
                answer, outcome = await run_frame(body, pid, self.turns.turn, self._cni_call)
                if outcome == "ok":
                    self._plugin_ok()
            self.metrics.requests.labels("cni", outcome).inc()
            writer.write(answer)
            await writer.drain()
        finally:
            self._busy(-1)
        return True

    async def _cni_call(self, environ: dict[str, str], stdin: bytes) -> Outcome:
        """A compiled shim's call with the current settings: here, or in a worker process (:mod:`.callpool`)."""
        live = self._live()

        def here() -> Awaitable[Outcome]:
            return asyncio.to_thread(run_cni_call, environ, stdin, live, self.socket_path, self.metrics.timed)

        if self.pool is None:
            return await here()
        return await self.pool.run(live, environ, stdin, here)

    def _busy(self, delta: int) -> None:
        self.stats.busy += delta
        if self.stats.busy == 0:
            self._idle.set()
        else:
            self._idle.clear()
