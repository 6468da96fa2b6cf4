"""Routes to other nodes (host-gw) in a private network namespace: the real kernel, pyroute2."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from netplugin.core.node import NodeInfo
from netplugin.nodenet.routes import RTPROT_NETPLUGIN, RouteProblem, RouteTable
from tests.support.nettest import ip_in as ip
from tests.support.nettest import kernel_gate, underlay_netns

pytestmark = pytest.mark.kernel

# Inside a namespace of our own: 10.206.0.0/24 is "the underlay", 10.206.128.0/17 the pod CIDRs.
CLUSTER = ("10.206.128.0/17", "fd6e:7031:1a00:8000::/49")
ME = NodeInfo("me", ("10.206.129.0/24", "fd6e:7031:1a00:8001::/64"), ("10.206.0.11", "fd6e:7031:1a00::11"))


def peer(i: int, **kw: tuple[str, ...]) -> NodeInfo:
    return NodeInfo(
        f"n{i}",
        kw.get("cidrs", (f"10.206.{128 + i}.0/24", f"fd6e:7031:1a00:{0x8000 + i:x}::/64")),
        kw.get("ips", (f"10.206.0.{10 + i}", f"fd6e:7031:1a00::{0x10 + i:x}")),
    )



def routes(ns: str, proto: str = str(RTPROT_NETPLUGIN)) -> dict[str, str]:
    out = {}
    for fam in ("-4", "-6"):
        for r in json.loads(ip(ns, "-j", fam, "route", "show", "proto", proto) or "[]"):
            out[r["dst"]] = r.get("gateway", "")
    return out


@pytest.fixture
def netns(request: pytest.FixtureRequest) -> Iterator[str]:
    kernel_gate(request)
    with underlay_netns('r', ['10.206.0.11/24', 'fd6e:7031:1a00::11/64'], default_via='10.206.0.1') as name:
        yield name


@pytest.fixture
def table(netns: str) -> Iterator[RouteTable]:
    t = RouteTable("me", netns=netns, cluster_cidrs=CLUSTER)
    yield t
    t.close()


def test_routes_follow_the_nodes(netns: str, table: RouteTable) -> None:
    rep = table.reconcile([ME, peer(2), peer(3)])
    assert sorted(rep.added) == [
        "10.206.130.0/24",
        "10.206.131.0/24",
        "fd6e:7031:1a00:8002::/64",
        "fd6e:7031:1a00:8003::/64",
    ]
    assert rep.problems == []
    assert routes(netns) == {
        "10.206.130.0/24": "10.206.0.12",
        "10.206.131.0/24": "10.206.0.13",
        "fd6e:7031:1a00:8002::/64": "fd6e:7031:1a00::12",
        "fd6e:7031:1a00:8003::/64": "fd6e:7031:1a00::13",
    }
    again = table.reconcile([ME, peer(2), peer(3)])
    assert not again.touched and len(again.routes) == 4  # idempotent
    moved = NodeInfo("n3", peer(3).pod_cidrs, ("10.206.0.23", "fd6e:7031:1a00::23"))
    rep = table.reconcile([ME, peer(2), moved])
    assert sorted(rep.changed) == ["10.206.131.0/24", "fd6e:7031:1a00:8003::/64"]
    assert routes(netns)["10.206.131.0/24"] == "10.206.0.23"
    rep = table.reconcile([ME, moved])
    assert sorted(rep.removed) == ["10.206.130.0/24", "fd6e:7031:1a00:8002::/64"]
    assert set(routes(netns)) == {"10.206.131.0/24", "fd6e:7031:1a00:8003::/64"}


def test_a_route_deleted_behind_our_back_comes_back(netns: str, table: RouteTable) -> None:
    table.reconcile([ME, peer(2)])
    ip(netns, "route", "del", "10.206.130.0/24")
    # A pass from the remembered view (a Node event) does not look; the periodic fresh pass does.
    assert not table.reconcile([ME, peer(2)], fresh=False).touched
    assert table.reconcile([ME, peer(2)]).added == ["10.206.130.0/24"]


def test_event_passes_from_the_remembered_view_follow_the_nodes(netns: str, table: RouteTable) -> None:
    table.reconcile([ME, peer(2)])
    rep = table.reconcile([ME, peer(2), peer(3)], fresh=False)
    assert sorted(rep.added) == ["10.206.131.0/24", "fd6e:7031:1a00:8003::/64"] and len(rep.routes) == 4
    rep = table.reconcile([ME, peer(3)], fresh=False)
    assert sorted(rep.removed) == ["10.206.130.0/24", "fd6e:7031:1a00:8002::/64"]
    assert set(routes(netns)) == {"10.206.131.0/24", "fd6e:7031:1a00:8003::/64"}
    assert not table.reconcile([ME, peer(3)]).touched  # the remembered view was right


def test_unroutable_nodes_are_reported_not_routed(netns: str, table: RouteTable) -> None:
    far = peer(4, ips=("10.206.5.5",))  # behind the default gateway: another L2 segment
    v4only = peer(5, ips=("10.206.0.15",))
    overlap = peer(6, cidrs=("10.206.129.128/25",))
    twin = NodeInfo("n7", ("10.206.131.0/24",), ("10.206.0.17",), "2026-01-02T00:00:00Z")
    unreachable = peer(8, ips=("10.206.0.18", "fd6e:dead::1"))
    impostor = peer(9, cidrs=("10.206.137.0/24",), ips=("10.206.0.11",))  # claims our own address
    older = NodeInfo("n3", ("10.206.131.0/24",), ("10.206.0.13",), "2026-01-01T00:00:00Z")
    rep = table.reconcile([ME, peer(2), older, far, v4only, overlap, twin, unreachable, impostor])
    why = {(p.node, p.cidr): p.reason for p in rep.problems}
    assert "not on a directly connected network" in why[("n4", "10.206.132.0/24")]
    assert "via 10.206.0.1" in why[("n4", "10.206.132.0/24")]
    assert why[("n5", "fd6e:7031:1a00:8005::/64")] == "the node has no IPv6 InternalIP"
    assert why[("n6", "10.206.129.128/25")] == "overlaps this node's own pod CIDR"
    assert why[("n7", "10.206.131.0/24")] == "overlaps pod CIDR 10.206.131.0/24 of node n3 (an older Node)"
    assert "unreachable" in why[("n8", "fd6e:7031:1a00:8008::/64")]
    assert why[("n9", "10.206.137.0/24")] == "InternalIP 10.206.0.11 is an address of this node"
    assert routes(netns) == {
        "10.206.130.0/24": "10.206.0.12",
        "fd6e:7031:1a00:8002::/64": "fd6e:7031:1a00::12",
        "10.206.131.0/24": "10.206.0.13",
        "10.206.133.0/24": "10.206.0.15",
        "10.206.136.0/24": "10.206.0.18",
    }
    assert str(RouteProblem("n4", "10.206.132.0/24", "x")) == "node n4 pod CIDR 10.206.132.0/24: x"


def test_routes_of_others_are_never_touched(netns: str, table: RouteTable) -> None:
    ip(netns, "route", "add", "10.206.130.0/24", "via", "10.206.0.99", "proto", "static")
    ip(netns, "route", "add", "10.206.200.0/24", "via", "10.206.0.98")
    rep = table.reconcile([ME, peer(2), peer(3)])
    assert [p.reason for p in rep.problems] == ["a route to it that netplugin did not make exists"]
    assert routes(netns, "static") == {"10.206.130.0/24": "10.206.0.99"}
    assert table.flush() == sorted(["10.206.131.0/24", "fd6e:7031:1a00:8002::/64", "fd6e:7031:1a00:8003::/64"])
    assert routes(netns) == {}
    assert routes(netns, "static") == {"10.206.130.0/24": "10.206.0.99"}
    assert "10.206.200.0/24 via 10.206.0.98" in ip(netns, "route", "show")
