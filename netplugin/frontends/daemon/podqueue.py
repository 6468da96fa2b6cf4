"""Per-pod turns: requests for a busy pod wait in the event loop, not in a worker thread.

Waiting for the pod's flock inside a worker would let one stuck pod take every worker; here the
wait is on an asyncio lock per key (the flock's key), which holds no thread. A worker may still
wait on the flock itself while a CLI or CNI process holds it, but only one per key.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from netplugin.core.errors import DaemonUnavailable

__all__ = ["MAX_WAITING_PER_POD", "PodTurns", "container_turn"]

#: requests that may wait for one pod; more are answered DaemonUnavailable (the caller may do it itself)
MAX_WAITING_PER_POD = 64


def container_turn(container: str) -> tuple[str, str]:
    """A forwarded CNI call's turn: its container's key, and how a refusal names it.

    Its pod is known only once the shim's code has parsed the call (in a worker), so the turn is
    the container's: a runtime retrying a stuck sandbox queues on it, holding no worker.
    """
    return f"cni:{container}", f"container {container[:80]}"


class PodTurns:
    """Whose turn it is per pod (or container) key: one asyncio lock and a waiter count each (event loop only)."""

    def __init__(self, socket_path: str, stopping: Callable[[], bool]) -> None:
        self._socket_path = socket_path
        self._stopping = stopping
        self._turns: dict[str, tuple[asyncio.Lock, list[int]]] = {}

    @property
    def waiting(self) -> int:
        """Requests waiting behind another one for their key's turn."""
        return sum(max(0, count[0] - 1) for _, count in self._turns.values())

    @contextlib.asynccontextmanager
    async def turn(self, key: str, what: str) -> AsyncIterator[None]:
        """Wait until no earlier request of this daemon holds ``key``'s turn.

        Raises DaemonUnavailable (the request is not run) past MAX_WAITING_PER_POD, or when the
        daemon started stopping while the request waited.
        """
        entry = self._turns.get(key)
        if entry is None:
            entry = self._turns[key] = (asyncio.Lock(), [0])
        lock, count = entry
        if count[0] > MAX_WAITING_PER_POD:
            raise DaemonUnavailable(self._socket_path, f"{count[0] - 1} requests are already waiting for {what}")
        count[0] += 1
        try:
            async with lock:
                if self._stopping():  # queued before SIGTERM: not run, so the caller may do it itself
                    raise DaemonUnavailable(self._socket_path, "it is shutting down")
                yield
        finally:
            count[0] -= 1
            if count[0] == 0:
                del self._turns[key]
