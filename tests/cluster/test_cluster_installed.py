"""A cluster installed as shipped (issue 17, proof b): two nodes, each with its own containerd.

The simulated cluster (netplugin/frontends/lab/simcluster) gives each node a network namespace on a
shared underlay and a Node object with its pod CIDRs. Each node is then installed the way the
DaemonSet installs it, not with test settings (tests/cluster/shippednodes.py: the ConfigMap's
``netplugin.yaml``, the init container's ``install.sh`` argv, the container's ``command``), with a
private containerd inside its namespace using the CNI dirs the installer filled. Pods created
through CRI get addresses from their own node's pod CIDR, reach the other node's pods by plain
routes, and every call is served by the node's daemon. A Node without pod CIDRs fails ADD with a CNI
error saying so.
"""

from __future__ import annotations

import ipaddress
import json
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from netplugin.frontends.lab.simcluster.apiserver import make_node, make_pod
from netplugin.frontends.lab.simcluster.cluster import SimNode
from tests.cluster.labnodes import cluster_unavailable_reason, plugin_operations
from tests.cluster.shippednodes import ShippedNodes
from tests.frontends.cni.containerd import PortMap, Sandbox, unavailable_reason
from tests.support.gopeers import require
from tests.support.portcheck import Server, ask

pytestmark = [pytest.mark.kernel, pytest.mark.containerd]


class InstalledCluster(ShippedNodes):
    """simcluster's API server; nodes installed as shipped, each with its own containerd."""

    def __init__(self, peers: Path | None = None) -> None:
        """``peers``: containerd 2 from this peer dir; None: Debian's containerd 1.6."""
        super().__init__(peers=peers, bookmark_interval=0.5)


@pytest.fixture(scope="module", params=["1.6", "2"], ids=["containerd1.6", "containerd2"])
def cluster(request: pytest.FixtureRequest) -> Iterator[InstalledCluster]:
    reason = cluster_unavailable_reason() or unavailable_reason()
    if reason or not shutil.which("nsenter"):
        pytest.skip(reason or "nsenter is needed")
    peers = require("containerd", "ctr", "containerd-shim-runc-v2", "cni/loopback") if request.param == "2" else None
    with InstalledCluster(peers) as c:
        for _ in range(2):
            node = c.add_node()
            c.start_containerd(node)
        c.wait_routes(10.0)
        yield c


def _run_pod(cluster: InstalledCluster, node: SimNode, name: str) -> Sandbox:
    assert cluster.api is not None
    cluster.api.apply(make_pod("np-sim", name, node.name, labels={"app": "installed"}))
    return cluster.containerds[node.name].run_pod("np-sim", name, str(uuid.uuid4()))


def _ping(sb: Sandbox, address: str) -> subprocess.CompletedProcess[str]:
    argv = ["ip", "netns", "exec", sb.netns_name, "ping", "-c", "1", "-W", "3", address]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


def test_nodes_are_installed_as_shipped(cluster: InstalledCluster) -> None:
    for node in cluster.nodes.values():
        conflist = json.loads((node.root / "cni-conf" / "10-netplugin.conflist").read_text())
        assert conflist["plugins"] == [
            {
                "type": "netplugin-cni",
                "configFile": str(node.config_path),
                "runDir": str(node.root / "run"),
                "capabilities": {"portMappings": True},
            }
        ]
        health = cluster.health(node)
        # the ConfigMap's chain as shipped: hostPorts work
        assert (health["plugin"], health["plugin_problem"]) == ("netplugin.io/bridge,netplugin.io/hostport", None)
        assert health["node"]["pod_cidrs"] == list(node.pod_cidrs)


def test_pods_get_their_nodes_cidr_and_reach_the_other_node(cluster: InstalledCluster) -> None:
    n1, n2 = cluster.nodes["node-1"], cluster.nodes["node-2"]
    pods = {n.name: [_run_pod(cluster, n, f"web-{n.index}-{i}") for i in range(2)] for n in (n1, n2)}
    for node in (n1, n2):
        cidr = ipaddress.ip_network(node.pod_cidrs[0])
        assert all(ipaddress.ip_address(sb.ip) in cidr for sb in pods[node.name]), (node.name, pods[node.name])
    a, b = pods["node-1"][0], pods["node-2"][1]
    done = _ping(a, b.ip)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _ping(b, a.ip).returncode == 0
    for node in (n1, n2):
        ctd = cluster.containerds[node.name]
        for sb in pods[node.name]:
            ctd.stop_remove(sb.id)
        # Served by the node's daemon: it counted every ADD and DEL (alone, the shim of a cluster
        # node refuses with CNI error 11: use_daemon: always).
        ops = plugin_operations(cluster, node)
        assert ops["set_up_pod"] == 2 and ops["tear_down_pod"] >= 2, ops


def test_a_node_without_pod_cidrs_fails_add_saying_so(cluster: InstalledCluster) -> None:
    import grpc

    assert cluster.api is not None
    n2 = cluster.nodes["node-2"]
    cluster.api.apply(make_node(n2.name, [], list(n2.internal_ips)))
    try:
        deadline = time.monotonic() + 10
        while cluster.health(n2)["node"]["pod_cidrs"]:
            assert time.monotonic() < deadline, "the daemon did not see the Node change"
            time.sleep(0.05)
        with pytest.raises(grpc.RpcError) as info:
            _run_pod(cluster, n2, "no-cidr")
        details = info.value.details()
        assert "'node-2' has no pod CIDRs (spec.podCIDRs)" in details, details
        assert "--allocate-node-cidrs" in details, details
        assert not cluster.containerds[n2.name].list_sandboxes()
        dirs = ["--cni-conf-dir", str(n2.root / "cni-conf"), "--cni-bin-dir", str(n2.root / "cni-bin")]
        doctor = subprocess.run(
            [*cluster._netplugin_argv(n2, "-o", "json", "doctor"), *dirs],
            capture_output=True,
            text=True,
            timeout=120,
            env=cluster.env,
        )
        assert doctor.returncode == 7, doctor.stdout + doctor.stderr
        [check] = [c for c in json.loads(doctor.stdout)["checks"] if c["name"] == "node"]
        assert "node-2 has no pod CIDRs" in check["problem"] and "--allocate-node-cidrs" in check["fix"]
    finally:
        cluster.register(n2)
    cluster.wait_routes(10.0)


def test_without_its_daemon_a_cluster_node_says_try_again(cluster: InstalledCluster) -> None:
    import grpc

    n1 = cluster.nodes["node-1"]
    cluster.stop_daemon(n1)
    try:
        with pytest.raises(grpc.RpcError) as info:
            _run_pod(cluster, n1, "no-daemon")
        details = info.value.details()
        # The compiled shim in cluster mode (the DaemonSet's): error 11, naming the daemon's socket.
        assert "is required (cluster mode)" in details and str(n1.root.resolve()) in details, details
    finally:
        cluster.start_daemon(n1)
    sb = _run_pod(cluster, n1, "daemon-back")
    assert ipaddress.ip_address(sb.ip) in ipaddress.ip_network(n1.pod_cidrs[0])
    cluster.containerds[n1.name].stop_remove(sb.id)


def test_a_hostport_answers_on_its_nodes_address_and_a_second_pod_is_refused(cluster: InstalledCluster) -> None:
    """hostPorts with the ConfigMap as shipped (the native bridge, then netplugin.io/hostport): the
    runtime passes the pod's mappings, they answer on the node's address from the underlay, the
    other node and the node itself, and a second pod asking for the port is refused."""
    import grpc

    assert cluster.api is not None
    n1, n2 = cluster.nodes["node-1"], cluster.nodes["node-2"]
    ctd = cluster.containerds[n1.name]
    cluster.api.apply(make_pod("np-sim", "hp-web", n1.name))
    web = ctd.run_pod("np-sim", "hp-web", str(uuid.uuid4()), ports=[PortMap(31081, 8080), PortMap(31054, 5353, "udp")])
    servers = [Server(web.netns_name, 8080, "web"), Server(web.netns_name, 5353, "web-udp", "udp")]
    try:
        for proto, port, token in (("tcp", 31081, "web"), ("udp", 31054, "web-udp")):
            seen = {
                "the underlay": ask(cluster.underlay, n1.ipv4, port, proto),
                "the other node": ask(n2.netns, n1.ipv4, port, proto),
                "the node itself": ask(n1.netns, n1.ipv4, port, proto),
            }
            assert seen == dict.fromkeys(seen, token), (proto, seen)
        cluster.api.apply(make_pod("np-sim", "hp-rival", n1.name))
        with pytest.raises(grpc.RpcError) as info:
            ctd.run_pod("np-sim", "hp-rival", str(uuid.uuid4()), ports=[PortMap(31081, 80)])
        assert "hostPort 31081/tcp is already held by pod np-sim/hp-web" in str(info.value.details())
        assert ask(cluster.underlay, n1.ipv4, 31081) == "web"  # the rival changed nothing
    finally:
        for s in servers:
            s.close()
        ctd.stop_remove(web.id)
    assert ask(cluster.underlay, n1.ipv4, 31081, timeout=1) == ""


def test_everything_goes_away(cluster: InstalledCluster) -> None:
    tag = cluster.tag
    roots = [Path(c.root) for c in cluster.containerds.values()]
    shims = [pid for c in cluster.containerds.values() for pid in c.shim_pids()]
    cluster.close()
    assert not [pid for pid in shims if Path(f"/proc/{pid}").exists()]
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert tag not in netns
    assert not [r for r in roots if r.exists()]
