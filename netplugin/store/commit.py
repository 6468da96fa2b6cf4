"""Group commit: the one durable point of a pod action, shared by the actions running at the same time.

A caller writes its files atomically (temp file, rename) without syncing them, then asks
:func:`make_durable` for them. One caller at a time, the leader, fsyncs every file queued so far
and each of their directories once; the callers that queued while it worked wait and are served
by the next leader, in one pass. A caller returns only once a pass that started after its files
were queued has finished, so its files are as durable as with their own fsyncs, and a burst of N
concurrent setups pays about one journal commit instead of N (on ext4, the first fsync of a pass
commits the metadata of every file in it).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable

from netplugin.core.errors import SystemFailure

__all__ = ["GroupCommit", "make_durable"]


def _fsync(path: str, directory: bool) -> None:
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | (os.O_DIRECTORY if directory else 0)
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class GroupCommit:
    """Tickets, a queue of paths and one leader at a time (thread-safe)."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._queued: list[str] = []
        self._issued = 0  # tickets handed out
        self._done = 0  # every ticket up to this one is durable
        self._leading = False
        self._failures: dict[int, SystemFailure] = {}
        #: passes run (for tests: fewer passes than callers means they were shared)
        self.passes = 0

    def sync(self, paths: Iterable[str]) -> None:
        """Return once ``paths`` (files already written) and their directories are durable.

        Raises SystemFailure naming the path when an fsync fails (the caller's action must not
        go on as if its record were safe).
        """
        with self._cv:
            self._queued.extend(paths)
            self._issued += 1
            ticket = self._issued
            while self._done < ticket:
                if not self._leading:
                    self._leading = True
                    batch, self._queued = self._queued, []
                    last = self._issued
                    break
                self._cv.wait()
            else:
                failure = self._failures.pop(ticket, None)
                if failure is not None:
                    raise failure
                return
        error: SystemFailure | None = None
        try:
            self._pass(batch)
        except SystemFailure as e:
            error = e
        with self._cv:
            self._leading = False
            self.passes += 1
            if error is not None:
                for t in range(self._done + 1, last + 1):
                    self._failures[t] = error
            self._done = last
            self._cv.notify_all()
            self._failures.pop(ticket, None)
        if error is not None:
            raise error

    def _pass(self, batch: list[str]) -> None:
        dirs: dict[str, None] = {}
        for path in dict.fromkeys(batch):
            try:
                _fsync(path, directory=False)
            except FileNotFoundError:
                pass  # removed since (a rollback): nothing of it to keep
            except OSError as e:
                raise SystemFailure("cannot sync", path, e.strerror or str(e)) from e
            dirs[os.path.dirname(path) or "."] = None
        for d in dirs:
            try:
                _fsync(d, directory=True)
            except OSError as e:
                raise SystemFailure("cannot sync", d, e.strerror or str(e)) from e


_COMMIT = GroupCommit()


def make_durable(paths: Iterable[str]) -> None:
    """Make ``paths`` durable with this process's group commit (see the module docstring)."""
    _COMMIT.sync(paths)
