"""A keeper's own thread: it runs the keeper's loop, which sleeps between passes until woken or stopped.

The gc keeper, the pod repairer and the node keeper each do their work off the callers' threads
(watch callbacks, the kernel watch, the event loop): a caller only wakes the worker. Stopping sets
the stop flag and wakes it, so a loop that checks :attr:`Worker.stopping` after each sleep ends at
once, and waits for it a bounded time (a pass stuck in a plugin call must not hang the daemon's exit).

A keeper never dies silently: any exception out of its loop is logged at ERROR with its traceback,
counted, and the loop started again after a backoff (doubling, bounded). :meth:`Worker.status`
and :meth:`Worker.problem` tell health and doctor whether it runs and whether a pass has taken
longer than the keeper's interval (stuck).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["BACKOFF_MAX", "BACKOFF_MIN", "JOIN_TIMEOUT", "Worker"]

log = logging.getLogger("netplugin.agent")

#: how long :meth:`Worker.stop` waits for a pass in progress to end (seconds)
JOIN_TIMEOUT = 10.0
#: the wait before a loop that raised runs again: doubled at each failure in a row, up to the max
BACKOFF_MIN = 0.5
BACKOFF_MAX = 30.0


class Worker:
    """Runs ``loop`` on a daemon thread named ``name``; the loop sleeps with :meth:`sleep`.

    ``limit()`` is the longest a pass may run before the keeper counts as stuck (its interval)."""

    def __init__(self, name: str, loop: Callable[[], None], limit: Callable[[], float] = lambda: 60.0) -> None:
        self.name = name
        self._loop = loop
        self._limit = limit
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._wake = threading.Event()
        self._stop = threading.Event()
        #: when the pass in progress started (monotonic); None while the loop sleeps
        self._busy_since: float | None = None
        self.passes = 0
        #: exceptions out of the loop, and the last one
        self.errors = 0
        self.last_error: str | None = None

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def start(self) -> None:
        self._busy_since = time.monotonic()
        self._thread.start()

    def _run(self) -> None:
        backoff = BACKOFF_MIN
        while not self.stopping:
            started = time.monotonic()
            try:
                self._loop()
                return
            except Exception as e:
                self.errors += 1
                self.last_error = f"{type(e).__name__}: {e}"
                if time.monotonic() - started > BACKOFF_MAX:
                    backoff = BACKOFF_MIN  # it ran well for a while: not a failure in a row
                log.error("%s: %s; its loop starts again in %.1fs", self.name, self.last_error, backoff, exc_info=True)
                self._busy_since = None
                self._stop.wait(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)
                self._busy_since = time.monotonic()

    def wake(self) -> None:
        """Something to do: the sleeping loop runs a pass now (called on any thread)."""
        self._wake.set()

    def sleep(self, timeout: float | None = None) -> None:
        """Until woken, stopped or ``timeout`` seconds (None: no limit); a wake while awake is kept."""
        self._busy_since = None
        self.passes += 1
        self._wake.wait(timeout)
        self._wake.clear()
        self._busy_since = time.monotonic()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.ident is not None:  # started
            self._thread.join(JOIN_TIMEOUT)

    def status(self) -> dict[str, Any]:
        """Whether it runs, how long its pass in progress has run, its limit and its failures."""
        since = self._busy_since
        return {
            "alive": self._thread.is_alive(),
            "busy_seconds": round(time.monotonic() - since, 3) if since is not None else 0.0,
            "limit_seconds": self._limit(),
            "passes": self.passes,
            "errors": self.errors,
            "last_error": self.last_error,
        }

    def problem(self) -> str | None:
        """Why the keeper does not keep (not running, or a pass past its limit), or None."""
        if self._thread.ident is None or self.stopping:
            return None  # not started (a keeper the settings leave off), or stopping
        st = self.status()
        if not st["alive"]:
            return f"{self.name} is not running (last error: {self.last_error or 'none'})"
        if st["busy_seconds"] > st["limit_seconds"]:
            return (f"{self.name} has not completed a pass in {st['busy_seconds']:.0f}s "
                    f"(its interval: {st['limit_seconds']:.0f}s)")  # fmt: skip
        return None
