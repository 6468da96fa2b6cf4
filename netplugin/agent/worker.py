"""A keeper's own thread: it runs the keeper's loop, which sleeps between passes until woken or stopped.

The gc keeper, the pod repairer and the node keeper each do their work off the callers' threads
(watch callbacks, the kernel watch, the event loop): a caller only wakes the worker. Stopping sets
the stop flag and wakes it, so a loop that checks :attr:`Worker.stopping` after each sleep ends at
once, and waits for it a bounded time (a pass stuck in a plugin call must not hang the daemon's exit).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["JOIN_TIMEOUT", "Worker"]

#: how long :meth:`Worker.stop` waits for a pass in progress to end (seconds)
JOIN_TIMEOUT = 10.0


class Worker:
    """Runs ``loop`` on a daemon thread named ``name``; the loop sleeps with :meth:`sleep`."""

    def __init__(self, name: str, loop: Callable[[], None]) -> None:
        self._thread = threading.Thread(target=loop, name=name, daemon=True)
        self._wake = threading.Event()
        self._stop = threading.Event()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        """Something to do: the sleeping loop runs a pass now (called on any thread)."""
        self._wake.set()

    def sleep(self, timeout: float | None = None) -> None:
        """Until woken, stopped or ``timeout`` seconds (None: no limit); a wake while awake is kept."""
        self._wake.wait(timeout)
        self._wake.clear()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.ident is not None:  # started
            self._thread.join(JOIN_TIMEOUT)
