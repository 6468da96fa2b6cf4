"""The one place netplugin starts processes.

Mechanism only, no policy: :func:`run` executes an argv list (never a shell)
with a given environment and stdin, captures stdout and stderr separately and
bounded, and enforces a deadline on the *whole process tree*:

* the child starts in its own session, so its process group holds everything it
  forks that does not deliberately detach;
* the wait is event-driven (a pidfd and the pipes in one ``select``), so a call
  costs no polling sleeps (``subprocess.run(timeout=...)`` adds about 1 ms);
* on timeout the tree is snapshotted (psutil, to also catch children that
  called ``setsid``), the group gets SIGTERM, then after a grace SIGKILL, and the
  group is killed again after the leader exits;
* processes still in the group after the leader exited normally are killed too,
  and reported in :attr:`Completed.leftover`, so nothing a plugin started
  outlives the call.

What the caller makes of the outcome (which exit status is an error, what to
quote) is decided in :mod:`netplugin.plugin`.
"""

from __future__ import annotations

import errno
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["Background", "Completed", "Runner", "SpawnError", "run", "start"]

_READ_CHUNK = 65536
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
    ) -> Completed: ...


class _Capture:
    """A bounded buffer. stdout keeps its head (it is parsed); stderr keeps its tail (it is quoted)."""

    def __init__(self, limit: int, keep_tail: bool) -> None:
        self.buf = bytearray()
        self.limit = limit
        self.keep_tail = keep_tail
        self.truncated = False

    def add(self, data: bytes) -> None:
        self.buf += data
        if len(self.buf) > self.limit:
            self.truncated = True
            if self.keep_tail:
                del self.buf[: len(self.buf) - self.limit]
            else:
                del self.buf[self.limit :]


def _signal_group(pgid: int, sig: int) -> bool:
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


def _wait_readable(fd: int, timeout: float) -> bool:
    sel = selectors.DefaultSelector()
    try:
        sel.register(fd, selectors.EVENT_READ)
        return bool(sel.select(max(0.0, timeout)))
    finally:
        sel.close()


def run(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    stdin: bytes | None = None,
    timeout: float,
    max_output: int = 1 << 20,
    kill_grace: float = 2.0,
    cwd: str = "/",
) -> Completed:
    """Run ``argv`` to completion or until ``timeout`` seconds; see the module doc.

    Raises :class:`SpawnError` if the program cannot be started. Never raises for what the
    program does (exit status, signals, output, timeouts are all in the result).
    """
    argv = list(argv)
    start = time.monotonic()
    deadline = start + timeout
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env),
            cwd=cwd,
            close_fds=True,
            start_new_session=True,
        )
    except OSError as e:
        raise SpawnError(argv[0], e) from e

    pgid = proc.pid  # start_new_session makes the child its own session and group leader
    out = _Capture(max_output, keep_tail=False)
    err = _Capture(max_output, keep_tail=True)
    result = Completed(argv=argv, returncode=None, pid=proc.pid)
    sel = selectors.DefaultSelector()
    pidfd = os.pidfd_open(proc.pid)
    assert proc.stdout is not None and proc.stderr is not None
    streams = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
    for fd in streams:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    sel.register(pidfd, selectors.EVENT_READ)
    pending_input = memoryview(stdin) if stdin else None
    if proc.stdin is not None:
        os.set_blocking(proc.stdin.fileno(), False)
        sel.register(proc.stdin.fileno(), selectors.EVENT_WRITE)

    def close_stdin() -> None:
        if proc.stdin is not None and not proc.stdin.closed:
            try:
                sel.unregister(proc.stdin.fileno())
            except (KeyError, ValueError):
                pass
            try:
                proc.stdin.close()
            except BrokenPipeError:
                pass

    def pump(wait: float) -> bool:
        """One select round; returns True when the leader has exited."""
        nonlocal pending_input
        exited = False
        for key, _ in sel.select(max(0.0, wait)):
            fd = key.fd
            if fd == pidfd:
                exited = True
            elif fd in streams:
                try:
                    chunk = os.read(fd, _READ_CHUNK)
                except BlockingIOError:
                    continue
                if chunk:
                    streams[fd].add(chunk)
                else:
                    sel.unregister(fd)
                    del streams[fd]
            elif pending_input is not None:
                try:
                    n = os.write(fd, pending_input[:_READ_CHUNK])
                    pending_input = pending_input[n:]
                except BlockingIOError:
                    continue
                except (BrokenPipeError, OSError):
                    # The plugin does not read stdin; that is its right.
                    pending_input = None
                if pending_input is None or not len(pending_input):
                    pending_input = None
                    close_stdin()
        return exited

    def drain(seconds: float) -> None:
        # The leader is reaped: its pidfd stays readable for ever and would turn select into a busy loop.
        try:
            sel.unregister(pidfd)
        except (KeyError, ValueError):
            pass
        end = time.monotonic() + seconds
        while streams and time.monotonic() < end:
            pump(end - time.monotonic())

    try:
        exited = False
        while not exited:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            exited = pump(remaining)

        if not exited:
            # Timeout: snapshot the tree first (it changes once we start killing), then TERM, grace, KILL.
            result.timed_out = True
            tree = _descendants(proc.pid)
            _signal_group(pgid, signal.SIGTERM)
            _kill_pids(tree, signal.SIGTERM)
            if not _wait_readable(pidfd, kill_grace):
                result.notes.append(f"did not exit {kill_grace:g}s after SIGTERM; sent SIGKILL")
            tree += [p for p in _descendants(proc.pid) if p not in tree]
            _signal_group(pgid, signal.SIGKILL)
            _kill_pids(tree, signal.SIGKILL)
            proc.wait()
            _signal_group(pgid, signal.SIGKILL)
        else:
            proc.wait()
            # Anything still in the group was started by the plugin and not waited for.
            if _signal_group(pgid, 0):
                stray = _live_group_members(pgid)
                if stray:
                    result.leftover = len(stray)
                    _signal_group(pgid, signal.SIGTERM)
                    end = time.monotonic() + min(kill_grace, 0.5)
                    while time.monotonic() < end and _live_group_members(pgid):
                        time.sleep(0.01)
                    _signal_group(pgid, signal.SIGKILL)
        drain(_DRAIN_SECONDS)
    finally:
        close_stdin()
        sel.close()
        os.close(pidfd)
        for f in (proc.stdout, proc.stderr):
            try:
                f.close()
            except OSError as e:  # pragma: no cover - closing a pipe we own
                if e.errno != errno.EBADF:
                    raise
        if proc.returncode is None:  # an exception escaped above: never leave the tree behind
            _signal_group(pgid, signal.SIGKILL)
            proc.wait()

    result.returncode = proc.returncode
    result.stdout = bytes(out.buf)
    result.stderr = bytes(err.buf)
    result.stdout_truncated = out.truncated
    result.stderr_truncated = err.truncated
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
        if not _wait_readable(self.proc.stdout.fileno(), timeout):
            return b""
        return self.proc.stdout.readline()

    def stop(self) -> None:
        if self.proc.returncode is None:
            _signal_group(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def start(argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> Background:
    """Start ``argv`` in its own process group with stdout piped; see :class:`Background`."""
    try:
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
    except OSError as e:
        raise SpawnError(argv[0], e) from e
    return Background(proc)
