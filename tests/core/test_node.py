"""NodeInfo: what plugins learn about their node, parsed from Kubernetes Node objects."""

from __future__ import annotations

import os
from typing import Any

import pytest

from netplugin.core.errors import HostError
from netplugin.core.node import NODE_ENV_VARS, NodeInfo, node_name


def node(spec: dict[str, Any] | None = None, addresses: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {"kind": "Node", "metadata": {"name": "n1"}, "spec": spec or {}, "status": {"addresses": addresses or []}}


def test_dual_stack_node_keeps_order_and_normalises() -> None:
    obj = node(
        {"podCIDR": "fd00:1::/64", "podCIDRs": ["fd00:1:0:0::/64", "10.1.2.0/24"]},
        [
            {"type": "Hostname", "address": "n1"},
            {"type": "InternalIP", "address": "fd00::0011"},
            {"type": "ExternalIP", "address": "203.0.113.9"},
            {"type": "InternalIP", "address": "192.168.1.11"},
        ],
    )
    info = NodeInfo.from_node(obj)
    assert info == NodeInfo("n1", ("fd00:1::/64", "10.1.2.0/24"), ("fd00::11", "192.168.1.11"))
    assert info.internal_ip(4) == "192.168.1.11" and info.internal_ip(6) == "fd00::11"
    assert info.env() == {
        "NETPLUGIN_NODE_NAME": "n1",
        "NETPLUGIN_NODE_POD_CIDRS": "fd00:1::/64,10.1.2.0/24",
        "NETPLUGIN_NODE_INTERNAL_IPS": "fd00::11,192.168.1.11",
    }
    assert set(info.env()) == set(NODE_ENV_VARS)


def test_old_single_pod_cidr_and_one_per_family() -> None:
    assert NodeInfo.from_node(node({"podCIDR": "10.1.2.0/24"})).pod_cidrs == ("10.1.2.0/24",)
    two_v4 = node({"podCIDRs": ["10.1.2.0/24", "10.9.9.0/24", "fd00::/64"]})
    assert NodeInfo.from_node(two_v4).pod_cidrs == ("10.1.2.0/24", "fd00::/64")


def test_node_without_cidr_or_addresses() -> None:
    info = NodeInfo.from_node({"metadata": {"name": "bare"}})
    assert info == NodeInfo("bare") and info.internal_ip(4) is None
    assert info.env()["NETPLUGIN_NODE_POD_CIDRS"] == ""


@pytest.mark.parametrize(
    ("obj", "words"),
    [
        ({"metadata": {}}, ["metadata.name"]),
        (node({"podCIDRs": ["10.1.2.3/24"]}), ["spec.podCIDRs[0]", "10.1.2.3/24", "not a network"]),
        (node({"podCIDRs": "10.1.2.0/24"}), ["spec.podCIDRs must be a list"]),
        (node({"podCIDRs": [7]}), ["spec.podCIDRs[0] must be a string"]),
        (node(addresses=[{"type": "InternalIP", "address": "nope"}]), ["status.addresses[0]", "'nope'"]),
        ({"metadata": {"name": "x"}, "status": {"addresses": {"a": 1}}}, ["status.addresses must be a list"]),
    ],
)
def test_bad_node_names_the_field(obj: dict[str, Any], words: list[str]) -> None:
    with pytest.raises(HostError) as info:
        NodeInfo.from_node(obj)
    for w in words:
        assert w in info.value.message


def test_node_name_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    # gethostname(2) is uname's nodename, which node_name reads (no socket import on the CLI path)
    uname = os.uname_result(("Linux", "Worker-7.Example", "6.1.0", "#1 SMP", "x86_64"))
    monkeypatch.setattr(os, "uname", lambda: uname)
    assert node_name("from-config", {"NODE_NAME": "from-env"}) == "from-config"
    assert node_name(None, {"NODE_NAME": " from-env "}) == "from-env"
    assert node_name(None, {}) == "worker-7.example"  # lower-cased, as the kubelet registers it
