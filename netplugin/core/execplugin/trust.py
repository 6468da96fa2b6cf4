"""Which paths root may trust: ownership and mode of every directory on a path, walked by fd.

In detail: ``ARCHITECTURE.md``, "Module notes".

netplugin runs as root and executes, reads and writes what it finds, so a path is only as
safe as the least protected directory on it: whoever may write a directory may replace any
entry in it. The rules (stated for users in docs/trust.md):
"""

from __future__ import annotations

import errno
import os
import stat

from netplugin.core.plaindata import dataclass, field

__all__ = ["TrustedPath", "UntrustedPath", "mode_problem", "split_path", "walk"]

_MAX_LINKS = 40
_O_PATH = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


class UntrustedPath(Exception):
    """The walk could not reach the end of the path (missing, not a directory, a loop)."""

    def __init__(self, path: str, reason: str, err: int = 0) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason
        self.errno = err
        #: the trust problems found on the way, before the walk stopped
        self.problems: list[str] = []


def mode_problem(path: str, st: os.stat_result, euid: int, *, sticky_ok: bool = False) -> str | None:
    """Why ``path`` (with status ``st``) is not safe to trust, or None."""
    if st.st_uid not in (0, euid):
        return f"unsafe permissions: {path} is owned by uid {st.st_uid} (must be root or uid {euid})"
    writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if not writable or (sticky_ok and stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX):
        return None
    who = (
        "group- and world-"
        if writable == stat.S_IWGRP | stat.S_IWOTH
        else ("group-" if writable & stat.S_IWGRP else "world-")
    )
    return f"unsafe permissions: {path} is {who}writable (mode {stat.S_IMODE(st.st_mode):04o})"


@dataclass
class TrustedPath:
    """The result of a walk: an ``O_PATH`` descriptor of the final component and what was found.

    ``problems`` lists every untrusted component (empty: the path is trusted). The caller owns
    ``fd`` and closes it (the object is a context manager).
    """

    fd: int
    real: str
    st: os.stat_result
    problems: list[str] = field(default_factory=list)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> TrustedPath:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def split_path(path: str) -> list[str]:
    """A path's components, without the empty and ``.`` ones."""
    return [c for c in path.split("/") if c and c != "."]


class _Walk:
    """The state of one :func:`walk`: the open directory, the components still to go."""

    def __init__(self, path: str, euid: int, start: TrustedPath | None) -> None:
        self.euid = euid
        self.pending = split_path(path)
        self.problems: list[str] = list(start.problems) if start is not None else []
        self.links = 0
        if start is not None:
            self.fd = os.dup(start.fd)  # dup'd descriptors are not close-on-exec: make it so
            os.set_inheritable(self.fd, False)
            self.cur, self.st = start.real, start.st
        else:
            self._to_root()

    def _to_root(self) -> None:
        self.fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        self.cur, self.st = "/", os.fstat(self.fd)

    def _move(self, fd: int, cur: str, st: os.stat_result) -> None:
        os.close(self.fd)
        self.fd, self.cur, self.st = fd, cur, st

    def step(self, name: str, *, nolink: bool, check: bool) -> bool:
        """Go into ``name``; False when it was a symbolic link (expanded into ``pending``)."""
        if name == "..":
            fd = os.open("..", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=self.fd)
            self._move(fd, os.path.dirname(self.cur) or "/", os.fstat(fd))
            return False
        if not stat.S_ISDIR(self.st.st_mode):
            raise UntrustedPath(self.cur, "not a directory", errno.ENOTDIR)
        here = os.path.join(self.cur, name)
        try:
            fd = os.open(name, _O_PATH, dir_fd=self.fd)
        except FileNotFoundError:
            raise UntrustedPath(here, "does not exist", errno.ENOENT) from None
        except OSError as e:
            raise UntrustedPath(here, e.strerror or str(e), e.errno or 0) from None
        st = os.fstat(fd)
        if not stat.S_ISLNK(st.st_mode):
            self._move(fd, here, st)
            return True
        try:
            target = os.readlink(name, dir_fd=self.fd)
        finally:
            os.close(fd)
        if nolink:
            raise UntrustedPath(here, f"is a symbolic link (to {target}), not a directory", errno.ELOOP)
        self.links += 1
        if self.links > _MAX_LINKS:
            raise UntrustedPath(here, "too many levels of symbolic links", errno.ELOOP)
        if check and st.st_uid not in (0, self.euid):
            self.problems.append(
                f"unsafe permissions: {here} is a symbolic link owned by uid {st.st_uid} "
                f"(must be root or uid {self.euid})"
            )
        self.pending[:0] = split_path(target)
        if target.startswith("/"):
            os.close(self.fd)
            self._to_root()
        return False


def walk(
    path: str,
    *,
    euid: int | None = None,
    own_from: int = 0,
    check: bool = True,
    no_symlink_from: int | None = None,
    start: TrustedPath | None = None,
    check_last: bool = True,
    strict_parent: bool = False,
) -> TrustedPath:
    """Open ``path`` component by component (``O_PATH|O_NOFOLLOW``), checking each one.

    ``own_from`` counts the components of ``path`` (as written) that are *above* netplugin's
    own directories: from that component on the sticky exception no longer applies.
    ``no_symlink_from`` (a component index) refuses symbolic links from there on. ``start``
    continues from a trusted directory (``path`` is then relative to it). ``check=False`` only
    resolves (no ownership or mode checks), for ``check_permissions: false``;
    ``check_last=False`` leaves the final component's own check to the caller (who can name
    it as the user wrote it); ``strict_parent`` denies the sticky exception to the directory
    holding the final component.

    Where a symbolic link leads, the directories on the way are judged like ancestors: a
    sticky one is accepted, since the entry after it must be owned by root or our uid.

    Raises :class:`UntrustedPath` when the path cannot be walked; problems of ownership or mode
    do not stop the walk (every one is reported), they are collected in ``problems``.
    """
    euid = os.geteuid() if euid is None else euid
    if start is None and not path.startswith("/"):
        path = os.path.abspath(path)
    w = _Walk(path, euid, start)
    # Counted from the end of ``pending``: how many of the components still to go are our own
    # (or may not be links); a link's expansion goes in front and so counts as an ancestor.
    own_left = max(0, len(w.pending) - own_from)
    nolink_left = -1 if no_symlink_from is None else max(0, len(w.pending) - no_symlink_from)
    if start is None and check and (p := mode_problem("/", w.st, euid, sticky_ok=bool(w.pending))):
        w.problems.append(p)
    try:
        while w.pending:
            name = w.pending.pop(0)
            left = len(w.pending)
            if not w.step(name, nolink=left < nolink_left, check=check) or not check:
                continue
            if left or check_last:
                # only an ancestor of our own dirs (and, with strict_parent, not the final one's dir)
                sticky_ok = left >= own_left and left > 0 and not (strict_parent and left == 1)
                if p := mode_problem(w.cur, w.st, euid, sticky_ok=sticky_ok):
                    w.problems.append(p)
    except UntrustedPath as e:
        os.close(w.fd)
        e.problems = w.problems
        raise
    except BaseException:
        os.close(w.fd)
        raise
    return TrustedPath(w.fd, w.cur, w.st, w.problems)
