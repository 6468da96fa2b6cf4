"""The daemon's Prometheus metrics: every series it exports is a row of :data:`SERIES`.

The kubelet-compatible series carry the kubelet's own names (``kubelet_network_plugin_operations_*``,
by ``operation_type``: ``set_up_pod``, ``tear_down_pod``, ``get_pod_network_status``), so a
dashboard made for the kubelet's exec plugin metrics reads them unchanged; netplugin's own series
carry the ``netplugin_`` prefix. docs/metrics.md's table and a test against a live daemon's
``/metrics`` both follow :data:`SERIES`; the process collector's ``process_*`` series come on top.
prometheus_client is imported here only, when the daemon starts: never on a per-call path.
"""

from __future__ import annotations

import platform
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from netplugin import __version__
from netplugin.core.errors import SystemFailure

__all__ = ["BUCKETS", "INVALID_OP", "OPERATION_TYPES", "SERIES", "Metrics", "Series", "family", "make_metric"]

#: protocol op -> the kubelet's ``operation_type`` label
OPERATION_TYPES = {"setup": "set_up_pod", "teardown": "tear_down_pod", "status": "get_pod_network_status"}

#: the ``op`` label of a request rejected before its op was known (not JSON, unknown op, ...)
INVALID_OP = "invalid"


# Buckets of the kubelet's histogram (prometheus' defaults) plus the default time limits.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass(frozen=True)
class Series:
    """One exported series, as ``/metrics`` names it (a counter's name ends in ``_total``)."""

    name: str
    kind: str  #: counter, gauge or histogram
    labels: tuple[str, ...]
    help: str
    #: when it is exported: ``always``, or ``host: kube`` (the Kubernetes API client's counts)
    present: str = "always"


_OP = ("operation_type",)

KUBELET_DURATION = Series(
    "kubelet_network_plugin_operations_duration_seconds",
    "histogram",
    _OP,
    "Latency in seconds of network plugin operations, including the wait for the pod's lock.",
)
KUBELET_TOTAL = Series(
    "kubelet_network_plugin_operations_total",
    "counter",
    _OP,
    "Network plugin operations, by operation type (failed ones included).",
)
KUBELET_ERRORS = Series(
    "kubelet_network_plugin_operations_errors_total", "counter", _OP, "Network plugin operations that failed."
)
IN_FLIGHT = Series(
    "netplugin_operations_in_flight",
    "gauge",
    _OP,
    "Network plugin operations running now (including those waiting for the pod's lock).",
)
REQUESTS = Series(
    "netplugin_daemon_requests_total",
    "counter",
    ("op", "outcome"),
    "Requests answered by the netplugin daemon, by op and outcome (ok or the error class).",
)
MEMBER_DURATION = Series(
    "netplugin_chain_member_duration_seconds",
    "histogram",
    ("plugin", "action", "outcome"),
    "Latency in seconds of one chain member's action (setup, teardown, status), by member and outcome.",
)
BUILD_INFO = Series(
    "netplugin_build_info",
    "gauge",
    ("version", "python_version"),
    "The running netplugin's version and Python; always 1.",
)
# Read from the node keeper at each scrape (:mod:`.nodes`).
NODE_ROUTES = Series(
    "netplugin_node_routes", "gauge", ("family",), "Routes to other nodes' pod CIDRs in place, by IP family."
)
NODE_ROUTE_PROBLEMS = Series(
    "netplugin_node_route_problems",
    "gauge",
    (),
    "Pod CIDRs of other nodes that cannot be routed (see the daemon's health for why).",
)
NODE_PROBLEMS = Series(
    "netplugin_node_problems",
    "gauge",
    ("kind",),
    "What this node cannot act on, by kind (route refusals, unreadable Nodes, failing watches, broken pods).",
)
NODES = Series("netplugin_nodes", "gauge", (), "Nodes in the cluster, as last read.")
NODE_SYNCS = Series("netplugin_node_syncs_total", "counter", (), "Passes over the nodes (route reconciliations).")
KUBE_REQUESTS = Series(
    "netplugin_kube_requests_total",
    "counter",
    ("verb", "resource"),
    "Requests to the Kubernetes API, by verb and resource.",
    "host: kube",
)
KUBE_WATCH_EVENTS = Series(
    "netplugin_kube_watch_events_total",
    "counter",
    ("resource", "kind"),
    "What the list+watch caches did: lists, watches, relists after 410 Gone, failures, events, bookmarks.",
    "host: kube",
)
KUBE_RELISTS = Series(
    "netplugin_kube_relists_total",
    "counter",
    ("resource",),
    "LISTs made again because a watch's revision had left the API server's history (410 Gone).",
    "host: kube",
)
GC_RUNS = Series(
    "netplugin_gc_runs_total",
    "counter",
    ("trigger", "outcome"),
    "GC runs of the daemon, by trigger (start, periodic, pod-deleted) and outcome (ok, failed).",
)
GC_FREED = Series("netplugin_gc_freed_total", "counter", ("kind",), "What the daemon's GC runs freed, by kind.")
REPAIRS = Series(
    "netplugin_repairs_total", "counter", ("kind",), "What the daemon put back after the kernel lost it, by kind."
)

#: Every series the daemon exports, the kubelet's first. A new series is a new row here.
SERIES: tuple[Series, ...] = (
    KUBELET_DURATION,
    KUBELET_TOTAL,
    KUBELET_ERRORS,
    IN_FLIGHT,
    REQUESTS,
    MEMBER_DURATION,
    BUILD_INFO,
    NODE_ROUTES,
    NODE_ROUTE_PROBLEMS,
    NODE_PROBLEMS,
    NODES,
    NODE_SYNCS,
    KUBE_REQUESTS,
    KUBE_WATCH_EVENTS,
    KUBE_RELISTS,
    GC_RUNS,
    GC_FREED,
    REPAIRS,
)


def make_metric(series: Series, registry: Any) -> Any:
    """The prometheus_client metric for a row of :data:`SERIES`, on ``registry``."""
    from prometheus_client import Counter, Gauge, Histogram

    if series.kind == "histogram":
        return Histogram(series.name, series.help, series.labels, buckets=BUCKETS, registry=registry)
    cls = {"counter": Counter, "gauge": Gauge}[series.kind]
    return cls(series.name, series.help, series.labels, registry=registry)


def family(series: Series, **kwargs: Any) -> Any:
    """A collector's metric family for a row of :data:`SERIES` (read at scrape time, as the node keeper's)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    cls = {"counter": CounterMetricFamily, "gauge": GaugeMetricFamily}[series.kind]
    labels = list(series.labels) if series.labels else None
    return cls(series.name, series.help, labels=labels, **kwargs)


class Metrics:
    """The daemon's Prometheus metrics, on a registry of their own."""

    def __init__(self) -> None:
        import prometheus_client
        from prometheus_client import CollectorRegistry

        # *_created samples double every counter's series for no use here.
        prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry: CollectorRegistry = CollectorRegistry()
        prometheus_client.ProcessCollector(registry=self.registry)
        self.duration = make_metric(KUBELET_DURATION, self.registry)
        self.total = make_metric(KUBELET_TOTAL, self.registry)
        self.errors = make_metric(KUBELET_ERRORS, self.registry)
        self.in_flight = make_metric(IN_FLIGHT, self.registry)
        self.requests = make_metric(REQUESTS, self.registry)
        self.member = make_metric(MEMBER_DURATION, self.registry)
        make_metric(BUILD_INFO, self.registry).labels(__version__, platform.python_version()).set(1)
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
        with self._recorded(op):
            return fn()

    async def timed_async(self, op: str, fn: Callable[[], Awaitable[Any]]) -> Any:
        """:meth:`timed` for a coroutine: the time waiting for the pod's turn counts, as in the kubelet."""
        with self._recorded(op):
            return await fn()

    def record(self, op: str, seconds: float, raised: bool) -> None:
        """A pod operation :meth:`timed` elsewhere (a worker process): counted, an error if it raised."""
        _gauge, total, errors, duration = self._children[op]
        total.inc()
        if raised:
            errors.inc()
        duration.observe(seconds)

    def _recorded(self, op: str) -> _Recording:
        return _Recording(*self._children[op])


class _Recording:
    """One pod operation in progress: counted, in flight (the gauge), timed, and an error if it raises."""

    __slots__ = ("duration", "errors", "gauge", "start")

    def __init__(self, gauge: Any, total: Any, errors: Any, duration: Any) -> None:
        self.gauge, self.errors, self.duration = gauge, errors, duration
        gauge.inc()
        total.inc()
        self.start = time.monotonic()

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is not None:
            self.errors.inc()
        self.duration.observe(time.monotonic() - self.start)
        self.gauge.dec()
