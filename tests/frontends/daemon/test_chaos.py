"""Chaos on a node with pods up: what an admin or a firewall reload breaks comes back, event-driven.

The node is a network namespace of the test's own with the shipped daemon (``netplugin serve``), a
static cluster (a ``proto 78`` route to a peer, the egress table), the chain ``netplugin.io/bridge``
then ``netplugin.io/hostport`` and three pods, the first with a hostPort
(:class:`bench.chaosnode.ChaosNode`). Each breakage is repaired (the kernel state is back: the
test waits for it with a generous bound, it does not time it; the bench reports the times),
traffic flows again, and pods the breakage did not touch see no drop while it is repaired. A
pod whose host veth is gone is reported broken, and stops being so when it is torn down.

Dual-stack (an IPv4 and an IPv6 subnet on the bridge), for both bridge plugins: a deleted bridge and
one family's addresses flushed come back, and pods reach each other, the gateway and the node over
both families, also from an address that is not the bridge's (what the node forwards from other
nodes), which the node resolves with the bridge's link-local address.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from bench.chaosnode import (
    BUILTIN_CHAIN,
    EXEC_CHAIN,
    GATEWAY4,
    GATEWAY6,
    UNDERLAY4,
    UNDERLAY6,
    ChaosNode,
    veth_of,
)
from netplugin.core.config import load_config
from netplugin.frontends.checks import Node, check_repairs
from tests.support.nettest import kernel_gate

pytestmark = pytest.mark.kernel


@pytest.fixture
def node(request: pytest.FixtureRequest) -> Iterator[ChaosNode]:
    kernel_gate(request)
    with ChaosNode(pods=3) as n:
        yield n


def _pinging(node: ChaosNode, src: str, dst: str) -> subprocess.Popen[str]:
    """Pings ``dst`` from ``src`` every 20 ms for about 1.5 s."""
    argv = ["ip", "netns", "exec", src, "ping", "-q", "-c", "75", "-i", "0.02", "-W", "1", dst]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _no_drop(ping: subprocess.Popen[str]) -> None:
    out, _ = ping.communicate(timeout=60)
    assert ping.returncode == 0 and " 0% packet loss" in out, out


# Which pods a breakage leaves alone: (p1 -> p2) is unrelated to p0's hairpin, to the firewall and
# to the route to the peer; a deleted bridge cuts every pod off until it is back.
@pytest.mark.parametrize(
    ("kind", "unrelated", "counted"),
    [
        ("hairpin", True, {"port": 1}),
        ("nft flush", True, {"egress": 1, "hostport": 1}),
        ("route flush", True, {"route": 1}),
        ("bridge", False, {"bridge": 1, "port": 6}),
    ],
)
def test_a_breakage_is_repaired_and_traffic_flows_again(
    node: ChaosNode, kind: str, unrelated: bool, counted: dict[str, int]
) -> None:
    (p0, ip0), (p1, ip1), (p2, ip2) = node.pods
    assert node.ping(p0, ip1) and node.ping(p1, ip2)
    ping = _pinging(node, p1, ip2) if unrelated else None
    took = node.time_to_repair(kind)
    print(f"\ntime to repair ({kind}): {took * 1000:.0f} ms")
    if ping is not None:
        _no_drop(ping)

    def as_counted() -> bool:
        repairs: dict[str, int] = node.health()["node"]["repairs"]
        if kind != "bridge":
            return repairs == counted
        # A repair that raced with the bridge's deletion (it saw the bridge still there) is followed
        # by another when the deletion ends: the same kinds, maybe counted twice.
        return repairs.keys() == counted.keys() and all(repairs[k] >= n for k, n in counted.items())

    node.wait(as_counted, 10, f"repairs counted as {counted}")
    assert node.health()["node"]["repair_incidents"] == 1  # one breakage, however many objects (doctor's count)
    assert node.ping(p0, ip1) and node.ping(p2, ip0) and node.ping(node.ns, ip0)
    log = node.log.read_text()
    assert "repair (" in log and "Traceback" not in log, log


def test_every_breakage_in_a_row_then_a_new_pod_still_works(node: ChaosNode) -> None:
    """The repairs leave a node that takes new pods (the bridge recreated as init makes it)."""
    for kind in ("bridge", "hairpin", "nft flush", "route flush", "bridge"):
        node.time_to_repair(kind)
    node.npods += 1
    node._pod(3)
    assert node.ping(node.pods[3][0], node.pods[0][1])
    assert node.health()["node"]["problems"] == []


def test_a_pod_whose_host_veth_is_gone_is_broken_until_torn_down(node: ChaosNode) -> None:
    p2 = node.pods[2][0]
    node.ip("link", "del", veth_of(p2))  # its pod end goes with it: no repair can bring it back

    def broken() -> list[dict[str, str]]:
        return [p for p in node.health()["node"]["problems"] if p["kind"] == "broken_pod"]

    node.wait(lambda: len(broken()) == 1, 10, "pod p2 reported broken")
    assert f"chaos/p2/{p2}" in broken()[0]["reason"] and "is gone" in broken()[0]["reason"]
    rows = {p["name"]: p["condition"] for p in node.request({"op": "pods"})["result"]["listing"]["pods"]}
    assert rows == {"p0": "ready", "p1": "ready", "p2": "broken"}
    # `netplugin health`, as shipped: it says so and still exits 0 (the probe must not restart a
    # daemon that cannot mend it); doctor's repairs check fails, naming the pod and what to do.
    cli = [
        "ip",
        "netns",
        "exec",
        node.ns,
        sys.executable,
        "-m",
        "netplugin",
        "--config",
        str(node.dir / "netplugin.yaml"),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_")}  # the file's settings only
    health = subprocess.run([*cli, "health"], capture_output=True, text=True, timeout=60, env=env)
    assert health.returncode == 0 and "1 pod(s) broken" in health.stdout, health
    # doctor finds the daemon through the installed conflist (this node has none): its check, on the
    # daemon's real answer
    repairs = check_repairs(
        Node(load_config(str(node.dir / "netplugin.yaml"), environ={}), "", (), health=node.health())
    )
    assert not repairs.ok and f"chaos/p2/{p2}" in (repairs.problem or "") and "delete those pods" in (repairs.fix or "")
    assert "pod chaos/p2/" in node.log.read_text() and "is broken" in node.log.read_text()
    # The others are untouched; the broken pod's teardown clears it.
    assert node.ping(node.pods[0][0], node.pods[1][1])
    node.request({"op": "teardown", "namespace": "chaos", "pod": "p2", "infra_id": p2})
    node.time_to_repair("hairpin")  # a later pass forgets what was torn down
    node.wait(lambda: broken() == [], 10, "p2 no longer broken")


def test_the_shipped_bash_plugins_repair_their_own(request: pytest.FixtureRequest) -> None:
    """The chain bash ``bridge`` then ``bandwidth`` (shaping the first pod): each declares ``repair``
    in its init mask, and puts back its part (the qdiscs; the bridge, ports and hairpin)."""
    kernel_gate(request)
    with ChaosNode(pods=3, chain=EXEC_CHAIN) as node:
        (p0, ip0), (p1, ip1), _ = node.pods
        node.time_to_repair("qdisc")
        node.wait(lambda: node.health()["node"]["repairs"] == {"qdisc": 1}, 10, "the qdisc repair counted")
        node.time_to_repair("bridge")
        node.wait(lambda: node.health()["node"]["repairs"].get("bridge", 0) >= 1, 10, "the bridge repair counted")
        assert node.qdisc_ok() and node.ping(p0, ip1) and node.ping(p1, ip0)
        log = node.log.read_text()
        assert "by bandwidth: qdisc: " in log and "shaping re-applied (lost: root tbf)" in log, log
        assert "by bridge: bridge: " in log, log


@pytest.mark.parametrize("chain", [BUILTIN_CHAIN, EXEC_CHAIN], ids=["built-in", "bash"])
def test_setups_do_not_wake_the_pod_repairer_and_an_idle_node_wakes_nothing(
    request: pytest.FixtureRequest, chain: tuple[str, ...]
) -> None:
    """Creating links, attaching ports and shaping (the bash chain's bandwidth replaces the kernel's
    default qdiscs) is what every setup does, no loss: no pod repair runs. And with nothing
    changing the kernel watch never wakes: it blocks on netlink, it does not poll."""
    kernel_gate(request)
    with ChaosNode(pods=3, chain=chain) as node:
        _setups_then_idle(node)


def _setups_then_idle(node: ChaosNode) -> None:
    if node.chain == EXEC_CHAIN:
        assert node.qdisc_ok()  # its setups did shape the first pod
    st = node.health()["node"]
    assert st["pod_repair_calls"] == 0 and st["repairs"] == {}, st
    # The kernel's own follow-ups of the setups end first (IPv6 DAD finishing on the bridge's
    # link-local address is a notification too); then nothing.
    deadline = time.monotonic() + 20
    before = -1
    while (now := node.health()["node"]["kernel_wakeups"]) != before:
        assert time.monotonic() < deadline, "the kernel watch never went quiet"
        before = now
        time.sleep(2)
    time.sleep(3)
    assert node.health()["node"]["kernel_wakeups"] == before
    node.request({"op": "teardown", "namespace": "chaos", "pod": "p2", "infra_id": node.pods[2][0]})
    node.wait(lambda: node.health()["node"]["kernel_wakeups"] > before, 10, "the teardown's notifications")
    time.sleep(0.5)
    assert node.health()["node"]["pod_repair_calls"] == 0  # a pod in teardown is its action's, not repaired


# --- dual-stack: both plugins' bridge with 10.206.143.0/24 and fd00:10:206:8f::/64 ------------------


@pytest.fixture(scope="module", params=[BUILTIN_CHAIN, EXEC_CHAIN], ids=["built-in", "bash"])
def dual_node(request: pytest.FixtureRequest) -> Iterator[ChaosNode]:
    """A dual-stack node; its cases run in a row on it (each leaves it repaired)."""
    kernel_gate(request)
    with ChaosNode(pods=3, chain=request.param, dual_stack=True) as n:
        yield n


#: breakage -> (the repair kinds it is counted under, exactly: a dual-stack bridge that is intact is
#: never "repaired"; what the repair's log lines say; whether pod -> pod traffic over the bridge is
#: untouched while it lasts)
DUAL_BREAKAGES = {
    "hairpin": ({"port"}, [" hairpin on"], True),
    "bridge": ({"bridge", "port"}, ["bridge: {bridge} recreated with "], False),
    # a downed link loses its IPv6 addresses (link-local and gateway): the kernel makes the first again
    "bridge down": ({"bridge"}, ["bridge: {bridge} set up"], False),
    "ipv6 flush": ({"bridge"}, [f"bridge: {{bridge}} address {GATEWAY6}/64 re-added", " address fe80:"], True),
    "link-local del": ({"bridge"}, ["bridge: {bridge} address fe80:"], True),
    "ipv4 flush": ({"bridge"}, [f"bridge: {{bridge}} address {GATEWAY4}/24 re-added"], True),
}


def _flows_over_both_families(node: ChaosNode) -> None:
    (p0, ip0), (p1, ip1), (p2, _) = node.pods
    six = node.ip6
    for src, dst in [
        (p0, ip1), (p0, six[p1]), (p2, ip0), (p2, six[p0]),  # pod -> pod
        (p1, GATEWAY4), (p1, GATEWAY6), (p1, UNDERLAY4), (p1, UNDERLAY6),  # pod -> gateway, pod -> node
    ]:  # fmt: skip
        assert node.ping(src, dst), f"{src} -> {dst}"
    # From an address not on the bridge (forwarded traffic's source), with no neighbour entry left:
    # the node's neighbour solicitation needs the bridge's link-local address as its source.
    node.ip("-6", "neigh", "flush", "dev", node.bridge)
    assert node.ping(node.ns, six[p2], source=UNDERLAY6), f"{UNDERLAY6} -> {six[p2]}"
    assert node.ping(node.ns, node.pods[2][1], source=UNDERLAY4)


@pytest.mark.parametrize("kind", list(DUAL_BREAKAGES))
def test_a_dual_stack_bridge_comes_back_with_both_families(dual_node: ChaosNode, kind: str) -> None:
    node = dual_node
    kinds, said, unrelated = DUAL_BREAKAGES[kind]
    (_, _), (p1, _), (p2, ip2) = node.pods
    _flows_over_both_families(node)
    before: dict[str, int] = node.health()["node"]["repairs"]
    logged = len(node.log.read_text())
    pings = [_pinging(node, p1, ip2), _pinging(node, p1, node.ip6[p2])] if unrelated else []
    took = node.time_to_repair(kind)  # both gateways, a link-local address, every port with hairpin
    print(f"\ntime to repair ({kind}, {node.chain[0]}): {took * 1000:.0f} ms")
    for ping in pings:
        _no_drop(ping)

    def grown() -> set[str]:
        after: dict[str, int] = node.health()["node"]["repairs"]
        return {k for k, n in after.items() if n > before.get(k, 0)}

    node.wait(lambda: grown() == kinds, 10, f"repairs counted as {kinds}")
    _flows_over_both_families(node)
    log = node.log.read_text()[logged:]
    lines = [line for line in log.splitlines() if "repair (" in line]
    print("", *lines, sep="\n")  # the repair times, for the record
    for words in (w.format(bridge=node.bridge) for w in said):
        assert any(words in line for line in lines), (words, log)
    assert "Traceback" not in log and "failed" not in log, log
