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
"""

from __future__ import annotations

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


def stuck_calls() -> list[StuckCall]:
    """The in-process actions of this process running past their limits, oldest first."""
    with _lock:
        return sorted(_stuck.values(), key=lambda c: c.started)


def run_bounded(what: str, limit: float, fn: Callable[[], T]) -> T:
    """``fn()`` in a thread of its own; its result or exception, or TimeoutError after ``limit`` seconds."""
    outcome: list[tuple[bool, object]] = []
    done = threading.Event()
    started = time.monotonic()

    def work() -> None:
        try:
            outcome.append((True, fn()))
        except BaseException as e:  # handed to the caller's thread
            outcome.append((False, e))
        finally:
            with _lock:
                _stuck.pop(threading.get_ident(), None)
                done.set()

    worker = threading.Thread(target=work, name=f"netplugin {what}"[:60], daemon=True)
    worker.start()
    if not done.wait(limit):
        with _lock:
            if not done.is_set():  # else it finished just now: take its outcome
                assert worker.ident is not None
                _stuck[worker.ident] = StuckCall(what, limit, started)
                raise TimeoutError(f"{what} did not finish within {limit:g}s")
    ok, value = outcome[0]
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
