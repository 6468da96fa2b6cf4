"""File locks shared by every netplugin process on the node (CLI, daemon, CNI shim).

In detail: ``ARCHITECTURE.md``, "Module notes".

``flock`` locks belong to an open file description, so two opens of the same
file conflict even inside one process: the same helper serialises threads of
the daemon and separate CLI processes alike. Locks die with their holder, so a
killed netplugin never leaves a pod locked.
"""

from __future__ import annotations

# Imports inside this module's functions are kept for the per-call import set
# (tests/frontends/fastpath.py): each keeps a module off the calls that do not need it
# (BENCHMARKS.md rows B-i and B: the CLI's cold start and per-pod run without a daemon).
import errno
import fcntl
import os
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from netplugin.core.dirs import ensure_dir
from netplugin.core.errors import SystemFailure
from netplugin.core.names import PodRef
from netplugin.core.spares import NoSpare, Spares, discard, spares_for

__all__ = ["PodLock", "flocked", "hold", "pod_lock_path", "pod_locked", "release", "stock_pod_locks"]


def _open(path: str, base: str | None, spares: Spares | None) -> int:
    # The directory is checked every time (cached by inode after the first): an existing but
    # symlinked or foreign locks/ must be refused, not only a missing one created safely.
    ensure_dir(os.path.dirname(path) or ".", base=base)
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        if spares is not None:
            try:
                return os.open(path, flags)
            except FileNotFoundError:
                pass
            try:
                spares.create(path, b"", mode=0o600)  # False: made meanwhile, opened below
            except NoSpare:
                pass
        return os.open(path, flags | os.O_CREAT, 0o600)
    except OSError as e:
        raise SystemFailure("cannot open lock file", path, _why(e)) from e


def _why(e: OSError) -> str:
    if e.errno == errno.ELOOP:
        return "is a symbolic link (refused)"
    return e.strerror or str(e)


def hold(
    path: str, *, shared: bool = False, blocking: bool = True, base: str | None = None, spares: Spares | None = None
) -> int | None:
    """Take the lock on ``path``; its descriptor, or None if ``blocking`` is False and it is taken.

    ``spares``: the lock directory's spare inodes (:mod:`netplugin.core.spares`), to make the file
    from when it is missing (pod locks: a node's steady churn of pods then makes no file).

    ``base`` is the configured directory the lock file lives under (see :func:`ensure_dir`).
    """
    op = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if blocking else fcntl.LOCK_NB)
    while True:
        fd = _open(path, base, spares)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                raise SystemFailure("refusing lock file", path, f"not a regular file of uid {os.geteuid()}")
            try:
                fcntl.flock(fd, op)
            except BlockingIOError:
                os.close(fd)
                return None
            except OSError as e:
                raise SystemFailure("cannot lock", path, e.strerror or str(e)) from e
            try:
                now = os.lstat(path)
            except FileNotFoundError:
                os.close(fd)  # removed by its last holder while we waited: take the new one
                continue
            if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
                return fd
            os.close(fd)
        except BaseException:
            try:
                os.close(fd)
            except OSError:
                pass
            raise


def release(fd: int, path: str, *, keep: bool = False, spares: Spares | None = None) -> None:
    """Let go of a lock taken with :func:`hold`, removing the file if nobody else holds it (and not
    ``keep``); into ``spares`` when given."""
    try:
        if keep:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return  # somebody shares it (or waits on a shared one): the last one removes it
        try:
            st, now = os.fstat(fd), os.lstat(path)
            if (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino):
                discard(path, spares)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise SystemFailure("cannot remove lock file", path, e.strerror or str(e)) from e
    finally:
        os.close(fd)


@contextmanager
def flocked(
    path: str,
    *,
    shared: bool = False,
    base: str | None = None,
    keep: bool | Callable[[], bool] = False,
    spares: Spares | None = None,
) -> Iterator[int]:
    """Hold an exclusive (or shared) flock on ``path`` (created if needed) for the block.

    ``keep`` (or ``keep()``, asked when the block is left) leaves the file for the next holder;
    ``spares`` as for :func:`hold` and :func:`release`.
    """
    fd = hold(path, shared=shared, base=base, spares=spares)
    assert fd is not None
    try:
        yield fd
    finally:
        release(fd, path, keep=keep() if callable(keep) else keep, spares=spares)


def stock_pod_locks(run_dir: str) -> int:
    """Make spare inodes for pod lock files ahead of need (:meth:`netplugin.core.spares.Spares.fill`)."""
    locks = os.path.join(run_dir, "locks")
    ensure_dir(locks, base=run_dir)
    return spares_for(locks, run_dir).fill()


def pod_lock_path(run_dir: str, pod: PodRef) -> str:
    """The file whose flock serialises every action on one pod (all infra ids of the pod name)."""
    key = pod.key
    if len(key) > 200:
        # namespace (63) + name (253) can exceed a file name's 255 bytes; '~' never occurs in a key
        import hashlib

        key = f"{key[:160]}~{hashlib.sha256(key.encode()).hexdigest()[:24]}"
    return os.path.join(run_dir, "locks", key + ".lock")


class PodLock:
    """A held pod lock; ``live`` says whether its file outlives the action (see :func:`pod_locked`)."""

    __slots__ = ("live",)

    def __init__(self, live: bool) -> None:
        self.live = live


@contextmanager
def pod_locked(run_dir: str, pod: PodRef, *, live: bool = False) -> Iterator[PodLock]:
    """Hold the lock serialising every action on ``pod``.

    ``live`` (or ``.live`` set on what this yields): the pod goes on living if the block completes
    (its setup; the status of a recorded pod), so its lock file stays for the pod's next action
    instead of being created again; a teardown, and any block that raises, removes it.
    """
    hold = PodLock(live)
    done = False

    def keep() -> bool:
        return hold.live and done

    spares = spares_for(os.path.join(run_dir, "locks"), run_dir)
    with flocked(pod_lock_path(run_dir, pod), base=run_dir, keep=keep, spares=spares):
        yield hold
        done = True
