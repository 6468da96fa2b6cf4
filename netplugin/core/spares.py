"""Spare inodes: the files a pod's life removes or replaces hold the next pod's files instead of being freed.

In detail: ``ARCHITECTURE.md``, "Module notes".

A pod's life used to create a file and free one at each of its records' writes: the pod record's
three transitions (a temp file renamed over the record), its lock file, and the native bridge
IPAM's two records. Allocating an inode is not free: on ext4 without a journal, each allocation
walks every inode freed in the last minute in its block group (``recently_deleted``), so a node
setting pods up and tearing them down at a steady rate paid more per file the busier it was (a
third of the daemon's CPU in the runtime benchmark), and on any file system it is metadata work.
Here a removed file moves into its directory's ``.spare/`` (up to :data:`CAP` of them), the inode
a rename replaces stays there too (a hard link made first), and the next write takes one back.
"""

from __future__ import annotations

import itertools
import os
import threading

from netplugin.core.dirs import ensure_dir
from netplugin.core.errors import NetpluginError
from netplugin.core.fileio import replace_file, start_writeback, temp_name, write_all

__all__ = ["CAP", "SPARE_DIR", "NoSpare", "Spares", "discard", "spares_for"]

#: spare inodes kept per directory (a burst of that many removals is recycled), and how many
#: :meth:`Spares.fill` makes ahead (the daemon at start: that many pod starts make no file)
CAP = 128
#: where a directory keeps them
SPARE_DIR = ".spare"

_counter = itertools.count()
#: this process's spare names: ``<pid>-<random>.<n>``; the random part keeps a later process with a
#: reused pid (the daemon after a reboot) clear of the names an earlier one left
_PREFIX = f"{os.getpid()}-{os.urandom(4).hex()}"


class Spares:
    """The spare inodes of one directory (``<directory>/.spare``) as this process knows them."""

    def __init__(self, directory: str, base: str | None) -> None:
        self.dir = os.path.join(directory, SPARE_DIR)
        self.base = base
        self._names: list[str] = []
        self._listed = False
        self._ready = False
        self._lock = threading.Lock()

    # --- the pool ------------------------------------------------------------------------------

    def _list(self) -> None:
        """Adopt the spares already there (left by other processes or an earlier daemon), once."""
        if self._listed:
            return
        self._listed = True
        try:
            names = os.listdir(self.dir)
        except OSError:
            return
        self._names.extend(os.path.join(self.dir, n) for n in names)

    def _take(self, tmp: str, mode: int) -> int | None:
        """A spare renamed to ``tmp``, opened for writing with ``mode``; None when there is none to use."""
        while True:
            with self._lock:
                self._list()
                if not self._names:
                    return None
                name = self._names.pop()
            try:
                os.rename(name, tmp)
            except FileNotFoundError:
                continue  # another process took it
            except OSError:
                return None
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                _unlink(tmp)
                return None
            try:
                if os.fstat(fd).st_nlink == 1:
                    os.fchmod(fd, mode)
                    return fd
            except OSError:
                pass
            os.close(fd)  # still a live file's inode too (a crash between keep and rename): never write it
            _unlink(tmp)

    def _keep(self, path: str, *, move: bool) -> str | None:
        """Put the inode ``path`` names among the spares (``move``: rename it, else hard-link it)."""
        with self._lock:
            self._list()
            if len(self._names) >= CAP:
                return None
        if not self._ready:
            if not os.path.lexists(path):
                return None  # nothing to keep: no need for the directory yet
            try:
                ensure_dir(self.dir, base=self.base, mode=0o700)
            except (OSError, NetpluginError):
                return None  # no spares then: files are made and removed as by the plain writers
            self._ready = True
        name = os.path.join(self.dir, f"{_PREFIX}.{next(_counter)}")
        try:
            (os.rename if move else os.link)(path, name)
        except FileNotFoundError:
            return None
        except OSError:
            self._ready = False  # check the directory again next time
            return None
        return name

    def _add(self, name: str | None) -> None:
        if name is not None:
            with self._lock:
                self._names.append(name)

    def fill(self, target: int = CAP) -> int:
        """Make empty spares until there are ``target``, ahead of need (off the pod-start path); how many made.

        Raises OSError or NetpluginError when the directory cannot be used.
        """
        with self._lock:
            self._list()
            missing = target - len(self._names)
        if missing <= 0:
            return 0
        ensure_dir(self.dir, base=self.base, mode=0o700)
        self._ready = True
        made = 0
        for _ in range(missing):
            name = os.path.join(self.dir, f"{_PREFIX}.{next(_counter)}")
            os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
            self._add(name)
            made += 1
        return made

    # --- the three writes --------------------------------------------------------------------------

    def _filled(self, path: str, data: bytes, mode: int, hidden: bool, writeback: bool = False) -> str | None:
        """A spare holding exactly ``data`` under ``path``'s temp name, or None when there is none."""
        tmp = temp_name(path, hidden=hidden)
        fd = self._take(tmp, mode)
        if fd is None:
            return None
        try:
            try:
                write_all(fd, data)  # just opened: at offset 0
                os.ftruncate(fd, len(data))
                if writeback:
                    start_writeback(fd)
            finally:
                os.close(fd)
        except OSError:
            _unlink(tmp)
            raise
        return tmp

    def replace(self, path: str, data: bytes, *, mode: int, hidden: bool = False, writeback: bool = False) -> None:
        """Replace ``path`` with ``data`` atomically, not durable (:func:`replace_file`); raises OSError."""
        tmp = self._filled(path, data, mode, hidden, writeback)
        kept = self._keep(path, move=False)
        try:
            if tmp is None:
                replace_file(path, data, mode=mode, durable=False, hidden=hidden, writeback=writeback)
            else:
                os.replace(tmp, path)
        except OSError:
            if tmp is not None:
                _unlink(tmp)
            if kept is not None:
                _unlink(kept)
            raise
        self._add(kept)

    def create(self, path: str, data: bytes, *, mode: int, hidden: bool = False, writeback: bool = False) -> bool:
        """Create ``path`` holding ``data`` unless it exists (False then), from a spare.

        Raises :class:`NoSpare` when there is none: the caller makes the file its own way.
        """
        tmp = self._filled(path, data, mode, hidden, writeback)
        if tmp is None:
            raise NoSpare
        try:
            os.link(tmp, path)
        except FileExistsError:
            self._add(self._keep(tmp, move=True))
            return False
        finally:
            _unlink(tmp)  # a no-op after the move above
        return True

    def remove(self, path: str) -> None:
        """Remove ``path`` (FileNotFoundError when absent), keeping its inode when there is room."""
        kept = self._keep(path, move=True)
        if kept is None:
            os.unlink(path)
        self._add(kept)


class NoSpare(Exception):
    """:meth:`Spares.create` has no spare to make the file from."""


_registry: dict[str, Spares] = {}
_registry_lock = threading.Lock()


def spares_for(directory: str, base: str | None) -> Spares:
    """This process's spares of ``directory`` (one per directory, shared by everything writing there)."""
    with _registry_lock:
        got = _registry.get(directory)
        if got is None:
            got = _registry[directory] = Spares(directory, base)
        return got


def discard(path: str, spares: Spares | None = None) -> None:
    """Remove ``path`` if it is there, its inode kept among ``spares`` when given; raises OSError,
    which each caller turns into its own error."""
    try:
        if spares is not None:
            spares.remove(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
