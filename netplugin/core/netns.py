"""Entering a network namespace: per thread, without forking and without moving other threads.

``setns(2)`` moves only the calling thread. :func:`entered` switches this thread in and back;
:func:`run_in_netns` runs a function on a throwaway thread inside the namespace (a socket made
there stays in that namespace for its whole life, usable from any thread); :func:`netns_socket`
is the netlink socket the native bridge and the benchmarks talk to a pod's kernel through.
Failing to switch back is fatal (``os.abort``): a thread silently left in a pod's netns would
corrupt everything it did afterwards.

A netns path comes from whoever calls netplugin (a runtime's ``CNI_NETNS``, a CLI's template), so
it is never trusted to be a namespace: :func:`open_netns` opens without blocking (a FIFO would
block ``open(2)`` for ever) and checks the file is on ``nsfs`` before anything ``setns``-es into it;
:func:`own_netns` says whether a path is this process's or init's own network namespace (a bind
mount of it included: identity is nsfs's device and inode, not the path); :func:`netns_problem`
is why a path must not be a pod's netns.
"""

from __future__ import annotations

# Imports inside this module's functions are kept for the per-call import set
# (tests/frontends/fastpath.py): each keeps a module off the calls that do not need it
# (BENCHMARKS.md rows B-i and B: the CLI's cold start and per-pod run without a daemon).
import errno
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import socket

__all__ = [
    "CLONE_NEWNET",
    "NSFS_MAGIC",
    "entered",
    "in_netns",
    "libc_handle",
    "netns_gone",
    "netns_identity",
    "netns_problem",
    "netns_socket",
    "open_netns",
    "own_netns",
    "run_in_netns",
    "setns",
]

CLONE_NEWNET = 0x40000000

T = TypeVar("T")

_libc: Any = None

#: statfs(2) f_type of the filesystem holding namespace files (linux/magic.h)
NSFS_MAGIC = 0x6E736673

#: where this process's and the node's (init's) network namespaces are
_OWN = ("/proc/thread-self/ns/net", "/proc/self/ns/net", "/proc/1/ns/net")


def in_netns(argv: list[str], netns: str | None) -> list[str]:
    """The argv that runs ``argv`` in the network namespace at path ``netns`` (``nsenter``; a command
    that must change a namespace's firewall or routes runs there, the caller's threads stay put);
    ``argv`` itself when ``netns`` is None or empty."""
    return ["nsenter", f"--net={netns}", *argv] if netns else argv


def libc_handle() -> Any:
    """The C library (ctypes, errno kept): for the calls the os module lacks."""
    global _libc
    import ctypes  # here: ctypes is costly to import, and only pod actions need it

    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def setns(fd: int) -> None:
    """Move the calling thread into the network namespace open at ``fd``; OSError on failure."""
    if hasattr(os, "setns"):  # Python 3.12+
        os.setns(fd, CLONE_NEWNET)
        return
    import ctypes

    if libc_handle().setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _fs_type(fd: int) -> int:
    """statfs(2)'s f_type of the filesystem holding ``fd`` (the first field, a C long)."""
    import ctypes

    buf = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes on 64-bit Linux
    if libc_handle().fstatfs(fd, buf) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(ctypes.c_long.from_buffer(buf).value) & 0xFFFFFFFF


def netns_identity(path: str) -> tuple[int, int]:
    """(st_dev, st_ino) of the namespace file at ``path``, by ``stat`` (which never blocks).

    OSError EINVAL when it is not on nsfs (every namespace file shares nsfs's one device);
    FileNotFoundError and friends as ``stat`` raises them.
    """
    st = os.stat(path)
    ref = os.stat("/proc/self/ns/net")
    if st.st_dev != ref.st_dev:
        raise OSError(errno.EINVAL, f"{path} is not a network namespace (not an nsfs file)")
    return st.st_dev, st.st_ino


def netns_gone(path: str) -> bool:
    """Whether no network namespace is at ``path`` any more, as :func:`open_netns` would find it.

    Gone: nothing there, a dangling symlink or a loop, or a file that is not on nsfs (the plain
    file an unmounted namespace leaves behind, or anything else that is no namespace). A path that
    cannot be examined for another reason (a permission) is not said to be gone.
    """
    try:
        netns_identity(path)
    except (FileNotFoundError, NotADirectoryError):
        return True
    except OSError as e:
        return e.errno in (errno.EINVAL, errno.ELOOP)
    return False


def own_netns(path: str) -> str | None:
    """Which of this process's or the node's own netns files ``path`` is the same namespace as, or None.

    Raises as :func:`netns_identity` for a path that is no namespace at all.
    """
    ident = netns_identity(path)
    for own in _OWN:
        try:
            st = os.stat(own)
        except OSError:
            continue  # /proc/1 hidden (hidepid): the others still count
        if (st.st_dev, st.st_ino) == ident:
            return own
    return None


def netns_problem(path: str) -> str | None:
    """Why ``path`` must not be a pod's network namespace, or None (a missing path is the plugin's to report).

    Refused: the caller's or the node's own namespace (a pod's default route there would replace
    the node's), a FIFO, socket or device node (opening one can block or act), and a path that
    cannot be examined. Only ``stat`` is used: nothing is opened.
    """
    import stat

    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        return f"cannot be examined: {e.strerror or e}"
    if stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode) or stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
        return "is a FIFO, socket or device node, not a network namespace"
    try:
        own = own_netns(path)
    except OSError:
        return None  # a regular file or directory: the plugin says it is no namespace
    if own is not None:
        return (
            f"is the node's own network namespace (the same as {own}); a pod needs a namespace of "
            "its own, or its interface, address and default route would replace the node's"
        )
    return None


def open_netns(path: str) -> int:
    """A descriptor of the network namespace at ``path`` for ``setns``, opened without blocking.

    ``O_NONBLOCK``: a FIFO there must not block the open (nor a tty become ours, ``O_NOCTTY``);
    ``O_PATH`` cannot be used, ``setns`` refuses such descriptors. The path is checked with
    ``stat`` first (no open of a device node), the descriptor again with ``fstatfs`` (NSFS_MAGIC),
    which a swap between the two cannot fool. FileNotFoundError if there is none; OSError EINVAL
    naming the path when it is no namespace.
    """
    netns_identity(path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        if _fs_type(fd) != NSFS_MAGIC:
            raise OSError(errno.EINVAL, f"{path} is not a network namespace (not an nsfs file)")
    except BaseException:
        os.close(fd)
        raise
    return fd


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
