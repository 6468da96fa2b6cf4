"""The I/O side of one plugin call: bounded capture of stdout and stderr, stdin feeding, and the
exit of the leader, all in one event-driven ``select`` loop (a pidfd plus the pipes).

Private to :mod:`netplugin.core.execplugin.invoke`, the only module that starts processes.
"""

from __future__ import annotations

import errno
import os
import selectors
import subprocess
import time

__all__ = ["Pump"]

_READ_CHUNK = 65536


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


class Pump:
    """Moves bytes between a started process and bounded buffers until told to stop.

    :meth:`step` runs one select round and says whether the leader exited; :meth:`drain` keeps
    reading the pipes for a while after that; :meth:`close` releases every descriptor.
    """

    def __init__(self, proc: subprocess.Popen[bytes], stdin: bytes | None, max_output: int) -> None:
        assert proc.stdout is not None and proc.stderr is not None
        self.proc = proc
        self.out = _Capture(max_output, keep_tail=False)
        self.err = _Capture(max_output, keep_tail=True)
        self.sel = selectors.DefaultSelector()
        self.pidfd = os.pidfd_open(proc.pid)
        self.streams = {proc.stdout.fileno(): self.out, proc.stderr.fileno(): self.err}
        for fd in self.streams:
            os.set_blocking(fd, False)
            self.sel.register(fd, selectors.EVENT_READ)
        self.sel.register(self.pidfd, selectors.EVENT_READ)
        self.pending: memoryview | None = memoryview(stdin) if stdin else None
        if proc.stdin is not None:
            os.set_blocking(proc.stdin.fileno(), False)
            self.sel.register(proc.stdin.fileno(), selectors.EVENT_WRITE)

    def close_stdin(self) -> None:
        stdin = self.proc.stdin
        if stdin is not None and not stdin.closed:
            try:
                self.sel.unregister(stdin.fileno())
            except (KeyError, ValueError):
                pass
            try:
                stdin.close()
            except BrokenPipeError:
                pass

    def _feed(self, fd: int) -> None:
        if self.pending is None:
            return
        try:
            n = os.write(fd, self.pending[:_READ_CHUNK])
            self.pending = self.pending[n:]
        except BlockingIOError:
            return
        except OSError:
            # The plugin does not read stdin; that is its right.
            self.pending = None
        if self.pending is None or not len(self.pending):
            self.pending = None
            self.close_stdin()

    def step(self, wait: float) -> bool:
        """One select round; returns True when the leader has exited."""
        exited = False
        for key, _ in self.sel.select(max(0.0, wait)):
            fd = key.fd
            if fd == self.pidfd:
                exited = True
            elif fd in self.streams:
                try:
                    chunk = os.read(fd, _READ_CHUNK)
                except BlockingIOError:
                    continue
                if chunk:
                    self.streams[fd].add(chunk)
                else:
                    self.sel.unregister(fd)
                    del self.streams[fd]
            else:
                self._feed(fd)
        return exited

    def wait_exit(self, deadline: float) -> bool:
        """Pump until the leader exits (True) or the deadline passes (False)."""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if self.step(remaining):
                return True

    def drain(self, seconds: float) -> None:
        # The leader is reaped: its pidfd stays readable for ever and would turn select into a busy loop.
        try:
            self.sel.unregister(self.pidfd)
        except (KeyError, ValueError):
            pass
        end = time.monotonic() + seconds
        while self.streams and time.monotonic() < end:
            self.step(end - time.monotonic())

    def close(self) -> None:
        self.close_stdin()
        self.sel.close()
        os.close(self.pidfd)
        for f in (self.proc.stdout, self.proc.stderr):
            if f is None:
                continue
            try:
                f.close()
            except OSError as e:  # pragma: no cover - closing a pipe we own
                if e.errno != errno.EBADF:
                    raise
