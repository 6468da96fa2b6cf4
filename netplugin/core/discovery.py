"""Finding exec plugins: scan the exec dir, check each candidate, never execute anything.

Every directory in the exec dir becomes a :class:`Candidate` that is either
valid or carries the reasons it is not (no executable, not executable, not a
regular file, invalid name, duplicate name, unsafe permissions anywhere on the
resolved path, an unsafe ``#!`` interpreter); every problem of a
candidate is reported at once, separated by ``"; "``. An unreadable exec dir is
an error, not an empty list. A broken directory does not stop a good plugin
from being selected; ``netplugin plugins`` shows every candidate.

Trust (see :mod:`.trust`): the exec dir, the plugin's directory and the
executable, and every directory a symbolic link on the way leads through, are
owned by root (or netplugin's uid) and not group/world-writable; the exec dir's
ancestors may be sticky (``/tmp``). :func:`open_executable` is what the plugin
layer calls before *every* exec: it walks the path again and hands back a
descriptor of the very file that passed.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Collection

from netplugin.core.errors import DiscoveryError
from netplugin.core.execplugin.trust import TrustedPath, UntrustedPath, mode_problem, walk
from netplugin.core.names import plugin_name_problem, unescape_plugin_name
from netplugin.core.plaindata import dataclass

__all__ = ["Candidate", "Executable", "open_executable", "permission_problem", "scan", "shebang"]

# Linux reads at most this much of a "#!" line (BINPRM_BUF_SIZE).
_SHEBANG_MAX = 256


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
    return mode_problem(path, st, euid)


def shebang(fd: int) -> str | None:
    """The interpreter named by the ``#!`` line of the file open at ``fd`` (``O_PATH`` is fine), or None."""
    try:
        rfd = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None  # unreadable (execute-only): the kernel will tell at exec
    try:
        head = os.pread(rfd, _SHEBANG_MAX, 0)
    except OSError:
        return None
    finally:
        os.close(rfd)
    if not head.startswith(b"#!"):
        return None
    line = head[2:].split(b"\n", 1)[0].strip(b" \t")
    interp = line.split(None, 1)[0] if line else b""
    return os.fsdecode(interp) if interp else None


@dataclass
class Executable:
    """A validated executable, open ``O_PATH``: exec it through ``/proc/self/fd/{fd}``.

    ``path`` is the path as configured (what a script sees as ``$0``), ``real`` where it
    resolved to, ``interpreter`` the ``#!`` interpreter of a script (None for a binary).
    """

    path: str
    handle: TrustedPath
    interpreter: str | None
    #: why the interpreter cannot run (missing, not executable): the call fails, naming it
    interpreter_error: str | None = None

    @property
    def fd(self) -> int:
        return self.handle.fd

    @property
    def identity(self) -> tuple[int, int, int, int, int]:
        st = self.handle.st
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def close(self) -> None:
        self.handle.close()

    def __enter__(self) -> Executable:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _interpreter_problems(interp: str, script: str, check: bool) -> tuple[str | None, str | None]:
    """(why the plugin may not be trusted, why it cannot run) for a script's interpreter.

    An interpreter another user controls makes the plugin invalid; one that is missing or not
    executable makes each call fail (as the exec would), naming the interpreter rather than the
    plugin: the kernel says ENOENT for both.
    """
    where = f"its interpreter {interp} (from the #! line of {script})"
    if not interp.startswith("/"):
        return None, f"{where} is not an absolute path"
    try:
        with walk(interp, check=check) as tp:
            if tp.problems:
                return f"unsafe interpreter {interp} (from the #! line of {script}): " + "; ".join(tp.problems), None
            if not stat.S_ISREG(tp.st.st_mode):
                return None, f"{where} is not a regular file"
            if not os.access(f"/proc/self/fd/{tp.fd}", os.X_OK):
                return None, f"{where} is not executable"
    except UntrustedPath as e:
        if e.problems:
            return f"unsafe interpreter {interp} (from the #! line of {script}): " + "; ".join(e.problems), None
        return None, f"{where} does not exist" if e.path == interp else f"{where}: {e.path} {e.reason}"
    return None, None


def _open_checked(exe: str, tp: TrustedPath, check: bool) -> Executable | str:
    """Check the walked file; the Executable, or every reason it may not be run (``tp`` is closed then)."""
    st = tp.st
    problems: list[str] = []
    if not stat.S_ISREG(st.st_mode):
        problems.append(f"not a regular file: {exe}")
    elif not st.st_mode & 0o111 or not os.access(f"/proc/self/fd/{tp.fd}", os.X_OK):
        problems.append(f"not executable: {exe} (mode {stat.S_IMODE(st.st_mode):04o})")
    interp = shebang(tp.fd) if stat.S_ISREG(st.st_mode) else None
    interp_error = None
    if interp is not None:
        unsafe, interp_error = _interpreter_problems(interp, exe, check)
        if unsafe:
            problems.append(unsafe)
    if check:
        problems[:0] = tp.problems
        if p := mode_problem(exe, st, os.geteuid()):
            problems.append(p if tp.real == exe else f"{p}; {exe} leads to {tp.real}")
    if problems:
        tp.close()
        return "; ".join(problems)
    return Executable(exe, tp, interp, interp_error)


def _walk_problem(exe: str, e: UntrustedPath) -> str:
    if e.path == exe and e.reason == "does not exist":
        return f"no executable: {exe} does not exist"
    return f"cannot open {exe}: {e.path} {e.reason}"


def open_executable(exe: str, *, check_permissions: bool = True, exec_dir: str | None = None) -> Executable | str:
    """Walk ``exe`` again and open it: the :class:`Executable`, or why it may not run.

    ``exec_dir`` (the exec dir ``exe`` lives in) marks where netplugin's own directories
    start; without it the executable's directory is taken for it.
    """
    exe = os.path.abspath(exe)
    base = os.path.abspath(exec_dir) if exec_dir else os.path.dirname(os.path.dirname(exe))
    own_from = max(0, len([c for c in base.split("/") if c]) - 1)
    try:
        tp = walk(exe, own_from=own_from, check=check_permissions, check_last=False, strict_parent=True)
    except UntrustedPath as e:
        return _walk_problem(exe, e)
    return _open_checked(exe, tp, check_permissions)


def _open_exec_dir(exec_dir: str, check: bool) -> TrustedPath:
    parts = [c for c in os.path.abspath(exec_dir).split("/") if c]
    try:
        tp = walk(exec_dir, own_from=max(0, len(parts) - 1), check=check)
    except UntrustedPath as e:
        raise DiscoveryError(exec_dir, f"{e.path} {e.reason}" if e.path != exec_dir else e.reason) from None
    except OSError as e:
        raise DiscoveryError(exec_dir, e.strerror or str(e)) from e
    if not stat.S_ISDIR(tp.st.st_mode):
        tp.close()
        raise DiscoveryError(exec_dir, "Not a directory")
    return tp


def scan(exec_dir: str, *, check_permissions: bool = True, reserved: Collection[str] = ()) -> list[Candidate]:
    """All candidates in ``exec_dir``, sorted by directory name. Raises DiscoveryError if unreadable.

    ``reserved`` are names already taken (the built-in plugins): a directory claiming one is a
    duplicate. (Unescaping maps directory names to plugin names one-to-one, so within the exec dir
    itself no two directories can claim the same name.)
    """
    with _open_exec_dir(exec_dir, check_permissions) as top:
        try:
            rfd = os.open(f"/proc/self/fd/{top.fd}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                with os.scandir(rfd) as it:
                    entries = sorted((e.name for e in it if e.is_dir()), key=str)
            finally:
                os.close(rfd)
        except OSError as e:
            raise DiscoveryError(exec_dir, e.strerror or str(e)) from e
        out: list[Candidate] = []
        for dirname in entries:
            name = unescape_plugin_name(dirname)
            exe = os.path.join(exec_dir, dirname, name.rsplit("/", 1)[-1])
            name_problem = plugin_name_problem(name)
            if name_problem:
                out.append(Candidate(name, exe, f"invalid name {name!r}: {name_problem}"))
                continue
            if name in reserved:
                out.append(Candidate(name, exe, f"duplicate name {name!r} (also a built-in plugin)"))
                continue
            rel = os.path.join(dirname, os.path.basename(exe))
            out.append(Candidate(name, exe, _candidate_problem(top, rel, exe, check_permissions)))
    return out


def _candidate_problem(top: TrustedPath, rel: str, exe: str, check: bool) -> str | None:
    try:
        tp = walk(rel, start=top, check=check, check_last=False, strict_parent=True)
    except UntrustedPath as e:
        return _walk_problem(exe, e)
    found = _open_checked(exe, tp, check)
    if isinstance(found, str):
        return found
    found.close()
    return None
