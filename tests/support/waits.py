"""One way for a test to wait for what a background process does: poll a check, with a bound.

The bound only ends a stuck run (a daemon that never answers, a watch that never syncs); it is not
a claim about how fast anything is. Speed is measured by the benchmarks, never asserted here.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from netplugin.frontends.wire.client import NotSent, exchange

__all__ = ["POLL", "WITHIN", "wait_answering", "wait_for"]

T = TypeVar("T")

#: how often a check is polled (seconds)
POLL = 0.05
#: the usual bound (seconds): generous, as a loaded CI machine may take seconds for a step that
#: takes milliseconds alone; it only ends a hung wait
WITHIN = 60.0


def wait_for(
    check: Callable[[], T],
    what: str,
    within: float,
    *,
    detail: Callable[[], str] | None = None,
    interval: float = POLL,
) -> T:
    """The first truthy value of ``check()``, polled every ``interval`` seconds.

    After ``within`` seconds without one: an AssertionError naming ``what``, the bound and
    ``detail()`` (a log tail, say). An exception ``check`` raises (a process that exited) ends
    the wait at once.
    """
    deadline = time.monotonic() + within
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            more = f"\n{detail()}" if detail is not None else ""
            raise AssertionError(f"gave up waiting for {what} after {within:g} s (last: {value!r}){more}")
        time.sleep(interval)


def wait_answering(socket: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    """Until the daemon ``proc`` answers ``health`` on ``socket``; its exit fails at once, with ``log``."""

    def answers() -> bool:
        try:
            if exchange(socket, {"v": 1, "op": "health"}, timeout=10)["ok"]:
                return True
        except NotSent:
            pass
        assert proc.poll() is None, f"the daemon exited ({proc.returncode}):\n{log.read_text()}"
        return False

    wait_for(answers, "the daemon to answer", WITHIN, detail=log.read_text)
