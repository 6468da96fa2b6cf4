"""The names changed in one directory since the last look, from inotify.

A reader that keeps a large directory's files in memory (the pod repairer and the pod records)
re-reads only the names the kernel says changed, rather than listing and stat-ing every entry
each time: on a full node that listing is most of a pass's cost, and a pass follows every
teardown. Where the kernel cannot tell (the first look, its queue overflowed, the directory
missing, replaced or moved, inotify unavailable) the answer is None: read everything.
"""

from __future__ import annotations

import ctypes
import logging
import os
import struct

from netplugin.core.netns import libc_handle

__all__ = ["DirWatch"]

log = logging.getLogger("netplugin.dirwatch")

_IN_MODIFY = 0x2
_IN_CLOSE_WRITE = 0x8
_IN_MOVED_FROM = 0x40
_IN_MOVED_TO = 0x80
_IN_CREATE = 0x100
_IN_DELETE = 0x200
_IN_DELETE_SELF = 0x400
_IN_MOVE_SELF = 0x800
_IN_Q_OVERFLOW = 0x4000
_IN_IGNORED = 0x8000
_IN_ONLYDIR = 0x1000000
#: what changes a file's content or its presence under a name
_ENTRY = _IN_MODIFY | _IN_CLOSE_WRITE | _IN_MOVED_FROM | _IN_MOVED_TO | _IN_CREATE | _IN_DELETE
#: after these the watch tells nothing more about the directory's entries
_BLIND = _IN_Q_OVERFLOW | _IN_IGNORED | _IN_DELETE_SELF | _IN_MOVE_SELF
#: struct inotify_event without its name: wd, mask, cookie, len
_EVENT = struct.Struct("iIII")


class DirWatch:
    """Changes to the entries of ``path``; not thread-safe (one reader owns it)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        self._warned = False

    def changed(self) -> set[str] | None:
        """The names created, written, renamed or removed since the last call, or None: read every
        entry (the watch is set first, so what changes during that read is in the next answer)."""
        if self._fd is None:
            self._open()
            return None
        names: set[str] = set()
        blind = False
        while True:
            try:
                data = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                break
            offset = 0
            while offset + _EVENT.size <= len(data):
                _, mask, _, size = _EVENT.unpack_from(data, offset)
                name = data[offset + _EVENT.size : offset + _EVENT.size + size].split(b"\0", 1)[0]
                offset += _EVENT.size + size
                if mask & _BLIND:
                    blind = True
                elif name:
                    names.add(os.fsdecode(name))
        if blind:
            self.close()
            self._open()
            return None
        return names

    def _open(self) -> None:
        libc = libc_handle()
        fd = int(libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC))
        if fd < 0:
            self._warn("inotify_init1")
            return
        mask = _ENTRY | _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_ONLYDIR
        if libc.inotify_add_watch(fd, os.fsencode(self.path), mask) < 0:
            os.close(fd)  # missing (not made yet) or not a directory: every look reads everything
            return
        self._fd = fd

    def _warn(self, call: str) -> None:
        if not self._warned:
            self._warned = True
            err = ctypes.get_errno()
            log.warning("%s failed (%s): %s is read whole each time", call, os.strerror(err), self.path)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
