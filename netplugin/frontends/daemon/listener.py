"""The daemon's unix socket: bound atomically with mode 0600, one daemon per socket.

The socket is created under a 0177 umask beside its final path and renamed over it, so a stale
socket left by a killed daemon is replaced atomically, and only after it proved dead.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat

from netplugin.core.dirs import ensure_dir
from netplugin.core.errors import SystemFailure
from netplugin.store.locks import hold, release

log = logging.getLogger(__name__)

__all__ = ["BACKLOG", "bind_socket", "lock_daemon", "socket_answers", "unlink_if", "unlock_daemon"]

#: connections the kernel holds for the daemon before it accepts them: a node's pods started at once
#: (maxPods, 110 by default) each connect together, and a unix socket whose backlog is full refuses
#: a connection outright (EAGAIN: the compiled shim waits and retries, other callers fail over to
#: working alone); asyncio's own default is 100, too few
BACKLOG = 1024

log = logging.getLogger("netplugin.daemon")


def socket_answers(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as s:
        s.settimeout(1.0)
        try:
            s.connect(path)
        except OSError:
            return False
    return True


def bind_socket(path: str) -> socket.socket:
    """A listening unix socket at ``path``, mode 0600 from birth; replaces a *stale* socket only.

    The caller must hold the daemon lock, so no other daemon binds between the check and the rename.
    """
    directory = os.path.dirname(path) or "."
    ensure_dir(directory, base=directory)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise SystemFailure("cannot check socket", path, e.strerror or str(e)) from e
    if st is not None:
        if not stat.S_ISSOCK(st.st_mode):
            raise SystemFailure("refusing to replace", path, "it exists and is not a socket")
        if socket_answers(path):
            raise SystemFailure("cannot serve on", path, "another process answers on it")
        log.info("replacing stale socket %s", path)
    # Bound under a short temporary name in the same directory, then renamed into place: the path
    # always names either the old (dead) socket or the new, listening one.
    tmp = os.path.join(os.path.dirname(path) or ".", f".{os.getpid()}.sock")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    old_umask = os.umask(0o177)
    try:
        sock.bind(tmp)
        sock.listen(BACKLOG)
        os.rename(tmp, path)
    except (OSError, ValueError) as e:
        sock.close()
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise SystemFailure("cannot create socket", path, reason) from e
    finally:
        os.umask(old_umask)
    return sock


def lock_daemon(path: str) -> int:
    """Hold ``path`` flock'd for the daemon's life: one daemon per socket.

    Taken like every netplugin lock (:func:`netplugin.store.locks.hold`): in a trusted
    directory, ``O_NOFOLLOW``, re-checked after locking; :func:`unlock_daemon` removes it.
    """
    directory = os.path.dirname(path) or "."
    fd = hold(path, blocking=False, base=directory)
    if fd is None:
        raise SystemFailure("cannot serve:", path, "another netplugin daemon holds this lock")
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def unlock_daemon(fd: int, path: str) -> None:
    """Let go of the daemon lock and remove its file (unless a successor already waits on it)."""
    release(fd, path)


def unlink_if(path: str, inode: int) -> None:
    """Remove ``path`` if it is still our socket (not one a successor bound)."""
    try:
        if os.lstat(path).st_ino == inode:
            os.unlink(path)
    except OSError:
        pass
