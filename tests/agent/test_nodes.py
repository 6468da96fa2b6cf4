"""The daemon's NodeKeeper: when it reconciles routes and egress, and what it reports.

The seams are a FakeHost (the nodes) and recording stand-ins for the route table and the
egress table; the kernel side of both is tested in tests/nodenet and tests/cluster.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterable
from typing import Any

import pytest

from netplugin.agent.nodekeeper import NodeKeeper
from netplugin.core.config import Config
from netplugin.core.errors import HostError
from netplugin.core.node import NodeInfo
from netplugin.frontends.daemon.keepermetrics import NodeCollector
from netplugin.frontends.daemon.metrics import SERIES
from netplugin.nodenet.routes import Route, RouteProblem, RouteReport
from tests.support.fakehost import FakeHost
from tests.support.waits import WITHIN, wait_for

ME = NodeInfo("fake-node", ("10.206.129.0/24",), ("10.206.0.11",))
PEER = NodeInfo("peer", ("10.206.130.0/24",), ("10.206.0.12",))


class Routes:
    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.fresh: list[bool] = []
        self.closed = False

    def reconcile(self, nodes: Iterable[NodeInfo], *, fresh: bool = True) -> RouteReport:
        names = [n.name for n in nodes]
        self.calls.append(names)
        self.fresh.append(fresh)
        report = RouteReport()
        if "peer" in names:
            report.routes.append(Route("10.206.130.0/24", "10.206.0.12", 2, "peer"))
        if "far" in names:
            report.problems.append(RouteProblem("far", "10.206.140.0/24", "not on a directly connected network"))
        return report

    def close(self) -> None:
        self.closed = True


class Egress:
    table = "netplugin"

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[str, ...]]] = []

    def ensure(self, cluster: Any, pods: Any) -> str:
        self.calls.append(("ensure", tuple(pods)))
        return f"rules {tuple(pods)}"

    def remove(self) -> None:
        self.calls.append(("remove", ()))


class Forward:
    """The FORWARD accept chain at its seam: records what it was asked to accept."""

    def __init__(self) -> None:
        self.applied: list[tuple[str, ...]] = []
        self.removed = 0

    def apply(self, cidrs: Any) -> None:
        self.applied.append(tuple(map(str, cidrs)))

    def remove(self) -> None:
        self.removed += 1


class DownHost(FakeHost):
    def list_nodes(self) -> list[NodeInfo]:
        raise HostError("cannot list nodes from http://api: HTTP 503")


def keeper(host: FakeHost, **cfg: Any) -> tuple[NodeKeeper, Routes, Egress]:
    routes, egress, forward = Routes(), Egress(), Forward()
    k = NodeKeeper(
        Config(cluster_cidrs=("10.206.128.0/17",), **cfg),
        host,
        routes=routes,  # type: ignore[arg-type]
        egress=egress,  # type: ignore[arg-type]
        forward=forward,  # type: ignore[arg-type]
    )
    return k, routes, egress


def test_sync_reconciles_and_reports() -> None:
    far = NodeInfo("far", ("10.206.140.0/24",), ("10.206.5.5",))
    k, routes, egress = keeper(FakeHost(nodes=[ME, PEER, far]))
    assert k.sync()
    assert routes.calls == [["fake-node", "far", "peer"]]  # sorted by name
    assert egress.calls == [("ensure", ("10.206.129.0/24",))]
    assert k.forward.applied == [("10.206.128.0/17", "10.206.129.0/24")]  # type: ignore[union-attr]
    st = k.status()
    assert st["name"] == "fake-node" and st["pod_cidrs"] == ["10.206.129.0/24"] and st["nodes"] == 3
    assert st["routes"] == [{"dst": "10.206.130.0/24", "via": "10.206.0.12", "node": "peer"}]
    why = "not on a directly connected network"
    assert st["problems"] == [{"kind": "next_hop", "node": "far", "cidr": "10.206.140.0/24", "reason": why}]
    assert st["egress"] == {"table": "netplugin", "applied": True} and st["error"] is None
    assert not k.sync(force=False)  # nothing changed: nothing done
    assert len(routes.calls) == 1


def test_no_cluster_described_leaves_the_routing_table_alone() -> None:
    k, routes, egress = keeper(FakeHost())
    assert k.sync()
    assert routes.calls == []
    assert egress.calls == [("ensure", ())]  # egress needs only the cluster CIDRs


def test_leaving_the_cluster_removes_routes_and_egress_until_back() -> None:
    host = FakeHost(nodes=[ME, PEER])
    k, routes, egress = keeper(host)
    k.sync()
    del host.nodes["fake-node"]
    k.sync()
    assert routes.calls[-1] == [] and egress.calls[-1] == ("remove", ())
    assert k.forward is not None and k.forward.removed == 1  # type: ignore[attr-defined]  # its FORWARD accepts too
    assert k.status()["departed"] is True
    k.sync()
    assert routes.calls[-1] == [] and egress.calls[-1] == ("remove", ())  # stays removed
    host.nodes["fake-node"] = ME
    k.sync()
    assert routes.calls[-1] == ["fake-node", "peer"] and egress.calls[-1][0] == "ensure"
    assert k.status()["departed"] is False


def test_never_a_member_is_not_leaving() -> None:
    k, routes, _ = keeper(FakeHost(nodes=[PEER]))  # this node not registered (yet)
    k.sync()
    assert routes.calls == [["peer"]] and not k.departed


def test_host_errors_leave_routes_as_they_are(caplog: pytest.LogCaptureFixture) -> None:
    k, routes, egress = keeper(DownHost(nodes=[ME]))
    assert not k.sync()
    assert not k.sync()
    assert routes.calls == [] and egress.calls == []
    assert "HTTP 503" in (k.status()["error"] or "")
    assert sum("cannot read the cluster's nodes" in r.message for r in caplog.records) == 1  # said once


def test_routes_disabled() -> None:
    k = NodeKeeper(Config(node_routes=False), FakeHost(nodes=[ME, PEER]))
    assert k.routes is None and k.egress is None
    assert k.sync() and k.status()["routes_enabled"] is False


class Cache:
    def __init__(self) -> None:
        self.nodes = type("I", (), {"synced": threading.Event()})()

    def status(self) -> dict[str, Any]:
        keys = ("lists", "watches", "relists", "failures", "events", "bookmarks")
        return {"nodes": dict.fromkeys(keys, 1), "pods": dict.fromkeys(keys, 2)}


class WatchingHost(FakeHost):
    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.cache: Cache | None = None
        self.kick: Any = None
        self.requests = {("get", "pods"): 3}

    def start_watching(self, on_change: Any, *, on_pod_deleted: Any = None) -> Cache:
        self.cache, self.kick = Cache(), on_change
        return self.cache

    def stop_watching(self) -> None:
        self.cache = None

    def node_problems(self) -> list[tuple[str, str]]:
        return []


def test_watching_host_waits_for_its_first_list_then_follows_kicks() -> None:
    host = WatchingHost(nodes=[ME, PEER])
    k, routes, _ = keeper(host, node_resync=60.0)
    k.start()
    try:
        time.sleep(0.3)
        assert routes.calls == []  # not synced: an empty view must never remove routes
        assert host.cache is not None
        host.cache.nodes.synced.set()
        wait_for(lambda: routes.calls, "the first pass once synced", WITHIN)
        assert routes.calls == [["fake-node", "peer"]]
        del host.nodes["peer"]
        host.kick()
        wait_for(lambda: len(routes.calls) >= 2, "the pass after the kick", WITHIN)
        assert routes.calls[-1] == ["fake-node"]
        assert routes.fresh == [True, False]  # a Node event works from the last pass's view
    finally:
        k.stop()
    assert routes.closed and host.cache is None


def test_metrics() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    host = WatchingHost(nodes=[ME, PEER])
    k, _, _ = keeper(host)
    k.start()
    try:
        registry = CollectorRegistry()
        registry.register(NodeCollector(k))
        assert host.cache is not None
        host.cache.nodes.synced.set()
        k.sync()
        text = generate_latest(registry).decode()
    finally:
        k.stop()
    assert 'netplugin_node_routes{family="4"} 1.0' in text
    assert 'netplugin_node_routes{family="6"} 0.0' in text
    assert "netplugin_node_route_problems 0.0" in text
    assert "netplugin_nodes 2.0" in text
    assert 'netplugin_kube_requests_total{resource="pods",verb="get"} 3.0' in text
    assert 'netplugin_kube_watch_events_total{kind="relists",resource="nodes"} 1.0' in text
    # The keeper's families, the host: kube ones included, are rows of the daemon's series table.
    families = ("netplugin_node", "netplugin_kube", "netplugin_repairs")
    keeper_rows = {x.name: x.kind for x in SERIES if x.name.startswith(families)}
    assert dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M)) == keeper_rows
