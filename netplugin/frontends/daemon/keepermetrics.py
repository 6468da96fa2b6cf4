"""The keepers' Prometheus metrics: the node keeper's routes, problems and repairs, the host's API
use, and the gc keeper's runs.

The keepers (:mod:`netplugin.agent`) keep plain counters and know nothing of Prometheus; the
collectors here read them at each scrape of the daemon's registry (:func:`register_keepers`). Every
family is a row of :data:`.metrics.SERIES`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from netplugin.agent.problems import NODE_PROBLEM_KINDS
from netplugin.frontends.daemon import metrics
from netplugin.frontends.daemon.metrics import family

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import Metric

    from netplugin.agent.gckeeper import GcCounts
    from netplugin.agent.nodekeeper import NodeCounts

__all__ = ["GcCollector", "KeptGc", "KeptNodes", "NodeCollector", "register_keepers"]


class KeptNodes(Protocol):
    """What the collector reads of a :class:`~netplugin.agent.nodekeeper.NodeKeeper`."""

    def counts(self) -> NodeCounts: ...


class KeptGc(Protocol):
    """What the collector reads of a :class:`~netplugin.agent.gckeeper.GcKeeper`."""

    def counts(self) -> GcCounts: ...


def register_keepers(registry: CollectorRegistry, gc: KeptGc, nodes: KeptNodes) -> None:
    """Export the keepers' metrics on the daemon's registry (read at each scrape)."""
    registry.register(GcCollector(gc))
    registry.register(NodeCollector(nodes))


class GcCollector:
    """Prometheus collector over the gc keeper's counts: its runs and what they freed."""

    def __init__(self, keeper: KeptGc) -> None:
        self.keeper = keeper

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        counts = self.keeper.counts()
        runs = family(metrics.GC_RUNS)
        for (trigger, outcome), n in counts.runs.items():
            runs.add_metric([trigger, outcome], n)
        yield runs
        freed = family(metrics.GC_FREED)
        for kind, n in counts.freed.items():
            freed.add_metric([kind.value], n)
        yield freed


class NodeCollector:
    """Prometheus collector over the keeper's state, the host's request counts and its watches."""

    def __init__(self, keeper: KeptNodes) -> None:
        self.keeper = keeper

    def describe(self) -> list[Metric]:
        return []  # collected lazily; describing nothing keeps registration cheap

    def collect(self) -> Iterator[Metric]:
        counts = self.keeper.counts()
        routes = family(metrics.NODE_ROUTES)
        for fam in ("4", "6"):
            routes.add_metric([fam], sum(1 for dst in counts.routes if (":" in dst) == (fam == "6")))
        yield routes
        yield family(metrics.NODE_ROUTE_PROBLEMS, value=counts.route_problems)
        by_kind = family(metrics.NODE_PROBLEMS)
        kinds = Counter(p.kind for p in counts.problems)
        for kind in NODE_PROBLEM_KINDS:
            by_kind.add_metric([kind], kinds.get(kind, 0))
        yield by_kind
        yield family(metrics.NODES, value=counts.nodes)
        yield family(metrics.NODE_SYNCS, value=counts.syncs)
        repairs = family(metrics.REPAIRS)
        for kind, n in counts.repairs.items():
            repairs.add_metric([kind.value], n)
        yield repairs
        if counts.kube_requests is not None:
            yield from _cluster_metrics(counts)


def _cluster_metrics(counts: NodeCounts) -> Iterator[Metric]:
    """The metrics of a host that watches the cluster: its API requests and its list+watch caches."""
    req = family(metrics.KUBE_REQUESTS)
    for (verb, resource), n in sorted((counts.kube_requests or {}).items()):
        req.add_metric([verb, resource], n)
    yield req
    if counts.watches is not None:
        watch = family(metrics.KUBE_WATCH_EVENTS)
        relists = family(metrics.KUBE_RELISTS)
        for resource, st in counts.watches.items():
            for kind in ("lists", "watches", "relists", "failures", "events", "bookmarks"):
                watch.add_metric([resource, kind], st[kind])
            relists.add_metric([resource], st["relists"])
        yield watch
        yield relists
