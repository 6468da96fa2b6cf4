"""The daemon's worker processes: a burst of CNI calls on every core, not one GIL.

The Python part of a call (settings, records, IPAM files, netlink messages) holds the interpreter's
lock, so in one process a burst of calls runs one at a time however many cores the node has. The
pool keeps a few worker processes (:mod:`.callworker`), each with its own interpreter, started with
the daemon's settings. A forwarded CNI call runs in the daemon's own threads when no other does
(a call alone pays no hand-over); a call that meets another running there goes to the first idle
worker instead, and waits for one (or for the daemon's own turn) when all are busy.

What does not change: the container's turn is still taken in the daemon's event loop before a call
is handed over; the per-pod flock and the durable records, which the CLI, the shims and the daemon
already share across processes, serialise a pod's actions and keep its state; each call's pod
metrics and chain members' calls come back with its answer and are counted in the daemon's
``/metrics``; a reload starts new workers with the new settings and lets the old ones finish.

A worker that dies during a call answers that call ``DaemonUnavailable`` (the shim falls back and
makes the call itself, as if the daemon had crashed) and is replaced; workers that keep dying
right after their start are given up on, and the daemon runs every call itself, as with no pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from netplugin.core.errors import DaemonUnavailable, HostError
from netplugin.core.node import NodeInfo
from netplugin.frontends.cni.spec import CniError, parse_cni_args
from netplugin.frontends.daemon.callworker import HEADER, Lent, encode, message_size
from netplugin.hosts import Host

if TYPE_CHECKING:
    from netplugin.frontends.daemon.metrics import Metrics
    from netplugin.frontends.daemon.reconfig import ServedSettings

__all__ = ["MAX_POOL", "CallPool", "Outcome", "lend", "pool_size"]

log = logging.getLogger("netplugin.daemon")

Outcome = tuple[int, "dict[str, Any] | None"]

#: the most worker processes a daemon starts, whatever its number of CPUs: past a few, the
#: kernel's one lock for network changes (RTNL) serialises a burst anyway, and each costs about
#: 15-20 MiB (the shipped DaemonSet's daemon container is limited to 256 MiB)
MAX_POOL = 4
#: how long a worker may take to start (import, settings, manager) before it is given up on
START_TIMEOUT = 30.0
#: a worker that dies this soon after its start counts towards giving up
_EARLY_DEATH = 5.0
#: after this many early deaths in a row, no more workers are started
_GIVE_UP_AFTER = 3
#: how long closing waits for each worker's exit (its call and its link deletions) before SIGKILL
_EXIT_WAIT = 30.0


def pool_size(cpus: int | None = None) -> int:
    """The workers for a daemon allowed ``cpus`` CPUs (default: this process's affinity): one per CPU,
    none on one CPU (a second process there would only take turns with the daemon)."""
    n = len(os.sched_getaffinity(0)) if cpus is None else cpus
    return 0 if n <= 1 else min(n, MAX_POOL)


class _Worker:
    __slots__ = ("live", "proc", "reader", "started", "writer")

    def __init__(
        self,
        live: ServedSettings,
        proc: subprocess.Popen[bytes],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.live = live
        self.proc = proc
        self.reader = reader
        self.writer = writer
        self.started = time.monotonic()


class CallPool:
    """``size`` worker processes serving the daemon's current settings, and the daemon's own turn.

    Built in the event loop; every method runs there (:meth:`renew` too: the daemon calls it
    with ``call_soon_threadsafe`` after a reload)."""

    def __init__(self, size: int, socket_path: str, metrics: Metrics) -> None:
        self.size = size
        self.socket_path = socket_path
        self.metrics = metrics
        self._live: ServedSettings | None = None
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()
        self._starting = 0
        self._local_busy = False
        self._early_deaths = 0
        self._closing = False
        self._cond = asyncio.Condition()
        self._tasks: set[asyncio.Task[Any]] = set()
        #: calls handed to workers, for health and tests
        self.handed = 0

    # --- workers ----------------------------------------------------------------------------------

    def renew(self, live: ServedSettings) -> None:
        """Serve ``live`` from now on: start its workers; the others end once idle. Nothing changes
        when ``live`` is already served (a reload that kept the running settings)."""
        if live is self._live:
            return
        log.info("starting %d worker process(es) for %s settings", self.size, "new" if self._live else "its")
        self._live = live
        for w in [w for w in self._idle if w.live is not live]:
            self._idle.remove(w)
            self._retire(w)
        for _ in range(self.size):
            self._background(self._start(live))

    def pids(self) -> list[int]:
        """The workers' process ids (idle and busy)."""
        return sorted(w.proc.pid for w in [*self._idle, *self._busy])

    def _background(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _start(self, live: ServedSettings) -> None:
        if self._closing or self._early_deaths >= _GIVE_UP_AFTER:
            return
        self._starting += 1
        parent, child = socket.socketpair()
        proc: subprocess.Popen[bytes] | None = None
        try:
            with child:
                proc = await asyncio.to_thread(_spawn, child)
            reader, writer = await asyncio.open_unix_connection(sock=parent)
            writer.write(encode((live.config, live.snapshot, self.socket_path)))
            ready = await asyncio.wait_for(_read(reader), START_TIMEOUT)
            if not (isinstance(ready, tuple) and ready[:1] == ("ready",)):
                raise ValueError(f"said {ready!r} instead of ready")
        except (OSError, EOFError, ValueError, TimeoutError, asyncio.IncompleteReadError) as e:
            parent.close()
            self._starting -= 1
            self._early_deaths += 1
            why = e if str(e) else type(e).__name__
            log.error("a worker process did not start (%s); calls run in the daemon until one does", why)
            if proc is not None:
                self._background(self._reap(proc))
            self._restart_later(live)
            return
        self._starting -= 1
        w = _Worker(live, proc, reader, writer)
        async with self._cond:
            if self._closing or live is not self._live:
                self._retire(w)
            else:
                self._idle.append(w)
            self._cond.notify_all()

    def _restart_later(self, live: ServedSettings) -> None:
        if self._early_deaths >= _GIVE_UP_AFTER:
            log.error(
                "worker processes died %d times right after starting: not starting more; "
                "the daemon runs every call itself",
                self._early_deaths,
            )
            return
        if not self._closing and live is self._live:
            asyncio.get_running_loop().call_later(1.0, lambda: self._background(self._start(live)))

    def _retire(self, w: _Worker) -> None:
        """End ``w``: closing its end of the pair ends it after its current call."""
        w.writer.close()
        self._background(self._reap(w.proc))

    async def _reap(self, proc: subprocess.Popen[bytes]) -> None:
        try:
            await asyncio.to_thread(proc.wait, _EXIT_WAIT)
        except subprocess.TimeoutExpired:
            log.error("worker process %d did not end within %.0fs; killing it", proc.pid, _EXIT_WAIT)
            proc.kill()
            await asyncio.to_thread(proc.wait)

    async def close(self) -> None:
        """No more calls handed over; every worker ends (their calls done) and is waited for."""
        self._closing = True
        async with self._cond:
            for w in self._idle:
                self._retire(w)
            self._idle.clear()
            self._cond.notify_all()
        while self._tasks or self._busy:
            await asyncio.gather(*self._tasks, return_exceptions=True)
            if self._busy:
                await asyncio.sleep(0.01)

    # --- calls ------------------------------------------------------------------------------------

    def _serves(self, live: ServedSettings) -> bool:
        """Some worker serves (or is starting to serve) ``live``."""
        if self._closing or live is not self._live:
            return False
        return self._starting > 0 or any(w.live is live for w in [*self._idle, *self._busy])

    def _idle_for(self, live: ServedSettings) -> _Worker | None:
        for w in self._idle:
            if w.live is live:
                return w
        return None

    async def run(
        self, live: ServedSettings, environ: dict[str, str], stdin: bytes, local: Callable[[], Awaitable[Outcome]]
    ) -> Outcome:
        """The call's outcome: run by ``local()`` (the daemon's own threads) or by an idle worker."""
        async with self._cond:
            await self._cond.wait_for(
                lambda: not self._local_busy or self._idle_for(live) is not None or not self._serves(live)
            )
            worker = None
            if not self._local_busy:
                self._local_busy = True
            else:
                worker = self._idle_for(live)
                if worker is not None:
                    self._idle.remove(worker)
                    self._busy.add(worker)
        if worker is None:
            try:
                return await local()
            finally:
                async with self._cond:
                    self._local_busy = False
                    self._cond.notify_all()
        self.handed += 1
        return await asyncio.shield(self._exchange(worker, environ, stdin))

    async def _exchange(self, w: _Worker, environ: dict[str, str], stdin: bytes) -> Outcome:
        """One call on ``w``, shielded: a caller that goes away never leaves an answer unread."""
        try:
            lent = await asyncio.to_thread(lend, w.live.manager.host, environ)
            w.writer.write(encode((environ, stdin, lent)))
            await w.writer.drain()
            outcome, timed, observed = await _read(w.reader)
        except (OSError, EOFError, ValueError, asyncio.IncompleteReadError, pickle.UnpicklingError) as e:
            await self._lost(w, e)
            why = f"its worker process {w.proc.pid} ended during the call"
            raise DaemonUnavailable(self.socket_path, why) from None
        async with self._cond:
            self._busy.discard(w)
            self._early_deaths = 0
            if self._closing or w.live is not self._live:
                self._retire(w)
            else:
                self._idle.append(w)
            self._cond.notify_all()
        for op, seconds, raised in timed:
            self.metrics.record(op, seconds, raised)
        for member in observed:
            self.metrics.observe_member(*member)
        kind = outcome[0]
        if kind == "ok":
            return outcome[1], outcome[2]
        if kind == "unavailable":
            raise DaemonUnavailable(self.socket_path, outcome[1])
        raise RuntimeError(f"in worker process {w.proc.pid}: {outcome[1]}")

    async def _lost(self, w: _Worker, why: BaseException) -> None:
        with contextlib.suppress(ProcessLookupError):
            w.proc.kill()  # a broken pair with a live process: it cannot be trusted with another call
        code = await asyncio.to_thread(w.proc.wait)
        log.error("worker process %d ended during a call (exit status %s, %s); starting another",
                  w.proc.pid, code, why or type(why).__name__)  # fmt: skip
        if time.monotonic() - w.started < _EARLY_DEATH:
            self._early_deaths += 1
        async with self._cond:
            self._busy.discard(w)
            w.writer.close()
            self._cond.notify_all()
        if self._live is not None and w.live is self._live:
            self._restart_later(w.live)


def lend(host: Host, environ: Mapping[str, str]) -> Lent:
    """What the daemon's ``host`` answers for a call (:class:`.callworker.LentHost`): this node, and the
    pod its ``CNI_ARGS`` name; what the host cannot answer is left to the worker to ask itself."""
    node: NodeInfo | None = None
    with contextlib.suppress(HostError):
        node = host.node_info()
    try:
        args = parse_cni_args(environ.get("CNI_ARGS", ""))
    except CniError:
        return node, None  # the call fails on it where it runs
    namespace, name = args.get("K8S_POD_NAMESPACE"), args.get("K8S_POD_NAME")
    if not namespace or not name:
        return node, None
    try:
        return node, (namespace, name, host.get_pod_by_name(namespace, name))
    except HostError:
        return node, None


def _spawn(end: socket.socket) -> subprocess.Popen[bytes]:
    """A worker process, its standard input ``end`` (it inherits the daemon's environment and stderr)."""
    return subprocess.Popen([sys.executable, "-m", "netplugin.frontends.daemon.callworker"], stdin=end.fileno())


async def _read(reader: asyncio.StreamReader) -> Any:
    size = message_size(await reader.readexactly(HEADER.size))
    return pickle.loads(await reader.readexactly(size))
