"""Durable small-file writes: temp file, fsync, rename, fsync of the directory."""

from __future__ import annotations

import os
import threading

from netplugin.core.errors import SystemFailure

__all__ = ["atomic_write"]


def atomic_write(path: str, data: bytes, *, mode: int = 0o600, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically; readers see the old or the new file, never a mix."""
    directory = os.path.dirname(path) or "."
    tmp = f"{path}.tmp.{os.getpid()}.{threading.get_ident()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        if durable:
            dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise SystemFailure("cannot write", path, e.strerror or str(e)) from e
