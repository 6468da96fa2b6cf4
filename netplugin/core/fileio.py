"""Bounded file reads and atomic, durable small-file writes: the one home of both.

In detail: ``ARCHITECTURE.md``, "Module notes".

Reads (:func:`read_bounded`, :func:`read_small`) open non-blocking, so a FIFO planted where a
file is expected never hangs the reader (and is refused), accept only regular files (character
devices on request: ``/dev/null`` as an empty config), refuse a symbolic link unless told to
follow, and read at most one byte past the limit, so ``/dev/zero`` or a huge file costs nothing.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import threading
from collections.abc import Callable

from netplugin.core.errors import SystemFailure

__all__ = [
    "TMP_INFIX",
    "FileRefused",
    "atomic_write",
    "create_file",
    "read_bounded",
    "read_small",
    "replace_file",
    "stale_temps",
    "start_writeback",
    "temp_name",
    "temp_writer_pids",
    "write_all",
]

#: what a temp file adds after the destination's name: "<path>.tmp.<pid>.<thread-id>"
TMP_INFIX = ".tmp."


class FileRefused(Exception):
    """:func:`read_bounded` does not read this file (``reason`` says why: "not a regular file")."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def read_bounded(
    path: str,
    limit: int,
    *,
    follow: bool = False,
    devices: bool = False,
    check: Callable[[os.stat_result], None] | None = None,
) -> bytes:
    """At most ``limit + 1`` bytes of the file at ``path``: more than ``limit`` means "too large".

    The caller words "too large" itself (its limit, its kind of file). Opened non-blocking, with
    ``O_NOFOLLOW`` unless ``follow`` (a symbolic link then fails with ``ELOOP``); only a regular
    file, or with ``devices`` a character device, is read, anything else raises
    :class:`FileRefused`. ``check`` sees the opened file's stat before anything is read and may
    raise. OSError (absent, unreadable, I/O) passes through unchanged.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not (stat.S_ISREG(st.st_mode) or (devices and stat.S_ISCHR(st.st_mode))):
            raise FileRefused(path, "not a regular file")
        if check is not None:
            check(st)
        chunks: list[bytes] = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def read_small(path: str, limit: int = 1 << 16) -> bytes:
    """The bytes of a small regular file, opened ``O_NOFOLLOW``; FileNotFoundError when absent.

    Raises SystemFailure when it is a symbolic link, not a regular file, or larger than ``limit``.
    """
    try:
        data = read_bounded(path, limit)
    except FileNotFoundError:
        raise
    except FileRefused as e:
        raise SystemFailure("cannot read", path, e.reason) from None
    except OSError as e:
        why = "is a symbolic link (refused)" if e.errno == errno.ELOOP else e.strerror or str(e)
        raise SystemFailure("cannot read", path, why) from e
    if len(data) > limit:
        raise SystemFailure("cannot read", path, f"larger than {limit} bytes")
    return data


def temp_name(path: str, *, hidden: bool = False) -> str:
    """The temp file of a write to ``path``: ours by pid and thread; ``hidden`` starts it with a dot.

    A hidden temp (``.<name>.<pid>.<thread-id>.tmp``, the bash bridge plugin's pattern) stays
    out of listings that skip dot files (the IPAM's ``ips/`` and ``pods/``).
    """
    if hidden:
        directory, base = os.path.split(path)
        return os.path.join(directory, f".{base}.{os.getpid()}.{threading.get_ident()}.tmp")
    return f"{path}{TMP_INFIX}{os.getpid()}.{threading.get_ident()}"


def _create(tmp: str, mode: int) -> int:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(tmp, flags, mode)
    except FileExistsError:
        # Left by a dead writer that had our pid and thread id: it is ours to remove. unlink does
        # not follow a symbolic link, and O_EXCL below refuses whatever appears meanwhile.
        os.unlink(tmp)
        return os.open(tmp, flags, mode)


def start_writeback(fd: int) -> None:
    """Start writing the file's dirty data to disk now, without waiting for it.

    For small files that are written once and kept (pod records, IPAM records): left to the kernel's
    flusher, the data of hundreds of pods written in a burst is written back all at once ~30 s later,
    and every journal commit (the next pod's fsync) then waits for that pile (ext4 ``data=ordered``).
    Written back as each file is made, the pile never forms. Only a hint: a failure here is left to the
    flusher (and to the fsync that makes the file durable, which reports it).
    """
    try:
        # POSIX_FADV_DONTNEED starts asynchronous writeback of the dirty pages (WB_SYNC_NONE) and
        # drops only clean ones: pages still under writeback stay cached, a page whose write has
        # already finished is dropped (a later read goes to disk). sync_file_range would keep it,
        # but is not in the os module, and ctypes would cost every CLI call its import.
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except OSError:
        pass


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` at ``fd``'s offset (a short write is continued); raises OSError."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _write_temp(path: str, data: bytes, mode: int, durable: bool, hidden: bool, writeback: bool = False) -> str:
    """A complete temp file beside ``path`` holding ``data``; removed again if writing fails."""
    tmp = temp_name(path, hidden=hidden)
    fd = _create(tmp, mode)
    try:
        try:
            os.fchmod(fd, mode)
            write_all(fd, data)
            if durable:
                os.fsync(fd)
            elif writeback:
                start_writeback(fd)
        finally:
            os.close(fd)
    except OSError:
        _discard(tmp)
        raise
    return tmp


def _discard(tmp: str) -> None:
    try:
        os.unlink(tmp)
    except OSError:
        pass  # the write's own error is the one to report


def _sync_dir(path: str) -> None:
    dfd = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def replace_file(
    path: str, data: bytes, *, mode: int = 0o600, durable: bool = True, hidden: bool = False, writeback: bool = False
) -> None:
    """Replace ``path`` with ``data`` atomically (readers see the old or the new file); raises OSError.

    ``durable`` fsyncs the file before and the directory after the rename; otherwise ``writeback``
    starts writing the data out before the rename (see :func:`start_writeback`).
    """
    tmp = _write_temp(path, data, mode, durable, hidden, writeback)
    try:
        os.replace(tmp, path)
    except OSError:
        _discard(tmp)
        raise
    if durable:
        _sync_dir(path)


def atomic_write(path: str, data: bytes, *, mode: int = 0o600, durable: bool = True, writeback: bool = False) -> None:
    """:func:`replace_file`, failing with SystemFailure ("cannot write", the path, the reason)."""
    try:
        replace_file(path, data, mode=mode, durable=durable, writeback=writeback)
    except OSError as e:
        raise SystemFailure("cannot write", path, e.strerror or str(e)) from e


def create_file(path: str, data: bytes, *, mode: int = 0o600) -> bool:
    """Create ``path`` complete and durable, never replacing it: False if it exists already.

    The file appears with its whole content (temp, fsync, hard link); raises OSError.
    """
    tmp = _write_temp(path, data, mode, True, False)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)
    _sync_dir(path)
    return True


# --- temp files of dead writers ---------------------------------------------------------------------

_SHAPES = (
    re.compile(r"[^:]+:[^:]+\.json\.tmp\.(\d+)\.\d+"),
    re.compile(r"\..+\.(\d+)\.\d+\.tmp"),
    re.compile(r"\..+\.(\d+)\.tmp"),
)


def temp_writer_pids(name: str) -> list[int]:
    """The possible writers' pids when ``name`` is one of netplugin's temp file names, else [].

    More than one when the shapes are ambiguous (``.a.5.1234.tmp``: the native IPAM's pid 5, or
    the bash IPAM's pid 1234): the file is stale only when every one of them is dead.
    """
    return [int(m.group(1)) for m in (shape.fullmatch(name) for shape in _SHAPES) if m]


def stale_temps(root: str, *, max_depth: int = 4) -> list[str]:
    """Temp files under ``root`` (at most ``max_depth`` directories down) whose writer is dead.

    Symbolic links are neither followed nor listed; only regular files count. A directory that
    cannot be listed is skipped (gc reports what it removes, not what it could not see).
    """
    # gc's alone: fileio is on the per-call paths, which need no process probe
    from netplugin.core.procs import pid_alive

    found: list[str] = []
    todo = [(root, 0)]
    while todo:
        directory, depth = todo.pop()
        try:
            with os.scandir(directory) as it:
                entries = list(it)
        except OSError:
            continue
        for entry in entries:
            try:
                mode = entry.stat(follow_symlinks=False).st_mode
            except OSError:
                continue
            if stat.S_ISDIR(mode):
                if depth < max_depth:
                    todo.append((entry.path, depth + 1))
                continue
            pids = temp_writer_pids(entry.name) if stat.S_ISREG(mode) else []
            if pids and not any(map(pid_alive, pids)):
                found.append(entry.path)
    return sorted(found)
