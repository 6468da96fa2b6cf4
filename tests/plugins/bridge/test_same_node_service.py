"""A Service whose backend is on the same bridge, as kube-proxy makes it, with both bridge plugins.

kube-proxy DNATs the Service address in the node's netfilter (and marks for masquerade the
traffic of an endpoint to itself). The reply of a backend on the same bridge as its client is
bridged, never un-DNATed, unless ``init`` turned on ``bridge-nf-call-iptables``: with the setting
on, pod A reaches pod B through the Service; with the setting off on a node where the sysctl is
off, it does not. B reaching itself through the Service (hairpin) answers either way: kube-proxy
masquerades an endpoint's traffic to itself, so the reply is addressed to the node and routed
back through its conntrack (measured; what breaks without the masquerade is the pod's own kernel
dropping a packet from its own address). In a node netns of the test's own (the sysctls and
iptables rules are per netns).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from netplugin.plugins.bridge.sysctls import BRIDGE_NF_CALL
from tests.support.nodebridge import KINDS, NodeBridge
from tests.support.portcheck import Server, ask

pytestmark = pytest.mark.kernel

SERVICE, SERVICE_PORT, TARGET_PORT = "10.96.0.10", 80, 8080


def kube_proxy_service(node: NodeBridge, backend: str) -> None:
    """The rules kube-proxy's iptables mode writes for a ClusterIP Service with one endpoint."""
    rules = [
        ["-N", "KUBE-SVC-TEST"],
        ["-A", "PREROUTING", "-d", SERVICE, "-p", "tcp", "--dport", str(SERVICE_PORT), "-j", "KUBE-SVC-TEST"],
        ["-A", "KUBE-SVC-TEST", "-s", backend, "-j", "MARK", "--set-xmark", "0x4000/0x4000"],
        ["-A", "KUBE-SVC-TEST", "-p", "tcp", "-j", "DNAT", "--to-destination", f"{backend}:{TARGET_PORT}"],
        ["-A", "POSTROUTING", "-m", "mark", "--mark", "0x4000/0x4000", "-j", "MASQUERADE"],
    ]
    for rule in rules:
        r = node.in_node("iptables", "-t", "nat", *rule)
        assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("setting", [True, False], ids=["br-netfilter-on", "br-netfilter-off"])
def test_a_service_answers_from_the_same_bridge_only_with_bridge_netfilter(
    node_factory: Callable[[str], NodeBridge], kind: str, setting: bool
) -> None:
    node = node_factory(kind)
    node.sysctl(BRIDGE_NF_CALL[4], "0")  # a node where it is off (br_netfilter loaded late, or reset)
    node.init(NETPLUGIN_BRIDGE_BR_NETFILTER="true" if setting else "false")
    assert node.sysctl(BRIDGE_NF_CALL[4]) == ("1" if setting else "0")
    node.add_pod("a")
    b = node.add_pod("b")
    kube_proxy_service(node, b)
    server = Server(node.pod_ns("b"), TARGET_PORT, "b")
    try:
        want = "b" if setting else ""
        assert ask(node.pod_ns("a"), b, TARGET_PORT) == "b"  # the pods themselves talk either way
        assert ask(node.pod_ns("a"), SERVICE, SERVICE_PORT) == want, "pod A -> Service -> pod B"
        assert ask(node.pod_ns("b"), SERVICE, SERVICE_PORT) == "b", "pod B -> Service -> pod B (hairpin)"
    finally:
        server.close()
