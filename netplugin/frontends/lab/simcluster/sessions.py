"""Stopping a child that was started in a session of its own, with everything it started."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess

__all__ = ["stop_session"]


def stop_session(proc: subprocess.Popen[bytes], grace: float = 20.0) -> int:
    """SIGTERM to ``proc``'s process group, then SIGKILL if it has not exited within ``grace``
    seconds; its exit status. ``proc`` must lead its group (``start_new_session=True``): the signal
    reaches what it started too, and never the caller's own group."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(grace)
    return proc.returncode
