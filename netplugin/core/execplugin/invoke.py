"""The one place netplugin starts processes.

In detail: ``ARCHITECTURE.md``, "Module notes".

Mechanism only, no policy: :func:`run` executes an argv list (never a shell)
with a given environment and stdin, captures stdout and stderr separately and
bounded, and enforces a deadline on the *whole process tree*:
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import Protocol

from netplugin.core.defaults import DEFAULT_KILL_GRACE, DEFAULT_MAX_OUTPUT
from netplugin.core.execplugin._proctree import (
    adopt_orphans,
    kill_on_timeout,
    kill_stragglers,
    reap_adopted,
    signal_group,
    spawned,
    spawning,
    wait_readable,
)
from netplugin.core.execplugin._pump import Pump
from netplugin.core.plaindata import dataclass, field

__all__ = ["Background", "Completed", "Runner", "SpawnError", "adopt_orphans", "reap_adopted", "run", "start"]

# How long to keep reading pipes after the process tree is gone; a detached grandchild
# that kept our pipes open must not hold the caller.
_DRAIN_SECONDS = 0.2


class SpawnError(Exception):
    """The executable could not be started at all (ENOENT, EACCES, ENOEXEC, ...)."""

    def __init__(self, path: str, err: OSError) -> None:
        super().__init__(f"cannot execute {path}: {err.strerror or err}")
        self.path = path
        self.errno = err.errno
        self.reason = err.strerror or str(err)


@dataclass
class Completed:
    """What happened to one process run."""

    argv: list[str]
    returncode: int | None
    stdout: bytes = b""
    stderr: bytes = b""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    timed_out: bool = False
    #: processes of the plugin's tree that were still running after the leader exited (now killed)
    leftover: int = 0
    duration: float = 0.0
    pid: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def signal(self) -> int | None:
        """The signal that ended the process, if one did."""
        return -self.returncode if self.returncode is not None and self.returncode < 0 else None

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.leftover


class Runner(Protocol):
    """The invoker seam: tests may pass a fake with this signature to the plugin layer."""

    def __call__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        stdin: bytes | None,
        timeout: float,
        max_output: int = ...,
        kill_grace: float = ...,
        exe_fd: int | None = ...,
    ) -> Completed: ...


def _spawn(
    argv: list[str], env: Mapping[str, str], stdin: bytes | None, cwd: str, exe_fd: int | None
) -> subprocess.Popen[bytes]:
    try:
        with spawning() as leaders:
            proc = subprocess.Popen(
                argv,
                executable=None if exe_fd is None else f"/proc/self/fd/{exe_fd}",
                pass_fds=() if exe_fd is None else (exe_fd,),
                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=dict(env),
                cwd=cwd,
                close_fds=True,
                start_new_session=True,
            )
            leaders.add(proc.pid)
    except OSError as e:
        raise SpawnError(argv[0], e) from e
    return proc


def run(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    stdin: bytes | None = None,
    timeout: float,
    max_output: int = DEFAULT_MAX_OUTPUT,
    kill_grace: float = DEFAULT_KILL_GRACE,
    cwd: str = "/",
    exe_fd: int | None = None,
) -> Completed:
    """Run ``argv`` to completion or until ``timeout`` seconds; see the module doc.

    Raises :class:`SpawnError` if the program cannot be started. Never raises for what the
    program does (exit status, signals, output, timeouts are all in the result).
    """
    argv = list(argv)
    start = time.monotonic()
    proc = _spawn(argv, env, stdin, cwd, exe_fd)
    result = Completed(argv=argv, returncode=None, pid=proc.pid)
    pump = Pump(proc, stdin, max_output)
    try:
        if pump.wait_exit(start + timeout):
            proc.wait()
            # Anything still in the call's session was started by the plugin and not waited for.
            result.leftover = kill_stragglers(proc.pid, kill_grace)
        else:
            result.timed_out = True
            result.notes += kill_on_timeout(proc, pump.pidfd, kill_grace)
        pump.drain(_DRAIN_SECONDS)
    finally:
        pump.close()
        if proc.returncode is None:  # an exception escaped above: never leave the tree behind
            signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
        spawned(proc.pid)
        reap_adopted()
    result.returncode = proc.returncode
    result.stdout = bytes(pump.out.buf)
    result.stderr = bytes(pump.err.buf)
    result.stdout_truncated = pump.out.truncated
    result.stderr_truncated = pump.err.truncated
    result.duration = time.monotonic() - start
    return result


class Background:
    """A long-running helper process (for example a test listener in a pod's netns).

    Its whole process group is killed when the block ends, however it ends.
    """

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc

    def __enter__(self) -> Background:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def read_line(self, timeout: float) -> bytes:
        """One line of stdout, or b"" if none came within ``timeout`` seconds."""
        assert self.proc.stdout is not None
        if not wait_readable(self.proc.stdout.fileno(), timeout):
            return b""
        return self.proc.stdout.readline()

    def stop(self) -> None:
        if self.proc.returncode is None:
            signal_group(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        spawned(self.proc.pid)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def start(argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> Background:
    """Start ``argv`` in its own process group with stdout piped; see :class:`Background`."""
    try:
        with spawning() as leaders:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=None if env is None else dict(env),
                close_fds=True,
                start_new_session=True,
                # Unbuffered: read_line selects on the fd, so no line may hide in a Python-side buffer.
                bufsize=0,
            )
            leaders.add(proc.pid)
    except OSError as e:
        raise SpawnError(argv[0], e) from e
    return Background(proc)
