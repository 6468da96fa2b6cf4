"""Durable small-file writes: temp file, fsync, rename, fsync of the directory.

Every file is created ``O_CREAT | O_EXCL | O_NOFOLLOW`` (a planted file or symbolic link
under the temp name is never written through) with exactly the given mode, whatever the
umask; the rename replaces a symbolic link at the destination instead of following it.
The directory is one of netplugin's own (checked by the caller with ``ensure_dir``).
"""

from __future__ import annotations

import errno
import os
import stat
import threading

from netplugin.core.errors import SystemFailure

__all__ = ["atomic_write", "read_small"]


def _create(tmp: str, mode: int) -> int:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(tmp, flags, mode)
    except FileExistsError:
        # Left by a dead writer that had our pid and thread id: it is ours to remove. unlink does
        # not follow a symbolic link, and O_EXCL below refuses whatever appears meanwhile.
        os.unlink(tmp)
        return os.open(tmp, flags, mode)


def atomic_write(path: str, data: bytes, *, mode: int = 0o600, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically; readers see the old or the new file, never a mix."""
    directory = os.path.dirname(path) or "."
    tmp = f"{path}.tmp.{os.getpid()}.{threading.get_ident()}"
    created = False
    try:
        fd = _create(tmp, mode)
        created = True
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        created = False
        if durable:
            dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
    except OSError as e:
        if created:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        raise SystemFailure("cannot write", path, e.strerror or str(e)) from e


def read_small(path: str, limit: int = 1 << 16) -> bytes:
    """The bytes of a small regular file, opened ``O_NOFOLLOW``; FileNotFoundError when absent.

    Raises SystemFailure when it is a symbolic link, not a regular file, or larger than ``limit``.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as e:
        why = "is a symbolic link (refused)" if e.errno == errno.ELOOP else e.strerror or str(e)
        raise SystemFailure("cannot read", path, why) from e
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SystemFailure("cannot read", path, "not a regular file")
        data = os.read(fd, limit + 1)
    except OSError as e:
        raise SystemFailure("cannot read", path, e.strerror or str(e)) from e
    finally:
        os.close(fd)
    if len(data) > limit:
        raise SystemFailure("cannot read", path, f"larger than {limit} bytes")
    return data
