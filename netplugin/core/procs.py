"""Process identity: this boot's id and a process's start time.

A pid alone is reused; (pid, start time, boot id) names one process for ever. Both the store
(record owners) and the manager (init markers) need these, so they live here, below both.
"""

# Imports inside this module's functions are kept for the per-call import set
# (tests/frontends/fastpath.py): each keeps a module off the calls that do not need it
# (BENCHMARKS.md rows B-i and B: the CLI's cold start and per-pod run without a daemon).

from __future__ import annotations

__all__ = ["boot_id", "pid_alive", "proc_start", "proc_stat"]

_BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


def boot_id() -> str:
    """This boot's id (init markers from an earlier boot do not count)."""
    try:
        with open(_BOOT_ID_PATH) as f:
            return f.read().strip()
    except OSError:
        # No procfs (unusual): fall back to the boot time, which also changes per boot.
        import psutil

        return f"btime:{int(psutil.boot_time())}"


def proc_stat(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state first: proc(5)'s field 3
    is index 0), or None if the process is gone. The name is skipped by its last ``)``: it may
    hold blanks and parentheses."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rfind(b")") + 2 :].split()


def proc_start(pid: int) -> int | None:
    """A live process's start time (clock ticks since boot), or None if it is gone or a zombie."""
    fields = proc_stat(pid)
    if fields is None or len(fields) < 20 or fields[0] in (b"Z", b"X"):
        return None
    try:
        return int(fields[19])  # field 22 of proc(5): starttime
    except ValueError:
        return None


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one of another user counts); never true of 0 or a negative
    number, which ``kill`` would take for a process group."""
    import os

    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
