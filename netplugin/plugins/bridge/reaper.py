"""Link deletion off the caller's path, coalesced: teardowns retire their host veths and return.

Deleting a link costs kernel time (RCU grace periods, ~15-30 ms), whichever way it is sent, and
deleting a *link group* costs about as much as deleting one link. Nothing a runtime does after a
pod's DEL needs that deletion over, only the pod off the network and its address free. So:

* :meth:`LinkReaper.retire` takes the link off the network at once (down, into this process's
  :func:`~netplugin.core.netlink.retired_group`: a netlink request without a grace period) and
  queues it; a worker thread of this process deletes every link it retired in one request (the
  group), and the links retired meanwhile in the next. The worker is not a daemon thread: a process exits only
  once its deletions are done (a CLI's teardown then costs what it did; a daemon's does not).
* :meth:`LinkReaper.settle` waits until a name queued here is deleted: a setup of the same pod
  right after its teardown (same container ID, so same host veth name) never meets its old veth.
* A crash between a teardown's answer and the deletion leaves a down link in the dead process's
  retired group, cut off from the bridge: gc deletes those (:func:`netplugin.manager.gc.run_gc`),
  and a setup that meets one deletes it first.
* :meth:`LinkReaper.delete` deletes at once and returns when the link is gone (a stale veth in
  the way of a setup, a failed setup's own), concurrent callers sharing one kernel request.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from netplugin.core.netlink import KernelError, RawNetlink, drop_root_netlink, root_netlink

__all__ = ["LinkReaper"]

log = logging.getLogger("netplugin.bridge")


class _Deletion:
    __slots__ = ("done", "error", "index", "name")

    def __init__(self, name: str, index: int) -> None:
        self.name = name
        self.index = index
        self.done = False
        self.error: BaseException | None = None


class LinkReaper:
    """Deletes root-netns links, many per kernel request when callers overlap.

    :meth:`delete` has no thread of its own: the first caller to find no batch in progress deletes
    everything queued so far (its own link included); callers arriving meanwhile queue and wait,
    and the first of them to wake takes the next batch. :meth:`retire` hands the deletion to a
    worker thread that lives while retired links wait.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queue: list[_Deletion] = []
        self._busy = False
        #: retired links not deleted yet: name -> ifindex
        self._retired: dict[str, int] = {}
        self._worker: threading.Thread | None = None
        #: batches run and links deleted, for tests and measurements
        self.batches = 0
        self.links = 0

    @property
    def pending(self) -> dict[str, int]:
        """The links retired here and not deleted yet (name -> ifindex)."""
        with self._cond:
            return dict(self._retired)

    def retire(self, name: str, index: int) -> None:
        """Take link ``index`` (``name``) off the network now; it is deleted after the caller returns."""
        if not root_netlink().retire(index):
            return  # gone already (its netns went, or another process deleted it)
        with self._cond:
            self._retired[name] = index
            if self._worker is None:
                # Not a daemon thread: the interpreter's exit waits for the deletions queued here.
                self._worker = threading.Thread(target=self._reap, name="netplugin-reaper")
                self._worker.start()

    def settle(self, name: str, timeout: float) -> None:
        """Return once ``name`` is no longer waiting for its deletion here (TimeoutError after ``timeout``)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while name in self._retired:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"timed out after {timeout:g}s waiting for the deletion of {name}")
                self._cond.wait(left)

    def _reap(self) -> None:
        """The worker: delete the retired group until nothing retired here waits; then end."""
        nl: RawNetlink | None = None
        try:
            while True:
                with self._cond:
                    batch = dict(self._retired)
                    if not batch:
                        self._worker = None
                        return
                try:
                    nl = nl or RawNetlink()
                    nl.delete_retired()
                except Exception as e:  # left in the retired group: gc deletes them
                    log.warning("deleting %d retired link(s) failed, left to gc: %s", len(batch), e)
                    if nl is not None:
                        nl.close()
                        nl = None
                with self._cond:
                    for name, index in batch.items():
                        if self._retired.get(name) == index:
                            del self._retired[name]
                    self.batches += 1
                    self.links += len(batch)
                    self._cond.notify_all()
        finally:
            if nl is not None:
                nl.close()

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
