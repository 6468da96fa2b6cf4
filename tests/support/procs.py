"""Whether test processes live: a zombie is dead, SIGKILL takes a moment to be delivered."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

__all__ = ["pid_alive", "read_pids", "still_alive"]


def pid_alive(pid: int) -> bool:
    """True if ``pid`` runs (a zombie is dead: it only waits for its parent to reap it)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def still_alive(pids: Iterable[int], within: float = 5.0) -> list[int]:
    """The pids that are still alive after waiting up to ``within`` s for SIGKILL to be delivered."""
    pids = list(pids)
    end = time.monotonic() + within
    while True:
        alive = [p for p in pids if pid_alive(p)]
        if not alive or time.monotonic() > end:
            return alive
        time.sleep(0.02)


def read_pids(path: Any) -> list[int]:
    with open(path) as f:
        return [int(line) for line in f.read().split()]
