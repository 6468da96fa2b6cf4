"""Which NetworkPolicy agents a node runs, read from its kernel (netplugin.nodenet.policyagents), in a
network namespace of the test's own holding what each agent keeps there."""

from __future__ import annotations

import secrets
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from netplugin.nodenet.policyagents import KNOWN, KUBE_NETWORK_POLICIES, Seen, seen
from tests.support.nettest import kernel_unavailable_reason

pytestmark = pytest.mark.kernel


@pytest.fixture
def netns() -> Iterator[str]:
    reason = kernel_unavailable_reason() or (None if shutil.which("iptables") and shutil.which("nft") else "no nft")
    if reason:
        pytest.skip(reason)
    name = f"np{secrets.token_hex(3)}pa"
    subprocess.run(["ip", "netns", "add", name], check=True, timeout=60)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, timeout=60)


def _in(netns: str, *argv: str) -> None:
    done = subprocess.run(["ip", "netns", "exec", netns, *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


#: what each agent's presence looks like: the commands that make it, and what seen() says
AGENTS = {
    "kube-network-policies": (
        [["nft", "add table inet kube-network-policies"]],
        "nftables table inet kube-network-policies",
    ),
    "kube-router": ([["iptables", "-w", "-N", "KUBE-ROUTER-FORWARD"]], "iptables chain KUBE-ROUTER-FORWARD"),
    "calico": ([["iptables", "-w", "-N", "cali-FORWARD"]], "iptables chain cali-FORWARD"),
}


def test_known_agents_are_the_ones_described() -> None:
    assert [a.name for a in KNOWN] == list(AGENTS)
    assert KUBE_NETWORK_POLICIES.nft_tables == (("inet", "kube-network-policies"),)


@pytest.mark.parametrize("agent", list(AGENTS))
def test_an_agent_is_seen_by_its_own_objects_and_nothing_else_is(netns: str, agent: str) -> None:
    path = f"/run/netns/{netns}"
    # Look-alikes are not agents: another table of the family, a chain of another name.
    _in(netns, "nft", "add table inet kube-network-policies-not")
    _in(netns, "iptables", "-w", "-N", "cali-FORWARD-not")
    assert seen(path) == []
    commands, evidence = AGENTS[agent]
    for argv in commands:
        _in(netns, *argv)
    assert seen(path) == [Seen(agent, evidence)]


def test_every_agent_present_is_named_in_the_known_order(netns: str) -> None:
    for commands, _ in reversed(AGENTS.values()):
        for argv in commands:
            _in(netns, *argv)
    assert seen(f"/run/netns/{netns}") == [Seen(name, evidence) for name, (_, evidence) in AGENTS.items()]
