"""In-process plugin actions under their time limit, as exec plugins are under theirs.

An exec plugin that hangs is killed at its limit (:mod:`netplugin.core.invoke`). A built-in
plugin runs in the caller's thread, where nothing can be killed: a call stuck in the kernel (an
``open(2)`` of a FIFO, a hung filesystem) would hold the CLI, the CNI shim or a daemon worker,
with the pod's lock, for ever. The manager wraps every built-in but the no-op in
:class:`BoundedPlugin`: :func:`run_bounded` runs each action in a thread of its own and waits at
most the action's limit; past it the caller gets PluginTimeout and goes on, and the thread is
left to finish on its own. Such threads cannot be killed, so they are listed by
:func:`stuck_calls` until they end: the daemon's ``health`` shows them, so a node that piles
them up is seen, not silent.

The threads are kept for the next call once their call ends (idle ones retire after a while):
a daemon's burst would otherwise start and end one thread per action, and lose with it the
thread's warm state (its root-netns netlink socket, :func:`netplugin.core.netlink.root_netlink`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from netplugin.core.errors import PluginTimeout
from netplugin.core.plaindata import dataclass

if TYPE_CHECKING:
    from netplugin.core.names import PodRef
    from netplugin.core.plugin import CallContext, Plugin, PodNetworkStatus

__all__ = ["BoundedPlugin", "StuckCall", "run_bounded", "stuck_calls"]

T = TypeVar("T")


@dataclass(frozen=True)
class StuckCall:
    """An in-process action still running past its time limit."""

    what: str
    limit: float
    started: float  # time.monotonic()

    def to_dict(self) -> dict[str, object]:
        return {"what": self.what, "limit": self.limit, "running_seconds": round(time.monotonic() - self.started, 3)}


_lock = threading.Lock()
_stuck: dict[int, StuckCall] = {}
#: threads whose call ended, waiting for the next one (newest last), guarded by ``_lock``
_idle: list[_Runner] = []
#: an idle thread ends after this long without a call
IDLE_SECONDS = 60.0


def stuck_calls() -> list[StuckCall]:
    """The in-process actions of this process running past their limits, oldest first."""
    with _lock:
        return sorted(_stuck.values(), key=lambda c: c.started)


class _Call:
    """One bounded call: its function, its outcome once done (``done`` set under ``_lock``)."""

    __slots__ = ("done", "fn", "outcome", "what")

    def __init__(self, what: str, fn: Callable[[], object]) -> None:
        self.what = what
        self.fn = fn
        self.outcome: tuple[bool, object] | None = None
        self.done = threading.Event()


class _Runner:
    """A thread that runs bounded calls one at a time, and waits idle for the next between them."""

    def __init__(self, first: _Call) -> None:
        self._call: _Call | None = first
        self._wake = threading.Event()
        self._wake.set()
        self.thread = threading.Thread(target=self._loop, name=self._name(first), daemon=True)
        self.thread.start()

    @staticmethod
    def _name(call: _Call) -> str:
        return f"netplugin {call.what}"[:60]

    def give(self, call: _Call) -> None:
        """Run ``call`` next (the runner was idle: taken off ``_idle`` by the caller)."""
        self._call = call
        self.thread.name = self._name(call)
        self._wake.set()

    def _loop(self) -> None:
        while True:
            if not self._wake.wait(IDLE_SECONDS):
                with _lock:
                    if self in _idle:  # nobody took it meanwhile: retire
                        _idle.remove(self)
                        return
                continue  # taken just now: its call comes with the wake
            self._wake.clear()
            call, self._call = self._call, None
            assert call is not None
            try:
                call.outcome = (True, call.fn())
            except BaseException as e:  # handed to the caller's thread
                call.outcome = (False, e)
            finally:
                del call.fn  # nothing of the call is kept alive by an idle thread
                with _lock:
                    _stuck.pop(threading.get_ident(), None)
                    call.done.set()
                    _idle.append(self)
            call = None  # its outcome is the caller's now


def _forget_idle() -> None:
    _idle.clear()  # a forked child has none of its parent's threads


os.register_at_fork(after_in_child=_forget_idle)


def run_bounded(what: str, limit: float, fn: Callable[[], T]) -> T:
    """``fn()`` in a thread of its own; its result or exception, or TimeoutError after ``limit`` seconds."""
    call = _Call(what, fn)
    started = time.monotonic()
    with _lock:
        runner = _idle.pop() if _idle else None
    if runner is None:
        runner = _Runner(call)
    else:
        runner.give(call)
    if not call.done.wait(limit):
        with _lock:
            if not call.done.is_set():  # else it finished just now: take its outcome
                assert runner.thread.ident is not None
                _stuck[runner.thread.ident] = StuckCall(what, limit, started)
                raise TimeoutError(f"{what} did not finish within {limit:g}s")
    assert call.outcome is not None
    ok, value = call.outcome
    if ok:
        return value  # type: ignore[return-value]
    assert isinstance(value, BaseException)
    raise value


class BoundedPlugin:
    """An in-process plugin whose actions run under :func:`run_bounded` with the action's limit.

    Past the limit the caller gets PluginTimeout (CNI 11, CLI exit 4), as for an exec plugin;
    its name and version are the wrapped plugin's own.
    """

    def __init__(self, inner: Plugin) -> None:
        self.inner = inner
        self.name = inner.name

    def __repr__(self) -> str:
        return f"BoundedPlugin({self.inner!r})"

    def version(self) -> str:
        return self.inner.version()

    def version_key(self) -> tuple[int, ...] | None:
        return self.inner.version_key()

    def _run(self, action: str, pod: PodRef | None, ctx: CallContext, fn: Callable[[], T]) -> T:
        what = f"{self.name} {action}" + (f" of pod {pod}" if pod is not None else "")
        try:
            return run_bounded(what, ctx.timeout, fn)
        except TimeoutError:
            raise PluginTimeout(
                plugin=self.name,
                action=action,
                timeout=ctx.timeout,
                pod=str(pod) if pod is not None else None,
                left_running="an in-process call cannot be killed: it runs on, listed by the daemon's health",
            ) from None

    def init(self, ctx: CallContext) -> frozenset[str] | None:
        # The inner plugin's answers pass through: its action mask, and the status its setup reports.
        return self._run("init", None, ctx, lambda: self.inner.init(ctx))

    def setup(self, pod: PodRef, ctx: CallContext) -> PodNetworkStatus | None:
        return self._run("setup", pod, ctx, lambda: self.inner.setup(pod, ctx))

    def teardown(self, pod: PodRef, ctx: CallContext) -> None:
        self._run("teardown", pod, ctx, lambda: self.inner.teardown(pod, ctx))

    def status(self, pod: PodRef, ctx: CallContext) -> PodNetworkStatus | None:
        return self._run("status", pod, ctx, lambda: self.inner.status(pod, ctx))

    def repair(self, pod: PodRef, ctx: CallContext) -> tuple[str, ...]:
        return self._run("repair", pod, ctx, lambda: self.inner.repair(pod, ctx))

    def node(self, ctx: CallContext) -> tuple[str, ...]:
        return self._run("node", None, ctx, lambda: self.inner.node(ctx))
