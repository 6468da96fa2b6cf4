"""Pod traffic on a node whose iptables FORWARD policy is DROP (netplugin.nodenet.forward), in a node
netns of the test's own with the bridge plugin, the egress masquerade and an underlay host.

    pod a, pod b   10.205.X.0/24 on the node's bridge (br_netfilter on, as init leaves it)
    node eth0      10.205.(X+1).2  ──veth──  underlay host eth0 10.205.(X+1).1
    "a pod on another node": 10.205.(X+2).1 on the underlay host's lo, routed via it (the host
    routes the pod subnet back through the node, as another node does)

Cluster CIDRs: the two pod /24s. With DROP and without the chain, pod -> pod on the node, pod ->
another node and pod -> underlay (through the egress masquerade) all fail; with :meth:`Forward.apply` all answer;
after :meth:`Forward.remove` they fail again and nothing of netplugin's is left in iptables.
"""

from __future__ import annotations

import ipaddress
import shutil
from collections.abc import Callable

import pytest
from nettest import ip_in
from nodebridge import NodeBridge
from portcheck import Server, ask

from netplugin.nodenet.egress import Egress
from netplugin.nodenet.forward import CHAIN, Forward

pytestmark = pytest.mark.kernel


@pytest.fixture
def node(node_factory: Callable[[str], NodeBridge]) -> NodeBridge:
    if not shutil.which("iptables-restore"):
        pytest.skip("iptables is not installed")
    return node_factory("native")


def test_pod_traffic_passes_a_drop_policy_only_through_the_chain(node: NodeBridge) -> None:
    node.init()
    host, host_ip, _ = node.outside()
    other = f"10.205.{(node.third + 2) % 256}"
    ip_in(host, "addr", "add", f"{other}.1/32", "dev", "lo")
    ip_in(host, "route", "add", node.subnet, "via", f"10.205.{(node.third + 1) % 256}.2")
    ip_in(node.node, "route", "add", f"{other}.0/24", "via", host_ip)
    cidrs = [ipaddress.ip_network(node.subnet), ipaddress.ip_network(f"{other}.0/24")]
    netns = f"/run/netns/{node.node}"
    Egress(netns=netns).ensure([str(c) for c in cidrs], [node.subnet])
    node.add_pod("a")
    b = node.add_pod("b")
    assert node.in_node("iptables", "-P", "FORWARD", "DROP").returncode == 0
    servers = [Server(node.pod_ns("b"), 8080, "pod-b"), Server(host, 8080, "underlay")]
    targets = {"pod on this node": b, "pod on another node": f"{other}.1", "underlay": host_ip}
    forward = Forward(netns=netns)
    try:

        def answers() -> dict[str, bool]:
            return {what: ask(node.pod_ns("a"), addr, 8080, timeout=1.5) != "" for what, addr in targets.items()}

        assert answers() == dict.fromkeys(targets, False)
        forward.apply(cidrs)
        forward.apply(cidrs)  # once: the chain is rewritten, the jump not added twice
        assert answers() == dict.fromkeys(targets, True)
        state = {s.version: s for s in forward.check()}[4]
        assert (state.policy, state.jumps, sorted(state.accepted)) == ("DROP", 1, sorted(map(str, cidrs)))
        assert state.problem(cidrs) is None
        forward.remove()
        assert answers() == dict.fromkeys(targets, False)
        assert CHAIN not in node.in_node("iptables", "-S").stdout
        assert "DROP and does not jump" in ({s.version: s for s in forward.check()}[4].problem(cidrs) or "")
        forward.remove()  # idempotent
    finally:
        for s in servers:
            s.close()
