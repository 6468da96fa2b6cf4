"""Three nodes on one machine: the done-when of issue 11, end to end.

Each node is a network namespace on a shared underlay bridge (in a namespace of its own) and
runs its own ``netplugin serve`` with ``host: kube`` against the simulated API server; pods
are set up through each node's CLI (which hands them to its daemon) with the bash bridge
plugin taking its subnets from the Node (``SUBNET=node``, dual stack). Nothing here touches the
machine's own namespace. The tests run in file order on one cluster; the last one tears it
all down and checks that nothing is left.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Iterator

import pytest

from netplugin.frontends.lab.simcluster.apiserver import make_node
from netplugin.frontends.lab.simcluster.cluster import OUTSIDE_V4, OUTSIDE_V6, SimCluster, SimPod, node_addresses
from netplugin.frontends.lab.simcluster.nsexec import ip_json, netns_exists
from tests.nettest import kernel_unavailable_reason

pytestmark = pytest.mark.kernel

PORT = 8080


@pytest.fixture(scope="module")
def cluster() -> Iterator[SimCluster]:
    reason = kernel_unavailable_reason() or (None if shutil.which("nft") else "nft (nftables) is not installed")
    if reason:
        pytest.skip(reason)
    with SimCluster(bookmark_interval=0.5) as c:
        for _ in range(3):
            c.add_node()
        c.wait_routes(10.0)
        yield c


@pytest.fixture(scope="module")
def pods(cluster: SimCluster) -> list[SimPod]:
    nodes = list(cluster.nodes.values())
    made = [cluster.create_pod(n, f"web-{n.index}") for n in nodes]
    made.append(cluster.create_pod(nodes[0], "web-1b"))  # a second pod on node-1: same-node traffic too
    return made


def test_pods_get_one_address_per_family_from_their_node(cluster: SimCluster, pods: list[SimPod]) -> None:
    import ipaddress

    for pod in pods:
        v4, v6 = pod.ip(4), pod.ip(6)
        assert v4 is not None and v6 is not None, pod.ips
        cidr4, cidr6 = (ipaddress.ip_network(c) for c in pod.node.pod_cidrs)
        assert ipaddress.ip_address(v4) in cidr4 and ipaddress.ip_address(v6) in cidr6


def test_every_pod_reaches_every_other_pod_over_ipv4_and_ipv6(cluster: SimCluster, pods: list[SimPod]) -> None:
    failures = []
    with cluster.listeners([p.infra_id for p in pods], PORT, lambda ns: ns):
        for src in pods:
            for dst in pods:
                if src is dst:
                    continue
                for version in (4, 6):
                    address = dst.ip(version)
                    assert address is not None
                    answer = cluster.connect(src.infra_id, address, PORT)
                    # The server names itself and the source it saw: the pod's own address (no NAT inside).
                    if answer != f"{dst.infra_id} {src.ip(version)}":
                        failures.append(f"{src.name}@{src.node.name} -> {dst.name} {address}: {answer!r}")
    assert failures == []


def test_egress_is_masqueraded_to_the_node_address(cluster: SimCluster, pods: list[SimPod]) -> None:
    with cluster.listeners([cluster.underlay], PORT + 1, lambda ns: "outside"):
        for pod in pods:
            for outside, node_ip in ((OUTSIDE_V4, pod.node.ipv4), (OUTSIDE_V6, pod.node.ipv6)):
                assert cluster.connect(pod.infra_id, outside, PORT + 1) == f"outside {node_ip}"


def test_pod_lookups_come_from_the_daemons_cache(cluster: SimCluster, pods: list[SimPod]) -> None:
    assert cluster.api is not None
    gets = cluster.api.count("get")
    lists = cluster.api.count("list")
    extra = [cluster.create_pod(n, f"cached-{n.index}") for n in cluster.nodes.values()]
    assert (cluster.api.count("get"), cluster.api.count("list")) == (gets, lists)  # zero requests per pod
    for pod in extra:
        cluster.delete_pod(pod)


def _added_node(i: int, ips: tuple[str, ...] | None = None) -> dict[str, object]:
    cidrs = [f"10.206.{128 + i}.0/24", f"fd6e:7031:1a00:{0x8000 + i:x}::/64"]
    return make_node(f"node-{i}", cidrs, list(ips or node_addresses(i)))


def test_node_added_changed_deleted_reach_every_node_within_2s(cluster: SimCluster) -> None:
    assert cluster.api is not None
    for change in ("add", "change", "delete"):
        start = time.monotonic()
        if change == "add":
            cluster.api.apply(_added_node(9))
        elif change == "change":
            cluster.api.apply(_added_node(9, ("10.206.0.99", "fd6e:7031:1a00::99")))
        else:
            cluster.api.delete("Node", "node-9")
        cluster.wait_routes(2.0)
        assert time.monotonic() - start < 2.0, change
    for node in cluster.nodes.values():
        assert "10.206.137.0/24" not in cluster.routes(node)


def test_broken_watches_and_410_recover_without_losing_events(cluster: SimCluster) -> None:
    api = cluster.api
    assert api is not None
    api.apply(_added_node(10))
    cluster.wait_routes(2.0)
    # The streams drop; meanwhile one node leaves and another joins; history is compacted, and
    # the first re-watch is answered 410: the daemons must relist and see both changes.
    api.break_watches()
    api.delete("Node", "node-10")
    api.apply(_added_node(11))
    api.expire_history()
    api.answer_next_watches_410(len(cluster.nodes))
    cluster.wait_routes(5.0)
    for node in cluster.nodes.values():
        have = cluster.routes(node)
        assert "10.206.139.0/24" in have and "10.206.138.0/24" not in have
        watch = cluster.health(node)["node"]["watch"]["nodes"]
        assert watch["failures"] + watch["relists"] >= 1
    api.break_watches()  # a plain drop: resumed from the last revision, no relist needed
    api.delete("Node", "node-11")
    cluster.wait_routes(5.0)


def test_nodes_on_another_segment_are_reported(cluster: SimCluster) -> None:
    assert cluster.api is not None
    cluster.api.apply(make_node("far", ["10.206.250.0/24"], ["10.206.2.5"]))  # reached only via a gateway
    try:
        for node in cluster.nodes.values():
            deadline = time.monotonic() + 5
            while True:
                problems = cluster.health(node)["node"]["problems"]
                if problems or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert [(p["node"], p["cidr"]) for p in problems] == [("far", "10.206.250.0/24")]
            assert "not on a directly connected network" in problems[0]["reason"]
            assert "10.206.250.0/24" not in cluster.routes(node)
            assert "no route to node far pod CIDR 10.206.250.0/24" in cluster.daemon_log(node)
            shown = cluster.netplugin(node, "nodes")  # the CLI shows the daemon's view
            assert shown["name"] == node.name and [p["node"] for p in shown["problems"]] == ["far"]
            metrics = _scrape(cluster, node)
            assert "netplugin_node_route_problems 1.0" in metrics
            assert 'netplugin_node_routes{family="6"} 2.0' in metrics
    finally:
        cluster.api.delete("Node", "far")


def _scrape(cluster: SimCluster, node: object) -> str:
    health = cluster.health(node)  # type: ignore[arg-type]
    url = f"http://{health['metrics_address']}/metrics"
    code = f"import urllib.request; print(urllib.request.urlopen({url!r}).read().decode())"
    done = cluster.exec_in(node.netns, [sys.executable, "-c", code])  # type: ignore[attr-defined]
    assert done.returncode == 0, done.stderr
    return done.stdout.decode()


def test_teardown_of_everything_leaves_nothing(cluster: SimCluster, pods: list[SimPod]) -> None:
    assert cluster.api is not None
    for pod in list(cluster.pods.values()):
        cluster.delete_pod(pod)
    names = [n.name for n in cluster.nodes.values()]
    for name in names:
        cluster.api.delete("Node", name)  # every node leaves: each removes its routes and egress table
    deadline = time.monotonic() + 5
    for node in cluster.nodes.values():
        while (cluster.routes(node) or _nft_tables(cluster, node)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert cluster.routes(node) == {}
        assert _nft_tables(cluster, node) == []
        veths = [link["ifname"] for link in ip_json("-n", node.netns, "link", "show", "type", "veth")]
        assert veths == ["eth0"]  # the underlay link only: no pod veth left
        ipam = node.root / "state" / "bridge"
        held = sorted(p.name for p in ipam.rglob("*") if p.is_file() and p.parent.name in ("ips", "pods"))
        assert held == [], f"addresses still allocated on {node.name}"
        listing = cluster.netplugin(node, "pods")
        assert listing["pods"] == [] and listing["corrupt"] == []  # no pod record
    tag = cluster.tag
    cluster.close()
    assert [ns for ns in _all_netns() if tag in ns] == []


def _nft_tables(cluster: SimCluster, node: object) -> list[str]:
    done = cluster.exec_in(node.netns, ["nft", "-j", "list", "tables"])  # type: ignore[attr-defined]
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout or b"{}")
    return [t["table"]["name"] for t in doc.get("nftables", []) if "table" in t]


def _all_netns() -> list[str]:
    return [ns for ns in os.listdir("/var/run/netns") if netns_exists(ns)] if os.path.isdir("/var/run/netns") else []
