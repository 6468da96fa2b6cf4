"""Issue 21, class 2: Node objects that try to take this node's routing, against the real kernel.

Every claim a compromised kubelet could make in its Node's ``spec.podCIDRs`` (half the internet,
a piece of the underlay, this node's own address, a range around a foreign route, another node's
pods) is refused with a problem naming why, and the kernel's table keeps only the honest routes.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator

import pytest

from netplugin.core.node import NodeInfo
from netplugin.nodenet.routes import RouteTable, node_overlaps
from tests.support.nettest import kernel_gate, underlay_netns

from .test_routes import CLUSTER, ME, ip, peer, routes

pytestmark = pytest.mark.kernel

T1, T2 = "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"


def hostile(name: str, cidr: str, when: str = T2) -> NodeInfo:
    return NodeInfo(name, (cidr,), ("10.206.0.66", "fd6e:7031:1a00::66"), when)


@pytest.fixture
def netns(request: pytest.FixtureRequest) -> Iterator[str]:
    kernel_gate(request)
    with underlay_netns('h', ['10.206.0.11/24', 'fd6e:7031:1a00::11/64'], default_via='10.206.0.1') as name:
        yield name


def table_of(netns: str, cluster: tuple[str, ...]) -> RouteTable:
    return RouteTable("me", netns=netns, cluster_cidrs=cluster)


def others(netns: str) -> str:
    """The table's routes that are not netplugin's: they must come out of every attack unchanged."""
    return "\n".join(
        line for fam in ("-4", "-6") for line in ip(netns, fam, "route", "show").splitlines() if "proto 78" not in line
    )


ATTACKS = [  # (cluster_cidrs, the hostile claim, the kind of refusal)
    (CLUSTER, "128.0.0.0/1", "outside_cluster_cidrs"),
    (CLUSTER, "10.206.0.128/25", "outside_cluster_cidrs"),  # a piece of the underlay
    (CLUSTER, "10.206.0.11/32", "outside_cluster_cidrs"),  # this node's own address
    (CLUSTER, "fd6e:7031:1a00::/80", "outside_cluster_cidrs"),
    # With cluster_cidrs that (wrongly) include the underlay, the routing table still protects it:
    (("10.206.0.0/16",), "10.206.0.128/25", "connected_route"),
    (("10.206.0.0/16",), "10.206.0.0/23", "own_address"),
    (("10.206.0.0/16",), "10.206.0.11/32", "own_address"),
    (("10.206.0.0/16",), "10.206.0.64/26", "connected_route"),
    (("10.206.0.0/16",), "10.206.140.0/22", "foreign_route"),  # contains someone's more specific route
    (("10.206.0.0/16",), "10.206.140.0/26", "foreign_route"),  # exactly someone's route
    (("10.206.0.0/16",), "10.206.129.128/25", "own_pod_cidr"),
    ((), "10.206.150.0/24", "outside_cluster_cidrs"),  # no cluster_cidrs: nothing is routed
]


@pytest.mark.parametrize(("cluster", "claim", "kind"), ATTACKS)
def test_a_hostile_claim_is_refused_and_the_table_kept(
    netns: str, cluster: tuple[str, ...], claim: str, kind: str
) -> None:
    ip(netns, "route", "add", "10.206.140.0/26", "via", "10.206.0.99", "proto", "static")
    before = others(netns)
    table = table_of(netns, cluster)
    try:
        honest = peer(2) if cluster else NodeInfo("n2", ("10.206.150.0/24",), ("10.206.0.12",))
        rep = table.reconcile([ME, honest, hostile("evil", claim)])
        why = {p.cidr: p for p in rep.problems if p.node == "evil"}
        assert why[str(claim)].kind == kind, rep.problems
        assert all(r.node != "evil" for r in rep.routes)
        assert "evil" not in {r.node for r in rep.routes}
        assert others(netns) == before  # the default route, the connected ones, the foreign one
        if cluster == CLUSTER:
            assert routes(netns)["10.206.130.0/24"] == "10.206.0.12"  # the honest node is routed
        if not cluster:
            assert routes(netns) == {} and {p.kind for p in rep.problems} == {"outside_cluster_cidrs"}
    finally:
        table.flush()
        table.close()


def test_overlapping_nodes_the_older_keeps_its_route(netns: str) -> None:
    table = table_of(netns, CLUSTER)
    try:
        honest = NodeInfo("n2", ("10.206.130.0/24",), ("10.206.0.12",), T1)
        wider = NodeInfo("n3", ("10.206.130.0/23",), ("10.206.0.13",), T2)  # partial overlap, newer
        inner = NodeInfo("n4", ("10.206.130.128/25",), ("10.206.0.14",), T2)  # inside, newer
        rep = table.reconcile([ME, honest, wider, inner])
        assert routes(netns) == {"10.206.130.0/24": "10.206.0.12"}
        why = {p.node: p.reason for p in rep.problems}
        assert why["n3"] == "overlaps pod CIDR 10.206.130.0/24 of node n2 (an older Node)"
        assert "of node n2 (an older Node)" in why["n4"] or "of node n3" in why["n4"]
        # Neither known to be older (node files carry no creation time): both are refused.
        rep = table.reconcile(
            [
                ME,
                NodeInfo("n2", ("10.206.130.0/24",), ("10.206.0.12",)),
                NodeInfo("n3", ("10.206.130.0/23",), ("10.206.0.13",)),
            ]
        )
        assert routes(netns) == {}
        assert {p.node for p in rep.problems} == {"n2", "n3"}
        assert all("both refused" in p.reason for p in rep.problems)
    finally:
        table.flush()
        table.close()


def test_node_overlaps_scale() -> None:
    """5,000 disjoint claims and one hostile /17 over all of them: only the hostile one is refused."""
    claims = [
        (NodeInfo(f"n{i}", (), (), T1), ipaddress.ip_network(f"fd6e:7031:1a00:{0x8000 + i:x}::/64"))
        for i in range(5000)
    ]
    big = ipaddress.ip_network("fd6e:7031:1a00:8000::/49")
    refused = node_overlaps([*claims, (NodeInfo("evil", (), (), T2), big)])
    assert list(refused) == [("evil", str(big))]
