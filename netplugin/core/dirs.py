"""netplugin's own directories (state, run, locks, IPAM): created with exact modes, trusted or refused.

The rules for what root may trust are :mod:`netplugin.core.execplugin.trust`'s; this applies them
to the directories netplugin writes, with no sticky exception from the configured directory down.
"""

from __future__ import annotations

import errno
import os
import stat
import threading

from netplugin.core.errors import SystemFailure
from netplugin.core.execplugin.trust import UntrustedPath, split_path, walk

__all__ = ["UnsafeDirectory", "ensure_dir"]


class UnsafeDirectory(SystemFailure):
    """One of netplugin's own directories (or a directory above it) may not be trusted."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__("refusing directory", path, reason)


_checked: dict[str, tuple[int, int]] = {}
_checked_lock = threading.Lock()


def _ncomp(path: str) -> int:
    return len(split_path(path))


def ensure_dir(path: str, *, base: str | None = None, mode: int = 0o755, create: bool = True) -> str | None:
    """Make sure ``path`` is a trusted directory of netplugin's own, creating what is missing.

    ``base`` is the configured directory ``path`` lies in (the state or run dir; default:
    ``path`` itself). Everything from ``base`` down is netplugin's own: each such directory
    must be a real directory (never a symbolic link below ``base``) owned by root or
    netplugin's uid and not group/world-writable; above ``base`` the ancestor rules apply
    (a sticky ``/tmp`` is fine). Missing directories are created with exactly ``mode``
    (whatever the umask). Nothing is repaired: an unsafe directory raises
    :class:`UnsafeDirectory` naming every problem, and the operator fixes it
    (``chown root: DIR; chmod go-w DIR``). A directory found good is remembered by inode.
    ``create=False`` only checks, and returns None when something is missing.
    """
    path = os.path.abspath(path)
    base = os.path.abspath(base) if base else path
    if path != base and not path.startswith(base.rstrip("/") + "/"):
        raise ValueError(f"{path} is not under {base}")
    with _checked_lock:
        known = _checked.get(path)
    if known is not None:
        try:
            st = os.lstat(path)
            if (st.st_dev, st.st_ino) == known and stat.S_ISDIR(st.st_mode):
                return path
        except OSError:
            pass
    own_from = max(0, _ncomp(base) - 1)
    for _ in range(_ncomp(path) + 2):
        try:
            with walk(path, own_from=own_from, no_symlink_from=_ncomp(base)) as tp:
                if tp.problems:
                    raise UnsafeDirectory(path, "; ".join(tp.problems))
                if not stat.S_ISDIR(tp.st.st_mode):
                    raise UnsafeDirectory(path, "not a directory")
                with _checked_lock:
                    _checked[path] = (tp.st.st_dev, tp.st.st_ino)
                return path
        except UntrustedPath as e:
            if e.problems:
                raise UnsafeDirectory(path, "; ".join(e.problems)) from None
            if e.errno != errno.ENOENT:
                raise UnsafeDirectory(path, f"{e.path} {e.reason}") from None
            if not create:
                return None
            _mkdir(e.path, mode if _ncomp(e.path) >= _ncomp(base) else 0o755)
    raise UnsafeDirectory(path, "keeps changing while being created")


def _mkdir(path: str, mode: int) -> None:
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        return  # made by someone else meanwhile: the next walk judges it
    except OSError as e:
        raise UnsafeDirectory(path, f"cannot create: {e.strerror or e}") from None
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchmod(fd, mode)  # the umask does not decide a directory root trusts
    finally:
        os.close(fd)
