"""A daemon of the benchmark's own, and the contenders that own one (C, D here; F, G, H in :mod:`bench.runtime`).

The benchmark talks to ``netplugin serve`` as netplugin's own clients do: requests built by the
protocol module (:mod:`netplugin.frontends.wire.protocol`), carried by :mod:`netplugin.frontends.wire.client`
(connect, peer check, send, read one answer). Only the concurrent case is the benchmark's own:
every request sent at once, each on its own connection, and the answers collected with one
selector, so that the makespan is the daemon's and not a thread pool's.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from netplugin.frontends.wire import client, codec
from netplugin.frontends.wire import protocol as rpc

from .contenders import Contender
from .context import Network, netplugin_env, with_checkout
from .util import BenchError, Pod

__all__ = ["Daemon", "DaemonContender", "DaemonOwner", "health_request", "pod_request"]


def pod_request(op: str, pod: Pod) -> dict[str, Any]:
    """The request for ``op`` (setup, teardown, status) on ``pod``, under the daemon's own settings."""
    return rpc.pod_request(op, pod.namespace, pod.name, pod.infra_id)


def health_request() -> dict[str, Any]:
    return rpc.request("health")


def _result(response: dict[str, Any], what: str) -> Any:
    """The result of a response object, or BenchError with the daemon's error."""
    if response.get("ok") is not True:
        err = response.get("error")
        raise BenchError(f"{what} failed in the daemon: {codec.dumps(err)[:600]}")
    return response.get("result")


class Daemon:
    """A ``netplugin serve`` process of the benchmark's own (its own socket, dirs and process group)."""

    def __init__(self, env: dict[str, str], socket_path: str, cli: list[str], log: Path) -> None:
        self.env = dict(env)
        self.env["NETPLUGIN_SOCKET"] = socket_path
        # port 0: two daemons (or a machine's own) never fight over the metrics port
        self.env["NETPLUGIN_METRICS_ADDRESS"] = "127.0.0.1:0"
        self.socket = socket_path
        self.cli = cli
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> None:
        logf = open(self.log, "wb")  # noqa: SIM115 - the child keeps it; closed below
        try:
            self.proc = subprocess.Popen(
                [*self.cli, "serve"], env=self.env, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                close_fds=True, start_new_session=True,
            )
        finally:
            logf.close()
        end = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise BenchError(f"the daemon exited with {self.proc.returncode} at start: {self.log_tail()}")
            try:
                self.request(health_request(), "health")
                return
            except BenchError:
                if time.monotonic() > end:
                    raise BenchError(f"the daemon did not answer within {timeout:g}s: {self.log_tail()}") from None
                time.sleep(0.05)

    def log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace").strip()[-800:]
        except OSError:
            return ""

    def request(self, body: dict[str, Any], what: str, timeout: float = 120.0) -> Any:
        """One request on a fresh connection, as a thin client process would make it; its result."""
        try:
            response = client.exchange(self.socket, body, timeout=timeout)
        except (client.NotSent, client.NoAnswer) as e:
            raise BenchError(f"{what}: {e}: {self.log_tail()}") from None
        return _result(response, what)

    def many(self, bodies: Sequence[dict[str, Any]], what: str, timeout: float = 300.0) -> float:
        """Send every request at once, each on its own connection; seconds until the last answer."""
        sel = selectors.DefaultSelector()
        socks: list[Any] = []
        bufs: dict[int, bytearray] = {}
        errors: list[str] = []
        try:
            t0 = time.perf_counter()
            for body in bodies:
                s = client.connect(self.socket)
                socks.append(s)
                client.send(s, body, None)
                s.setblocking(False)
                bufs[s.fileno()] = bytearray()
                sel.register(s.fileno(), selectors.EVENT_READ, s)
            pending = len(socks)
            end = time.monotonic() + timeout
            while pending:
                left = end - time.monotonic()
                if left <= 0:
                    raise BenchError(f"{what}: {pending} answer(s) missing after {timeout:g}s")
                for key, _ in sel.select(left):
                    s, buf = key.data, bufs[key.fd]
                    chunk = s.recv(65536)
                    buf += chunk
                    if chunk and b"\n" not in chunk:
                        continue
                    sel.unregister(key.fd)
                    pending -= 1
                    try:
                        # the whole line is in buf: read_response parses it and reads nothing more
                        _result(client.read_response(s, buf, what, None), what)
                    except (client.NoAnswer, BenchError) as e:
                        errors.append(str(e))
            elapsed = time.perf_counter() - t0
        except (client.NotSent, OSError) as e:
            raise BenchError(f"{what}: {e}: {self.log_tail()}") from None
        finally:
            sel.close()
            for s in socks:
                s.close()
        if errors:
            raise BenchError(f"{len(errors)} of {len(bodies)} failed; first: {errors[0]}")
        return elapsed

    def rss(self) -> int | None:
        """The daemon's resident memory with its worker processes' (their RSS summed)."""
        if self.proc is None or self.proc.poll() is not None:
            return None
        import psutil

        try:
            main = psutil.Process(self.proc.pid)
            return int(sum(p.memory_info().rss for p in [main, *main.children()]))
        except psutil.Error:
            return None

    def stop(self) -> None:
        """Stop the daemon (SIGTERM, then SIGKILL), anything left in its process group, and remove its socket."""
        p = self.proc
        if p is not None and p.returncode is None:
            _signal_group(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                _signal_group(p.pid, signal.SIGKILL)
                p.wait()
            # anything left in its group (a plugin it was running) goes too
            _signal_group(p.pid, signal.SIGKILL)
        try:
            os.unlink(self.socket)
        except OSError:
            pass


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


class DaemonOwner(Contender):
    """A contender with a ``netplugin serve`` of its own, on its network, with its settings.

    ``start`` starts the daemon (and registers its stop with the run's cleanup), ``rss`` is the
    daemon's, ``stop`` stops it. How pods are set up is the subclass's: requests (C, D) or a
    process per action that forwards to the daemon (F, G, H).
    """

    def __init__(
        self, net: Network, key: str, plugin: str, plugin_dir: Path, extra: dict[str, str] | None = None
    ) -> None:
        super().__init__(net)
        self.key = key  # type: ignore[misc]  # an instance attribute shadows the ClassVar on purpose
        self.plugin = plugin
        env = with_checkout(netplugin_env(net, plugin, plugin_dir=plugin_dir, extra=extra), self.ctx.cli)
        sock = str(net.dir / f"daemon-{key}.sock")
        self.daemon = Daemon(env, sock, self.ctx.cli, net.dir / f"daemon-{key}.log")

    def start(self) -> None:
        self.ctx.cleanup.push(f"daemon {self.key} on {self.net.bridge}", self.stop)
        self.daemon.start()

    def rss(self) -> int | None:
        return self.daemon.rss()

    def stop(self) -> None:
        self.daemon.stop()


class DaemonContender(DaemonOwner):
    """C and D: requests to a ``netplugin serve`` of the benchmark's own over its unix socket.

    Each sequential action is one request on a fresh connection, as a thin client (the CLI or
    the CNI shim) makes it; a burst or a drain sends every request at once, each on its own
    connection, and the daemon runs them concurrently.
    """

    def __init__(self, net: Network, key: str, plugin: str, plugin_dir: Path | None = None) -> None:
        pdir = plugin_dir if plugin_dir is not None else net.dir / "exec-empty"
        pdir.mkdir(mode=0o755, exist_ok=True)
        super().__init__(net, key, plugin, pdir)

    def _one(self, op: str, pod: Pod) -> None:
        self.daemon.request(pod_request(op, pod), f"{self.key} {op} {pod.infra_id}")

    def setup(self, pod: Pod) -> None:
        self._one("setup", pod)

    def teardown(self, pod: Pod) -> None:
        self._one("teardown", pod)

    def status(self, pod: Pod) -> None:
        self._one("status", pod)

    def burst(self, pods: Sequence[Pod]) -> float:
        return self.daemon.many([pod_request("setup", p) for p in pods], f"{self.key} burst setup")

    def drain(self, pods: Sequence[Pod]) -> float:
        return self.daemon.many([pod_request("teardown", p) for p in pods], f"{self.key} drain")

    def populate(self, pods: Sequence[Pod], width: int = 32) -> None:
        for i in range(0, len(pods), width):
            self.daemon.many([pod_request("setup", p) for p in pods[i : i + width]], f"{self.key} populate")
