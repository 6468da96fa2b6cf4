"""File locks shared by every netplugin process on the node (CLI, daemon, CNI shim).

``flock`` locks belong to an open file description, so two opens of the same
file conflict even inside one process: the same helper serialises threads of
the daemon and separate CLI processes alike. Locks die with their holder, so a
killed netplugin never leaves a pod locked.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager

from netplugin.core.errors import SystemFailure
from netplugin.core.names import PodRef

__all__ = ["ensure_dir", "flocked"]


def ensure_dir(path: str, mode: int = 0o700) -> str:
    try:
        os.makedirs(path, mode=mode, exist_ok=True)
    except OSError as e:
        raise SystemFailure("cannot create directory", path, e.strerror or str(e)) from e
    return path


@contextmanager
def flocked(path: str, *, shared: bool = False) -> Iterator[int]:
    """Hold an exclusive (or shared) flock on ``path`` (created if needed) for the block."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except FileNotFoundError:
        ensure_dir(os.path.dirname(path))
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as e:
            raise SystemFailure("cannot open lock file", path, e.strerror or str(e)) from e
    except OSError as e:
        raise SystemFailure("cannot open lock file", path, e.strerror or str(e)) from e
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        except OSError as e:
            raise SystemFailure("cannot lock", path, e.strerror or str(e)) from e
        yield fd
    finally:
        os.close(fd)


def pod_lock_path(run_dir: str, pod: PodRef) -> str:
    """The file whose flock serialises every action on one pod (all infra ids of the pod name)."""
    key = pod.key
    if len(key) > 200:
        # namespace (63) + name (253) can exceed a file name's 255 bytes; '~' never occurs in a key
        import hashlib

        key = f"{key[:160]}~{hashlib.sha256(key.encode()).hexdigest()[:24]}"
    return os.path.join(run_dir, "locks", key + ".lock")
