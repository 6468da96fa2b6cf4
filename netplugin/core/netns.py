"""Entering a network namespace: per thread, without forking and without moving other threads.

``setns(2)`` moves only the calling thread. :func:`entered` switches this thread in and back;
:func:`run_in_netns` runs a function on a throwaway thread inside the namespace (a socket made
there stays in that namespace for its whole life, usable from any thread); :func:`netns_socket`
is the netlink socket the native bridge and the benchmarks talk to a pod's kernel through.
Failing to switch back is fatal (``os.abort``): a thread silently left in a pod's netns would
corrupt everything it did afterwards.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import socket

__all__ = ["CLONE_NEWNET", "entered", "netns_socket", "open_netns", "run_in_netns", "setns"]

CLONE_NEWNET = 0x40000000

T = TypeVar("T")

_libc: Any = None


def setns(fd: int) -> None:
    """Move the calling thread into the network namespace open at ``fd``; OSError on failure."""
    if hasattr(os, "setns"):  # Python 3.12+
        os.setns(fd, CLONE_NEWNET)
        return
    global _libc
    import ctypes  # here: ctypes costs ~5 ms to import, and only pod actions need it

    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def open_netns(path: str) -> int:
    """A descriptor of the namespace file at ``path`` (FileNotFoundError if there is none)."""
    return os.open(path, os.O_RDONLY | os.O_CLOEXEC)


@contextmanager
def entered(path: str) -> Iterator[None]:
    """The calling thread inside the network namespace at ``path``, back in its own afterwards.

    OSError(EINVAL) "PATH is not a network namespace" when the file is something else.
    """
    target = open_netns(path)
    try:
        saved = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            try:
                setns(target)
            except OSError as e:
                if e.errno == errno.EINVAL:
                    raise OSError(errno.EINVAL, f"{path} is not a network namespace") from None
                raise
            try:
                yield
            finally:
                try:
                    setns(saved)
                except OSError:
                    os.abort()
        finally:
            os.close(saved)
    finally:
        os.close(target)


def netns_socket(path: str) -> socket.socket:
    """A NETLINK_ROUTE socket inside the network namespace at ``path`` (FileNotFoundError if none).

    Only the calling thread changes namespace, only around ``socket()``.
    """
    import socket

    with entered(path):
        return socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, 0)


def run_in_netns(path: str, fn: Callable[[], T], *, timeout: float | None = None) -> T:
    """``fn()`` on a throwaway thread inside the network namespace at ``path``; its result or exception.

    The thread ends in the namespace it entered (never switching back can fail). TimeoutError when
    it has not finished after ``timeout`` seconds (it is a daemon thread: it cannot hold up exit).
    """
    import threading

    result: list[Any] = []

    def work() -> None:
        try:
            fd = open_netns(path)
            try:
                setns(fd)
            finally:
                os.close(fd)
            result.append((True, fn()))
        except BaseException as e:  # handed to the caller's thread
            result.append((False, e))

    worker = threading.Thread(target=work, name=f"setns {path}", daemon=True)
    worker.start()
    worker.join(timeout)
    if not result:
        raise TimeoutError(f"no answer from inside netns {path} after {timeout:g}s")
    ok, value = result[0]
    if not ok:
        raise value
    out: T = value
    return out
