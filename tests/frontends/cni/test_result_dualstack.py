"""The CNI ADD result of a dual-stack pod lists both addresses (issue 11): PodNetworkStatus.ips -> ips."""

from __future__ import annotations

from netplugin.frontends.cni.result import make_result

ENV = {"NETPLUGIN_BRIDGE_SUBNET": "10.205.3.0/24,fd00:10:205:3::/64"}


def test_both_addresses_with_prefix_and_gateway() -> None:
    result = make_result("1.0.0", "eth0", "/run/netns/x", ("10.205.3.2", "fd00:10:205:3::2"), ENV)
    assert result["ips"] == [
        {"address": "10.205.3.2/24", "interface": 0, "gateway": "10.205.3.1"},
        {"address": "fd00:10:205:3::2/64", "interface": 0, "gateway": "fd00:10:205:3::1"},
    ]


def test_gateways_per_family_and_old_versions_say_the_family() -> None:
    env = dict(ENV, NETPLUGIN_BRIDGE_GATEWAY="fd00:10:205:3::fe,10.205.3.254")
    result = make_result("0.4.0", "eth0", "", ["fd00:10:205:3::2", "10.205.3.2"], env)
    assert result["ips"] == [
        {"address": "fd00:10:205:3::2/64", "interface": 0, "gateway": "fd00:10:205:3::fe", "version": "6"},
        {"address": "10.205.3.2/24", "interface": 0, "gateway": "10.205.3.254", "version": "4"},
    ]


def test_a_single_address_still_works() -> None:
    result = make_result("1.0.0", "eth0", "", "10.205.3.2", {"NETPLUGIN_BRIDGE_SUBNET": "10.205.3.0/24"})
    assert result["ips"] == [{"address": "10.205.3.2/24", "interface": 0, "gateway": "10.205.3.1"}]


def test_subnet_node_uses_the_node_pod_cidrs() -> None:
    env = {"NETPLUGIN_BRIDGE_SUBNET": "node", "NETPLUGIN_NODE_POD_CIDRS": "10.205.3.0/24,fd00:10:205:3::/64"}
    result = make_result("1.0.0", "eth0", "", ("10.205.3.2", "fd00:10:205:3::2"), env)
    assert [e["address"] for e in result["ips"]] == ["10.205.3.2/24", "fd00:10:205:3::2/64"]
