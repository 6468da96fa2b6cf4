"""The daemon's Prometheus metrics, named and labelled as the kubelet's network plugin metrics.

``network_plugin_operations_duration_seconds`` (histogram), ``network_plugin_operations_total``
and ``network_plugin_operations_errors_total`` (counters), ``network_plugin_operations_in_flight``
(gauge), each by ``operation_type`` (``set_up_pod``, ``tear_down_pod``, ``get_pod_network_status``);
``netplugin_daemon_requests_total{op,outcome}`` (``op="invalid"`` for a request whose op could not be
read); ``netplugin_chain_member_duration_seconds{plugin,action,outcome}`` (histogram: each chain
member's own part of a pod action, ``outcome`` ``ok``, ``error`` or ``timeout``);
``netplugin_build_info{version,python_version}`` (always 1); the gc runs' (:mod:`.gckeeper`); and the process metrics.
prometheus_client is imported here only, when the daemon starts: never on a per-call path.
"""

from __future__ import annotations

import platform
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from netplugin import __version__
from netplugin.core.errors import SystemFailure

__all__ = ["BUCKETS", "INVALID_OP", "OPERATION_TYPES", "Metrics"]

#: protocol op -> the kubelet's ``operation_type`` label
OPERATION_TYPES = {"setup": "set_up_pod", "teardown": "tear_down_pod", "status": "get_pod_network_status"}

#: the ``op`` label of a request rejected before its op was known (not JSON, unknown op, ...)
INVALID_OP = "invalid"


# Buckets of the kubelet's histogram (prometheus' defaults) plus the default time limits.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    """The daemon's Prometheus metrics, on a registry of their own."""

    def __init__(self) -> None:
        import prometheus_client
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        # *_created samples double every counter's series for no use here.
        prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry: CollectorRegistry = CollectorRegistry()
        prometheus_client.ProcessCollector(registry=self.registry)
        self.duration = Histogram(
            "network_plugin_operations_duration_seconds",
            "Latency in seconds of network plugin operations, including the wait for the pod's lock.",
            ["operation_type"],
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.total = Counter(
            "network_plugin_operations",
            "Network plugin operations, by operation type (failed ones included).",
            ["operation_type"],
            registry=self.registry,
        )
        self.errors = Counter(
            "network_plugin_operations_errors",
            "Network plugin operations that failed.",
            ["operation_type"],
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "network_plugin_operations_in_flight",
            "Network plugin operations running now (including those waiting for the pod's lock).",
            ["operation_type"],
            registry=self.registry,
        )
        self.requests = Counter(
            "netplugin_daemon_requests",
            "Requests answered by the netplugin daemon, by op and outcome (ok or the error class).",
            ["op", "outcome"],
            registry=self.registry,
        )
        self.member = Histogram(
            "netplugin_chain_member_duration_seconds",
            "Latency in seconds of one chain member's action (setup, teardown, status), by member and outcome.",
            ["plugin", "action", "outcome"],
            buckets=BUCKETS,
            registry=self.registry,
        )
        build = Gauge(
            "netplugin_build_info",
            "The running netplugin's version and Python; always 1.",
            ["version", "python_version"],
            registry=self.registry,
        )
        build.labels(__version__, platform.python_version()).set(1)
        for otype in OPERATION_TYPES.values():
            # Present from the start, so a dashboard sees zeros rather than nothing.
            self.duration.labels(otype)
            self.total.labels(otype)
            self.errors.labels(otype)
            self.in_flight.labels(otype)
        #: op -> its labelled children (in flight, total, errors, duration): looked up once, not per call
        self._children = {
            op: (self.in_flight.labels(t), self.total.labels(t), self.errors.labels(t), self.duration.labels(t))
            for op, t in OPERATION_TYPES.items()
        }
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def serve(self, address: str) -> str:
        """Serve ``/metrics`` on ``HOST:PORT`` (port 0: any free port); returns the bound address."""
        from prometheus_client import start_http_server

        host, _, port = address.rpartition(":")
        host = host.strip("[]")
        try:
            self._server, self._thread = start_http_server(int(port), addr=host, registry=self.registry)
        except OSError as e:
            raise SystemFailure("cannot serve metrics on", address, e.strerror or str(e)) from e
        bound_host, bound_port = self._server.server_address[:2]
        return f"[{bound_host}]:{bound_port}" if ":" in bound_host else f"{bound_host}:{bound_port}"

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def observe_member(self, plugin: str, action: str, seconds: float, outcome: str) -> None:
        """One chain member's call (the manager's observer)."""
        self.member.labels(plugin, action, outcome).observe(seconds)

    def timed(self, op: str, fn: Callable[[], Any]) -> Any:
        """Run a pod operation, recording its duration, failure and presence (kubelet semantics)."""
        gauge, total, errors, duration = self._children[op]
        gauge.inc()
        total.inc()
        start = time.monotonic()
        try:
            return fn()
        except BaseException:
            errors.inc()
            raise
        finally:
            duration.observe(time.monotonic() - start)
            gauge.dec()

    async def timed_async(self, op: str, fn: Callable[[], Awaitable[Any]]) -> Any:
        """:meth:`timed` for a coroutine: the time waiting for the pod's turn counts, as in the kubelet."""
        gauge, total, errors, duration = self._children[op]
        gauge.inc()
        total.inc()
        start = time.monotonic()
        try:
            return await fn()
        except BaseException:
            errors.inc()
            raise
        finally:
            duration.observe(time.monotonic() - start)
            gauge.dec()
