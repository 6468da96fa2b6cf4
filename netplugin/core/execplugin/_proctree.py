"""Killing a plugin's process tree: its session and group, descendants that left them, stragglers.

Private to :mod:`netplugin.core.execplugin.invoke`, the only module that starts processes.

Finding a session's members. A process that is not a subreaper has to walk all of ``/proc``
(getsid on every process of the node, and a
node with a hundred pods and their sidecars has thousands). A long-running caller (the daemon)
instead calls :func:`adopt_orphans` once: as a subreaper (``PR_SET_CHILD_SUBREAPER``) it
becomes the parent of every process whose parent dies below it, and Linux hands such an orphan
to the first live thread of the process, the main thread. A member of a call's session is then
either a descendant of the call's leader (while it lives) or below an orphan adopted by the main
thread, so the search reads a few ``children`` files instead of the node's process table. Only a
process in the session is searched further: a child never joins its parent's old session once
that parent called ``setsid``. The adopted processes that are not the caller's own children in
its own session (stragglers it killed, daemons a plugin detached, once they exit) are reaped by
:func:`reap_adopted`, which leaves alone the leaders that :func:`spawning` registered.
"""

from __future__ import annotations

# Imports inside this module's functions are kept for the per-call import set
# (tests/frontends/fastpath.py): each keeps a module off the calls that do not need it
# (BENCHMARKS.md rows B-i and B: the CLI's cold start and per-pod run without a daemon).
import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Protocol

from netplugin.core.procs import proc_stat

__all__ = [
    "adopt_orphans",
    "kill_on_timeout",
    "kill_stragglers",
    "reap_adopted",
    "signal_group",
    "spawned",
    "spawning",
    "wait_readable",
]

_PR_SET_CHILD_SUBREAPER = 36


class _Adoption:
    """This process's subreaper state: the main thread's ``children`` file and the live leaders."""

    def __init__(self) -> None:
        self.children: str | None = None  # set while adopting
        self.sid = 0
        self.lock = threading.Lock()  # a leader is registered before a reap can see it as an orphan
        self.leaders: set[int] = set()


_ADOPTION = _Adoption()


def adopt_orphans(enable: bool = True) -> bool:
    """Make this process the subreaper of its descendants (see the module docstring); True if it is.

    False, and nothing changes, where the kernel has no ``children`` files (CONFIG_PROC_CHILDREN)
    or refuses: the search then walks ``/proc`` as before. ``enable=False`` ends it.
    """
    import ctypes

    children = f"/proc/{os.getpid()}/task/{os.getpid()}/children"
    if enable and not os.path.exists(children):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, int(enable), 0, 0, 0) != 0:
        return False
    _ADOPTION.sid = os.getsid(0)
    _ADOPTION.children = children if enable else None
    return enable


@contextlib.contextmanager
def spawning() -> Iterator[set[int]]:
    """Around a spawn: add the new leader's pid to the set it yields (remove it with :func:`spawned`)."""
    if _ADOPTION.children is None:
        yield set()
        return
    with _ADOPTION.lock:
        yield _ADOPTION.leaders


def spawned(pid: int) -> None:
    """The leader ``pid`` was waited for: a later reap may take its number's next owner."""
    _ADOPTION.leaders.discard(pid)


def _read_children(path: str) -> list[int]:
    try:
        with open(path, "rb") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []  # the process or thread is gone


def _children_of(pid: int) -> list[int]:
    """Every child of every thread of ``pid``."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    return [c for t in tids for c in _read_children(f"/proc/{pid}/task/{t}/children")]


def reap_adopted(*, wait: bool = True) -> int:
    """Reap the adopted orphans that have exited (not our own children of our own session, nor a
    leader still to be waited for); returns how many. Does nothing unless adopting, nor, with
    ``wait=False`` (the event loop's SIGCHLD handler), while a spawn holds the registry."""
    path = _ADOPTION.children
    if path is None or not _ADOPTION.lock.acquire(blocking=wait):
        return 0
    reaped = 0
    try:
        for pid in _read_children(path):
            fields = proc_stat(pid)  # state, ppid, pgrp, session, ...
            if not fields or fields[0] != b"Z" or int(fields[3]) == _ADOPTION.sid or pid in _ADOPTION.leaders:
                continue
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
                reaped += 1
    finally:
        _ADOPTION.lock.release()
    return reaped


class _Waitable(Protocol):
    pid: int

    def wait(self) -> int: ...


def signal_group(pgid: int, sig: int) -> bool:
    """Signal a process group; False when it no longer exists."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        # Some member changed credentials (setuid); it is still there.
        return True
    return True


def _is_zombie(pid: int) -> bool:
    """True for a zombie (dead, only waiting for its parent) or a process already gone."""
    fields = proc_stat(pid)
    return not fields or fields[0] in (b"Z", b"X")


def live_session_members(sid: int) -> list[tuple[int, int]]:
    """(pid, pgid) of every process of session ``sid`` that is not a zombie.

    A session holds every process of a call that did not call ``setsid``, whatever group it moved
    to. Searched below this process when it adopts orphans, else in all of ``/proc`` (see the
    module docstring); only the members' stat files are read.
    """
    if _ADOPTION.children is not None:
        return _members_below(sid, _ADOPTION.children)
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            if os.getsid(pid) != sid:
                continue
            pgid = os.getpgid(pid)
        except OSError:
            continue
        if not _is_zombie(pid):
            members.append((pid, pgid))
    return members


def _members_below(sid: int, adopted: str) -> list[tuple[int, int]]:
    """live_session_members for a subreaper: the orphans it adopted, the leader, and below them."""
    todo = [sid, *_read_children(adopted)]
    seen: set[int] = set()
    members = []
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            if os.getsid(pid) != sid:
                continue  # not of this call, and none of its descendants can be
            pgid = os.getpgid(pid)
        except OSError:
            continue
        if not _is_zombie(pid):
            members.append((pid, pgid))
        todo += _children_of(pid)
    return members


def _signal_members(members: Sequence[tuple[int, int]], sig: int) -> None:
    """Signal each member and its process group (a group never spans two sessions)."""
    for pgid in {g for _, g in members}:
        signal_group(pgid, sig)
    _kill_pids([p for p, _ in members], sig)


def _descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (including ones that left the process group)."""
    import psutil

    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def _kill_pids(pids: Sequence[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def wait_readable(fd: int, timeout: float) -> bool:
    import selectors

    sel = selectors.DefaultSelector()
    try:
        sel.register(fd, selectors.EVENT_READ)
        return bool(sel.select(max(0.0, timeout)))
    finally:
        sel.close()


def kill_on_timeout(proc: _Waitable, pidfd: int, kill_grace: float) -> list[str]:
    """TERM the tree, wait ``kill_grace``, KILL it; returns notes for the result.

    The tree is snapshotted first (it changes once killing starts) so that children that called
    ``setsid`` are caught too; the group is killed once more after the leader is reaped.
    """
    notes = []
    pgid = proc.pid  # start_new_session makes the child its own session and group leader
    tree = _descendants(proc.pid)
    _signal_members(live_session_members(pgid), signal.SIGTERM)
    signal_group(pgid, signal.SIGTERM)
    _kill_pids(tree, signal.SIGTERM)
    if not wait_readable(pidfd, kill_grace):
        notes.append(f"did not exit {kill_grace:g}s after SIGTERM; sent SIGKILL")
    tree += [p for p in _descendants(proc.pid) if p not in tree]
    signal_group(pgid, signal.SIGKILL)
    _kill_pids(tree, signal.SIGKILL)
    proc.wait()
    signal_group(pgid, signal.SIGKILL)
    _signal_members(live_session_members(pgid), signal.SIGKILL)
    return notes


#: How long processes still in a call's session after its leader exited get to leave it before the
#: sweep. ``setsid mydaemon </dev/null >/dev/null 2>&1 & exit 0`` forks a child that calls setsid
#: only after the plugin may have exited (without this grace the sweep nearly always caught it).
LEAVE_GRACE = 0.5


def _still_in(sid: int, pids: Sequence[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if os.getsid(pid) == sid and not _is_zombie(pid):
                out.append(pid)
        except OSError:
            continue
    return out


def _await_leaving(sid: int, grace: float) -> list[tuple[int, int]]:
    """The session's members once ``grace`` is over or none is left; each one re-checked with getsid.

    Polls only the known members (one getsid each), and rescans /proc when they are all
    gone, so a child one of them forked meanwhile is still seen.
    """
    end = time.monotonic() + grace
    members = live_session_members(sid)
    while members:
        pids = [p for p, _ in members]
        while _still_in(sid, pids) and time.monotonic() < end:
            time.sleep(0.005)
        members = live_session_members(sid)
        if time.monotonic() >= end:
            break
    return members


def kill_stragglers(sid: int, kill_grace: float) -> int:
    """Kill what is still in the session after its leader exited; returns how many there were.

    Whatever group a straggler moved to (``set -m``) and whatever environment it kept
    (``env -i``), it stays in the call's session unless it called ``setsid``. One that is on its
    way out (``setsid daemon &``) gets :data:`LEAVE_GRACE`: whoever is still a member then is
    killed, everyone else is left alone. Costs nothing when the session is empty.
    """
    stray = live_session_members(sid)
    if stray:
        stray = _await_leaving(sid, LEAVE_GRACE)
    if stray:
        _signal_members(stray, signal.SIGTERM)
        end = time.monotonic() + min(kill_grace, 0.5)
        while time.monotonic() < end and live_session_members(sid):
            time.sleep(0.01)
        _signal_members(live_session_members(sid), signal.SIGKILL)
    return len(stray)
