"""Killing a plugin's process tree: its group, its descendants that left the group, stragglers.

Private to :mod:`netplugin.core.invoke`, the only module that starts processes.
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


def _live_group_members(pgid: int) -> list[int]:
    """PIDs in the group that are not zombies (a zombie is dead, only waiting for its parent)."""
    import psutil

    members = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(proc.pid)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return members


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
    signal_group(pgid, signal.SIGTERM)
    _kill_pids(tree, signal.SIGTERM)
    if not wait_readable(pidfd, kill_grace):
        notes.append(f"did not exit {kill_grace:g}s after SIGTERM; sent SIGKILL")
    tree += [p for p in _descendants(proc.pid) if p not in tree]
    signal_group(pgid, signal.SIGKILL)
    _kill_pids(tree, signal.SIGKILL)
    proc.wait()
    signal_group(pgid, signal.SIGKILL)
    return notes


def kill_stragglers(pgid: int, kill_grace: float) -> int:
    """Kill what is still in the group after its leader exited; returns how many there were."""
    if not signal_group(pgid, 0):
        return 0
    stray = _live_group_members(pgid)
    if stray:
        signal_group(pgid, signal.SIGTERM)
        end = time.monotonic() + min(kill_grace, 0.5)
        while time.monotonic() < end and _live_group_members(pgid):
            time.sleep(0.01)
        signal_group(pgid, signal.SIGKILL)
    return len(stray)
