"""The files and the lock of a bridge IPAM directory (the format is in :mod:`netplugin.plugins.bridge.ipam`).

Every allocate and release, of either family, holds one exclusive flock on ``<dir>/lock``: the
bash plugin flocks the same file, so the two plugins can share a directory. Threads of one
process queue on a per-path thread lock first, so the flock is only ever polled for other
processes.
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from netplugin.core.dirs import ensure_dir
from netplugin.core.errors import InvalidArgument, NetpluginError
from netplugin.core.fileio import FileRefused, read_bounded, replace_file, start_writeback, write_all
from netplugin.core.names import validate_infra_id
from netplugin.core.spares import NoSpare, Spares, discard

__all__ = ["DirLock", "IPAMError", "listdir", "read_owner", "read_text", "unlink", "write_record"]


class IPAMError(NetpluginError):
    """The IPAM directory cannot serve the request; names the file or directory at fault."""

    def __init__(self, message: str, *, path: str, **details: object) -> None:
        super().__init__(message, path=path, **details)
        self.path = path


#: an owner record is an infra id and a newline; a longer file is torn
_MAX_OWNER = 511

_thread_locks: dict[str, threading.Lock] = {}
_thread_locks_guard = threading.Lock()


def _thread_lock(path: str) -> threading.Lock:
    with _thread_locks_guard:
        lock = _thread_locks.get(path)
        if lock is None:
            lock = _thread_locks[path] = threading.Lock()
        return lock


class DirLock:
    """The flock on ``lock_path``; creates ``dirs`` (and the lock's directory) on first use."""

    def __init__(self, lock_path: str, dirs: Sequence[str], timeout: float) -> None:
        self.path = lock_path
        self.dirs = (os.path.dirname(lock_path), *dirs)
        self.timeout = timeout
        self._ready = False

    @contextmanager
    def hold(self, timeout: float | None = None) -> Iterator[None]:
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        tlock = _thread_lock(self.path)
        if not tlock.acquire(timeout=max(limit, 0.0)):
            raise IPAMError(f"timed out after {limit:g}s waiting for lock {self.path}", path=self.path)
        try:
            self._prepare()
            fd = self._open()
            try:
                self._flock(fd, deadline, limit)
                yield
            finally:
                os.close(fd)
        finally:
            tlock.release()

    def _prepare(self) -> None:
        if self._ready:
            return
        # The IPAM directory and its subdirectories are root's own: a directory another user can
        # write (or a symlink put in its place) would let that user steer root's writes.
        base = self.dirs[0]
        for d in self.dirs:
            try:
                ensure_dir(d, base=base if d != base else None)
            except OSError as e:
                raise IPAMError(f"cannot create {d}: {e.strerror or e}", path=d) from e
        self._ready = True

    def _open(self) -> int:
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
        try:
            return os.open(self.path, flags, 0o644)
        except FileNotFoundError:
            self._ready = False  # the directory was removed under us: create it again
            self._prepare()
            return os.open(self.path, flags, 0o644)
        except OSError as e:
            raise IPAMError(f"cannot open {self.path}: {e.strerror or e}", path=self.path) from e

    def _flock(self, fd: int, deadline: float, limit: float) -> None:
        # flock(2) has no timeout; poll with a growing sleep. Other processes hold the lock for
        # well under a millisecond.
        delay = 0.0005
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EINTR):
                    raise IPAMError(f"cannot lock {self.path}: {e.strerror or e}", path=self.path) from e
            now = time.monotonic()
            if now >= deadline:
                raise IPAMError(f"timed out after {limit:g}s waiting for lock {self.path}", path=self.path)
            time.sleep(min(delay, deadline - now))
            delay = min(delay * 2, 0.02)


def read_text(path: str, limit: int) -> str | None:
    """At most ``limit`` bytes of a record as text (longer: ``limit + 1``, the record is torn); None if absent."""
    try:
        return read_bounded(path, limit).decode("utf-8", "replace")
    except FileNotFoundError:
        return None
    except FileRefused as e:
        raise IPAMError(f"cannot read {path}: {e.reason}", path=path) from None
    except OSError as e:
        raise IPAMError(f"cannot read {path}: {e.strerror or e}", path=path) from e


def read_owner(path: str) -> str | None:
    """The infra id in ``ips/<addr>``; None if absent, "" if torn."""
    text = read_text(path, _MAX_OWNER)
    if text is None:
        return None
    owner = text[:-1] if text.endswith("\n") else ""
    try:
        validate_infra_id(owner)
    except InvalidArgument:
        return ""
    return owner


def write_record(path: str, text: str, *, mode: str = "atomic", spares: Spares | None = None) -> None:
    """Write a record: "atomic" (temp file + rename), "exclusive" (O_EXCL) or "in-place".

    ``spares``: the IPAM directory's spare inodes (:mod:`netplugin.core.spares`), which "atomic"
    and "exclusive" writes use before they make a new file.

    Records that stay as long as their pod ("atomic", "exclusive") have their writeback started at
    once (:func:`~netplugin.core.fileio.start_writeback`). "in-place" (the cursor, a repaired address
    file) overwrites from the start and then cuts the file to the new length, never truncating it to
    zero first: on ext4 (``auto_da_alloc``) a file truncated to zero and written is flushed on close.
    """
    data = text.encode()
    if spares is not None and mode != "in-place":
        try:
            if mode == "atomic":
                spares.replace(path, data, mode=0o644, hidden=True, writeback=True)
            elif not spares.create(path, data, mode=0o644, hidden=True, writeback=True):
                raise IPAMError(f"cannot write {path}: {os.strerror(errno.EEXIST)}", path=path)
            return
        except NoSpare:
            pass
        except OSError as e:
            raise IPAMError(f"cannot write {path}: {e.strerror or e}", path=path) from e
    if mode != "atomic":
        flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | (os.O_EXCL if mode == "exclusive" else 0)
        try:
            fd = os.open(path, flags, 0o644)
        except OSError as e:
            raise IPAMError(f"cannot write {path}: {e.strerror or e}", path=path) from e
        try:
            write_all(fd, data)
            if mode == "exclusive":
                start_writeback(fd)
            else:
                # A kill between the write and the cut leaves the old tail after a newline: the
                # readers treat that as torn (cursor: start over; address file: owner unknown).
                os.ftruncate(fd, len(data))
        except OSError as e:
            if mode == "exclusive":
                unlink(path)  # O_EXCL made it ours: a torn address file must not stay (ENOSPC)
            raise IPAMError(f"cannot write {path}: {e.strerror or e}", path=path) from e
        finally:
            os.close(fd)
        return
    try:
        # hidden: listings of ips/ and pods/ skip dot files, the bash plugin's temp files too
        replace_file(path, data, mode=0o644, durable=False, hidden=True, writeback=True)
    except OSError as e:
        raise IPAMError(f"cannot write {path}: {e.strerror or e}", path=path) from e


def unlink(path: str, spares: Spares | None = None) -> None:
    """Remove a record if it is there (its inode kept among ``spares`` when given)."""
    try:
        discard(path, spares)
    except OSError as e:
        raise IPAMError(f"cannot remove {path}: {e.strerror or e}", path=path) from e


def listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []
    except OSError as e:
        raise IPAMError(f"cannot list {path}: {e.strerror or e}", path=path) from e
