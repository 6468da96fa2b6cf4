"""Sockets inside another network namespace, without forking and without moving other threads."""

from __future__ import annotations

import errno
import os
import socket
from typing import Any

__all__ = ["netns_socket"]


_CLONE_NEWNET = 0x40000000


_libc: Any = None


def _setns(fd: int) -> None:
    global _libc
    import ctypes  # here: ctypes costs ~5 ms to import, and only pod actions need it

    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    if _libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def netns_socket(path: str) -> socket.socket:
    """A NETLINK_ROUTE socket inside the network namespace at ``path`` (FileNotFoundError if none).

    Only the calling thread changes namespace, only around ``socket()``, and it switches back
    before anything else runs. Failing to switch back is fatal (``os.abort``): a thread silently
    left in a pod's netns would corrupt everything it did afterwards.
    """
    target = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        saved = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            try:
                _setns(target)
            except OSError as e:
                if e.errno == errno.EINVAL:
                    raise OSError(errno.EINVAL, f"{path} is not a network namespace") from None
                raise
            try:
                return socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, 0)
            finally:
                try:
                    _setns(saved)
                except OSError:
                    os.abort()
        finally:
            os.close(saved)
    finally:
        os.close(target)
