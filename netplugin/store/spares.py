"""Spare inodes for pod records: the files of replaced and removed records hold the next record's bytes.

Every record transition writes a new file (temp, rename over the record) and every removal frees
one, so a pod's life used to allocate three inodes and free three. Allocating an inode is not free:
on ext4 without a journal, each allocation walks every inode freed in the last minute in its block
group (``recently_deleted``), so a node that sets pods up and tears them down at a steady rate paid
more per write the busier it was (a third of the daemon's CPU in the runtime benchmark). Here the
inode a rename replaces, and the file a removal drops, move to ``pods/.spare/`` instead; the next
write takes one back (rename to its temp name), writes it and renames it over the record. Readers
see exactly what they saw before: the record's path names a complete file at every moment, old or
new, and a crash leaves the same temp names the plain writer leaves (``<record>.tmp.<pid>.<tid>``,
found by gc when its writer is dead).

What changes for a reader that holds no pod lock (``netplugin pods``, gc's scan): a file it opened
just before its record was removed may be taken and rewritten for another pod before it reads, so
it may read another pod's record (the name check refuses it as corrupt) or a torn one. The scan
reads a corrupt-looking record once more before it reports it (:meth:`StateStore.scan`), and gc
sets a corrupt file aside only after that second read.

A spare is used only while it has one link: a crash between keeping the old inode (a hard link
into ``.spare/``) and the rename over it would leave a "spare" that is also the live record, and
taking that one would overwrite the record; such a name is dropped instead. At most :data:`CAP`
spares are kept per directory; past that, removal unlinks as before.
"""

from __future__ import annotations

import itertools
import os
import threading

from netplugin.core.dirs import ensure_dir
from netplugin.core.errors import NetpluginError
from netplugin.core.fileio import replace_file, temp_name

__all__ = ["CAP", "SPARE_DIR", "Spares", "spares_for"]

#: spare inodes kept per records directory (a burst of that many removals is recycled)
CAP = 64
#: where they are kept, inside the records directory
SPARE_DIR = ".spare"

_counter = itertools.count()


class Spares:
    """The spare inodes of one records directory, as this process knows them."""

    def __init__(self, directory: str, base: str) -> None:
        self.dir = os.path.join(directory, SPARE_DIR)
        self.base = base
        self._names: list[str] = []
        self._listed = False
        self._lock = threading.Lock()

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

    def _new_name(self) -> str:
        return os.path.join(self.dir, f"{os.getpid()}.{next(_counter)}")

    def _take(self, tmp: str) -> int | None:
        """A spare renamed to ``tmp`` and opened for writing, or None when there is none to use."""
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
            st = os.fstat(fd)
            if st.st_nlink == 1:
                return fd
            os.close(fd)  # still a record's inode too (a crash between keep and rename): never write it
            _unlink(tmp)

    def _room(self) -> bool:
        with self._lock:
            self._list()
            return len(self._names) < CAP

    def _ensure_dir(self) -> bool:
        try:
            ensure_dir(self.dir, base=self.base, mode=0o700)
        except (OSError, NetpluginError):
            return False  # no spares then: records are written as by the plain writer
        return True

    def _keep(self, path: str, *, move: bool) -> str | None:
        """Put the inode ``path`` names into the spares (``move``: rename it, else link it); its spare name."""
        if not self._room() or not self._ensure_dir():
            return None
        name = self._new_name()
        try:
            (os.rename if move else os.link)(path, name)
        except OSError:
            return None
        return name

    def _add(self, name: str) -> None:
        with self._lock:
            self._names.append(name)

    def write(self, path: str, data: bytes, mode: int) -> None:
        """Replace ``path`` with ``data`` atomically, as :func:`replace_file` (not durable); raises OSError."""
        tmp = temp_name(path)
        fd = self._take(tmp)
        if fd is None:
            kept = self._keep(path, move=False)
            try:
                replace_file(path, data, mode=mode, durable=False)
            except OSError:
                if kept is not None:
                    _unlink(kept)
                raise
            if kept is not None:
                self._add(kept)
            return
        try:
            try:
                os.fchmod(fd, mode)
                view = memoryview(data)
                off = 0
                while off < len(data):
                    off += os.pwrite(fd, view[off:], off)
                os.ftruncate(fd, len(data))
            finally:
                os.close(fd)
        except OSError:
            _unlink(tmp)
            raise
        kept = self._keep(path, move=False)
        try:
            os.replace(tmp, path)
        except OSError:
            _unlink(tmp)
            if kept is not None:
                _unlink(kept)
            raise
        if kept is not None:
            self._add(kept)

    def remove(self, path: str) -> None:
        """Remove ``path`` (FileNotFoundError when absent), keeping its inode as a spare when there is room."""
        kept = self._keep(path, move=True)
        if kept is not None:
            self._add(kept)
            return
        os.unlink(path)


_registry: dict[str, Spares] = {}
_registry_lock = threading.Lock()


def spares_for(directory: str, base: str) -> Spares:
    """This process's spares of ``directory`` (one per directory, shared by every store on it)."""
    with _registry_lock:
        got = _registry.get(directory)
        if got is None:
            got = _registry[directory] = Spares(directory, base)
        return got


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
