"""Finding exec plugins: scan the exec dir, check each candidate, never execute anything.

Every directory in the exec dir becomes a :class:`Candidate` that is either
valid or carries the reason it is not (no executable, not executable, not a
regular file, invalid name, duplicate name, unsafe permissions). An unreadable
exec dir is an error, not an empty list. A broken directory does not stop a
good plugin from being selected; ``netplugin plugins`` shows every candidate.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Collection
from dataclasses import dataclass

from netplugin.core.errors import DiscoveryError
from netplugin.core.names import plugin_name_problem, unescape_plugin_name

__all__ = ["Candidate", "permission_problem", "scan"]


@dataclass(frozen=True, slots=True)
class Candidate:
    name: str
    path: str
    problem: str | None = None
    builtin: bool = False

    @property
    def valid(self) -> bool:
        return self.problem is None

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "path": self.path,
            "valid": self.valid,
            "problem": self.problem,
            "builtin": self.builtin,
        }


def permission_problem(path: str, st: os.stat_result, euid: int) -> str | None:
    """Why a file or directory on the exec path is not safe to trust, or None."""
    if st.st_uid not in (0, euid):
        return f"unsafe permissions: {path} is owned by uid {st.st_uid} (must be root or uid {euid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = (
            "group- and world-"
            if st.st_mode & stat.S_IWGRP and st.st_mode & stat.S_IWOTH
            else ("group-" if st.st_mode & stat.S_IWGRP else "world-")
        )
        return f"unsafe permissions: {path} is {who}writable (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _check(dirpath: str, exe: str, check_permissions: bool, dir_problem: str | None) -> str | None:
    try:
        dst = os.stat(dirpath)
    except OSError as e:
        return f"cannot stat {dirpath}: {e.strerror or e}"
    try:
        st = os.stat(exe)
    except FileNotFoundError:
        return f"no executable: {exe} does not exist"
    except OSError as e:
        return f"cannot stat {exe}: {e.strerror or e}"
    if not stat.S_ISREG(st.st_mode):
        return f"not a regular file: {exe}"
    if not os.access(exe, os.X_OK) or not st.st_mode & 0o111:
        return f"not executable: {exe} (mode {stat.S_IMODE(st.st_mode):04o})"
    if check_permissions:
        euid = os.geteuid()
        return dir_problem or permission_problem(dirpath, dst, euid) or permission_problem(exe, st, euid)
    return None


def scan(exec_dir: str, *, check_permissions: bool = True, reserved: Collection[str] = ()) -> list[Candidate]:
    """All candidates in ``exec_dir``, sorted by directory name. Raises DiscoveryError if unreadable.

    ``reserved`` are names already taken (the built-in plugins): a directory claiming one is a
    duplicate. (Unescaping maps directory names to plugin names one-to-one, so within the exec dir
    itself no two directories can claim the same name.)
    """
    try:
        with os.scandir(exec_dir) as it:
            entries = sorted((e for e in it if e.is_dir()), key=lambda e: e.name)
        dir_st = os.stat(exec_dir)
    except OSError as e:
        raise DiscoveryError(exec_dir, e.strerror or str(e)) from e
    dir_problem = permission_problem(exec_dir, dir_st, os.geteuid()) if check_permissions else None

    out: list[Candidate] = []
    for entry in entries:
        name = unescape_plugin_name(entry.name)
        exe = os.path.join(entry.path, name.rsplit("/", 1)[-1])
        name_problem = plugin_name_problem(name)
        if name_problem:
            out.append(Candidate(name, exe, f"invalid name {name!r}: {name_problem}"))
            continue
        if name in reserved:
            out.append(Candidate(name, exe, f"duplicate name {name!r} (also a built-in plugin)"))
            continue
        out.append(Candidate(name, exe, _check(entry.path, exe, check_permissions, dir_problem)))
    return out
