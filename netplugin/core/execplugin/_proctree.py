"""Killing a plugin's process tree: its session and group, descendants that left them, stragglers.

Private to :mod:`netplugin.core.execplugin.invoke`, the only module that starts processes.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence
from typing import Protocol

__all__ = ["kill_on_timeout", "kill_stragglers", "signal_group", "wait_readable"]


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
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return True
    state = data[data.rfind(b")") + 2 :][:1]
    return state in (b"Z", b"X")


def live_session_members(sid: int) -> list[tuple[int, int]]:
    """(pid, pgid) of every process of session ``sid`` that is not a zombie.

    getsid(2) costs about 3 us a process; only the members' stat files are read. A session
    holds every process of a call that did not call ``setsid``, whatever group it moved to.
    """
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


def kill_stragglers(sid: int, kill_grace: float) -> int:
    """Kill what is still in the session after its leader exited; returns how many there were.

    Whatever group a straggler moved to (``set -m``) and whatever environment it kept
    (``env -i``), it stays in the call's session unless it called ``setsid``.
    """
    stray = live_session_members(sid)
    if stray:
        _signal_members(stray, signal.SIGTERM)
        end = time.monotonic() + min(kill_grace, 0.5)
        while time.monotonic() < end and live_session_members(sid):
            time.sleep(0.01)
        _signal_members(live_session_members(sid), signal.SIGKILL)
    return len(stray)
