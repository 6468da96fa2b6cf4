"""The repair log, rate-limited: a fight (something removing what netplugin keeps, again and again)
must not flood the journal with one WARNING per thing put back.

At most :data:`LINES_PER_WINDOW` lines are logged per :data:`WINDOW` seconds; the rest are counted
by kind, and one summary line says what was left out once the window is over (at the next line,
or when a keeper's loop calls :meth:`RepairLog.flush` after its pass).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter

__all__ = ["LINES_PER_WINDOW", "WINDOW", "RepairLog"]

#: the window of the rate limit (seconds) and the lines logged in one
WINDOW = 1.0
LINES_PER_WINDOW = 20


class RepairLog:
    """Logs repair lines on ``log`` at WARNING, rate-limited, with a summary of what it left out."""

    def __init__(self, log: logging.Logger) -> None:
        self.log = log
        self._lock = threading.Lock()
        self._window = -WINDOW
        self._lines = 0
        self._dropped: Counter[str] = Counter()
        #: lines left out since the daemon started
        self.dropped_total = 0

    def line(self, kind: str, msg: str, *args: object, level: int = logging.WARNING) -> None:
        """One repair line of ``kind``, logged (at ``level``) unless this window is full."""
        now = time.monotonic()
        with self._lock:
            summary = self._roll(now)
            keep = self._lines < LINES_PER_WINDOW
            if keep:
                self._lines += 1
            else:
                self._dropped[kind] += 1
                self.dropped_total += 1
        if summary:
            self.log.warning("%s", summary)
        if keep:
            self.log.log(level, msg, *args)

    def flush(self) -> bool:
        """Log the summary of a window that is over; True while lines are still held back."""
        with self._lock:
            summary = self._roll(time.monotonic())
            pending = bool(self._dropped)
        if summary:
            self.log.warning("%s", summary)
        return pending

    def _roll(self, now: float) -> str | None:
        if now - self._window < WINDOW:
            return None
        summary = None
        if self._dropped:
            kinds = ", ".join(f"{k} {n}" for k, n in sorted(self._dropped.items()))
            n = sum(self._dropped.values())
            summary = f"repair: {n} more line(s) not logged in {now - self._window:.1f}s ({kinds}): a fight?"
        self._window, self._lines, self._dropped = now, 0, Counter()
        return summary
