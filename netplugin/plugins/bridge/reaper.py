"""Coalesced link deletion: concurrent teardowns delete their host veths in one kernel request.

Deleting a link costs kernel time (RCU grace periods), whichever way it is sent;
deleting a *link group* costs about as much as deleting one link. So concurrent callers queue
their links and one of them deletes the whole queue as a group.
"""

from __future__ import annotations

import os
import threading
import time

from netplugin.core.netlink import KernelError, drop_root_netlink, root_netlink

__all__ = ["LinkReaper"]


class _Deletion:
    __slots__ = ("done", "error", "index", "name")

    def __init__(self, name: str, index: int) -> None:
        self.name = name
        self.index = index
        self.done = False
        self.error: BaseException | None = None


class LinkReaper:
    """Deletes root-netns links, many per kernel request when callers overlap.

    There is no background thread: the first caller to find no batch in progress deletes
    everything queued so far (its own link included); callers arriving meanwhile queue and
    wait, and the first of them to wake takes the next batch. :meth:`delete` returns only when
    the link is gone.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queue: list[_Deletion] = []
        self._busy = False
        #: batches run and links deleted, for tests and measurements
        self.batches = 0
        self.links = 0

    def delete(self, name: str, index: int, timeout: float) -> None:
        job = _Deletion(name, index)
        deadline = time.monotonic() + timeout
        batch: list[_Deletion] = []
        with self._cond:
            self._queue.append(job)
            while not job.done:
                if not self._busy:
                    batch, self._queue = self._queue, []
                    self._busy = True
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    if job in self._queue:
                        self._queue.remove(job)
                        raise TimeoutError(f"timed out after {timeout:g}s waiting to delete {name}")
                    left = 0.05  # already taken by a running batch: its result is moments away
                self._cond.wait(left)
        if batch:
            try:
                failed = root_netlink().delete_links([j.index for j in batch])
                for j in batch:
                    if j.index in failed:
                        err = failed[j.index]
                        j.error = KernelError(err, f"delete {j.name}: {os.strerror(err)}")
            except BaseException as e:
                if not isinstance(e, KernelError):
                    drop_root_netlink()
                for j in batch:
                    j.error = j.error or e
            finally:
                with self._cond:
                    for j in batch:
                        j.done = True
                    self._busy = False
                    self.batches += 1
                    self.links += len(batch)
                    self._cond.notify_all()
        if job.error is not None:
            raise job.error
