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

from netplugin.nodenet.egress import Egress
from netplugin.nodenet.forward import CHAIN, Forward
from tests.support.nettest import ip_in
from tests.support.nodebridge import NodeBridge
from tests.support.portcheck import Server, ask

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


#: a NetworkPolicy agent's FORWARD chain (kube-router's name), denying pod a -> pod b on 8080
AGENT_CHAIN = "KUBE-ROUTER-FORWARD"


def _forward_targets(node: NodeBridge) -> list[str]:
    """The chains FORWARD jumps to, in order."""
    rules = node.in_node("iptables", "-w", "-S", "FORWARD").stdout.splitlines()
    return [r.split(" -j ", 1)[1].split()[0] for r in rules if r.startswith("-A FORWARD ") and " -j " in r]


@pytest.mark.parametrize("agent_first", [True, False], ids=["agent-first", "netplugin-first"])
def test_a_policy_agents_forward_chain_judges_before_netplugins_accepts(node: NodeBridge, agent_first: bool) -> None:
    node.init()
    a, b = node.add_pod("a"), node.add_pod("b")
    c = node.add_pod("c")
    assert node.in_node("iptables", "-w", "-P", "FORWARD", "DROP").returncode == 0
    forward = Forward(netns=f"/run/netns/{node.node}")
    cidrs = [ipaddress.ip_network(node.subnet)]

    def add_agent() -> None:
        for argv in (["-N", AGENT_CHAIN], ["-A", AGENT_CHAIN, "-s", a, "-d", b, "-p", "tcp", "--dport", "8080",
                     "-j", "DROP"], ["-A", "FORWARD", "-j", AGENT_CHAIN]):  # fmt: skip
            assert node.in_node("iptables", "-w", *argv).returncode == 0

    if agent_first:
        add_agent()
        forward.apply(cidrs)  # netplugin starts on a node where the agent runs
    else:
        forward.apply(cidrs)
        add_agent()  # the agent appends its jump after netplugin's: the next pass moves netplugin's
        assert _forward_targets(node) == [CHAIN, AGENT_CHAIN]
        forward.apply(cidrs)
    agent_rules = node.in_node("iptables", "-w", "-S", AGENT_CHAIN).stdout
    assert _forward_targets(node) == [AGENT_CHAIN, CHAIN]
    # netplugin's jump deleted (a flush of its own), then put back by its next pass: after the agent's again
    assert node.in_node("iptables", "-w", "-D", "FORWARD", "-m", "comment", "--comment", "netplugin pod forwarding",
                        "-j", CHAIN).returncode == 0  # fmt: skip
    forward.apply(cidrs)
    forward.apply(cidrs)
    assert _forward_targets(node) == [AGENT_CHAIN, CHAIN]
    assert node.in_node("iptables", "-w", "-S", AGENT_CHAIN).stdout == agent_rules  # the agent's rules untouched
    servers = [Server(node.pod_ns("b"), 8080, "pod-b"), Server(node.pod_ns("c"), 8080, "pod-c")]
    try:
        # bridged pod -> pod passes FORWARD (br_netfilter): the agent's DROP decides before netplugin's ACCEPT
        assert ask(node.pod_ns("a"), b, 8080, timeout=1.5) == ""
        assert ask(node.pod_ns("a"), c, 8080, timeout=1.5) != ""
        assert ask(node.pod_ns("c"), b, 8080, timeout=1.5) != ""
    finally:
        for s in servers:
            s.close()
        forward.remove()
    assert _forward_targets(node) == [AGENT_CHAIN]  # the uninstall takes only its own
