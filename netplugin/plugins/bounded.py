"""In-process plugin actions under their time limit, as exec plugins are under theirs.

An exec plugin that hangs is killed at its limit (:mod:`netplugin.core.invoke`). A built-in
plugin runs in the caller's thread, where nothing can be killed: a call stuck in the kernel (an
``open(2)`` of a FIFO, a hung filesystem) would hold the CLI, the CNI shim or a daemon worker,
with the pod's lock, for ever. :func:`run_bounded` runs the action in a thread of its own and
waits at most the action's limit; past it the caller gets ``TimeoutError`` (the plugin turns it
into PluginTimeout) and goes on, and the thread is left to finish on its own. Such threads cannot
be killed, so they are listed by :func:`stuck_calls` until they end: the daemon's ``health``
shows them, so a node that piles them up is seen, not silent.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["StuckCall", "run_bounded", "stuck_calls"]

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
