"""The native ``netplugin.io/bridge`` plugin with IPv4 and IPv6, and with SUBNET=node (issue 11).

Settings are checked against the bash plugin's ``config`` output and messages (no root needed);
the kernel tests use real namespaces, veths and a bridge with 10.205.X.0/24 and
fd00:10:205:X::/64 (tests/support/dualnet.py) and real TCP traffic over both families. The interop tests
run both plugins on one bridge and IPAM directory, both ways.
"""

from __future__ import annotations

import ipaddress
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from netplugin.core.errors import PluginFailed
from netplugin.core.names import PodRef
from netplugin.core.plugin import CallContext, PodNetworkStatus
from netplugin.plugins.bridge.bridge_plugin import NativeBridgePlugin
from netplugin.plugins.bridge.settings import SettingsError, load_settings
from tests.support.bridgenet import BridgeNet, Pod, bash_config, bash_settings, bridge_env
from tests.support.dualnet import DualNet, pod_addrs, pod_default_routes

kernel = pytest.mark.kernel


# --- settings: identical to the bash plugin -------------------------------------------------------------


@pytest.mark.parametrize(
    "extra",
    [
        {"NETPLUGIN_BRIDGE_SUBNET": "10.205.3.0/24,fd00:10:205:3::/64"},
        {"NETPLUGIN_BRIDGE_SUBNET": " FD00:10:205:3:0::/64 , 10.205.3.0/24"},
        {"NETPLUGIN_BRIDGE_SUBNET": "fd00:10:205:3::/120", "NETPLUGIN_BRIDGE_GATEWAY": "fd00:10:205:3::ff"},
        {"NETPLUGIN_BRIDGE_SUBNET": "10.205.3.0/24,fd00:10:205:3::/64",
         "NETPLUGIN_BRIDGE_GATEWAY": "fd00:10:205:3:1::1,10.205.3.254"},
        {"NETPLUGIN_BRIDGE_SUBNET": "node", "NETPLUGIN_NODE_POD_CIDRS": "10.244.1.0/24,fd00:10:244:1::/64"},
        {"NETPLUGIN_BRIDGE_SUBNET": "node", "NETPLUGIN_NODE_POD_CIDRS": "fd00:10:244:1::/80"},
    ],
)
def test_dual_settings_match_the_bash_plugin(tmp_path: Path, extra: dict[str, str]) -> None:
    env = bridge_env(tmp_path, **extra)
    assert load_settings(env).to_env() == bash_settings(env)


BAD = [
    ("SUBNET", "fd00:10:205:3::1/64", "host bits are set (did you mean fd00:10:205:3::/64?)"),
    ("SUBNET", "fd00::/40", "prefix length must be 48-126"),
    ("SUBNET", "fd00::/127", "prefix length must be 48-126"),
    ("SUBNET", "fd00::/1000", "expected an IPv6 network like fd00:10:244:1::/64"),
    ("SUBNET", "::ffff:10.0.0.0/120", "expected an IPv6 network"),
    ("SUBNET", "fe80::%eth0/64", "expected an IPv6 network"),
    ("SUBNET", "10.205.3.0/24,10.205.4.0/24", "more than one IPv4 network (at most one per family)"),
    ("SUBNET", "fd00::/64,fd01::/64", "more than one IPv6 network"),
    ("SUBNET", "10.205.3.0/24,", "empty entry"),
    ("SUBNET", "10.205.3.0/24,,fd00::/64", "empty entry"),
    ("SUBNET", "10.205.3.0/24,fd00::1/64", "fd00::1/64: host bits are set"),
    ("SUBNET", "10.205.3.0/24,nope", "nope: expected an IPv4 network like 10.244.0.0/24 or an IPv6 network"),
    ("SUBNET", "nope", "expected an IPv4 network like 10.244.0.0/24 or an IPv6 network"),
    ("GATEWAY", "fd00:10:205:3::", "not a host address of fd00:10:205:3::/64"),
    ("GATEWAY", "fd00:10:205:4::1", "not a host address of fd00:10:205:3::/64"),
    ("GATEWAY", "10.205.3.1,10.205.3.2", "more than one IPv4 address"),
    ("GATEWAY", "10.205.3.1,", "empty entry"),
    ("GATEWAY", "::ffff:10.205.3.1", "expected an IPv4 or IPv6 address"),
    ("MTU", "1279", "IPv6 needs at least 1280"),
]


@pytest.mark.parametrize(("key", "value", "message"), BAD, ids=[f"{k}={v}" for k, v, _ in BAD])
def test_bad_dual_settings_are_rejected_like_bash(tmp_path: Path, key: str, value: str, message: str) -> None:
    env = bridge_env(tmp_path, NETPLUGIN_BRIDGE_SUBNET="10.205.3.0/24,fd00:10:205:3::/64")
    env[f"NETPLUGIN_BRIDGE_{key}"] = value
    r = bash_config(env)
    assert r.returncode == 1 and message in r.stderr, r.stderr
    with pytest.raises(SettingsError) as exc:
        load_settings(env)
    assert str(exc.value) in r.stderr  # the very same words


def test_gateway_of_a_missing_family_names_the_subnets(tmp_path: Path) -> None:
    env = bridge_env(tmp_path, NETPLUGIN_BRIDGE_SUBNET="10.205.3.0/24", NETPLUGIN_BRIDGE_GATEWAY="fd00::1")
    r = bash_config(env)
    with pytest.raises(SettingsError) as exc:
        load_settings(env)
    assert str(exc.value) == (
        "invalid NETPLUGIN_BRIDGE_GATEWAY 'fd00::1': fd00::1: there is no IPv6 subnet (10.205.3.0/24)"
    )
    assert str(exc.value) in r.stderr


@pytest.mark.parametrize(
    ("cidrs", "message"),
    [
        ("", "NETPLUGIN_BRIDGE_SUBNET is 'node' but NETPLUGIN_NODE_POD_CIDRS is not set: the node has no pod"),
        ("10.244.1.0/33", "invalid NETPLUGIN_NODE_POD_CIDRS '10.244.1.0/33' (from NETPLUGIN_BRIDGE_SUBNET=node): "
                          "prefix length must be 8-30"),
        ("10.244.1.0/24,fd00:10:244:1::/64,10.244.2.0/24", "more than one IPv4 network"),
        ("x", "invalid NETPLUGIN_NODE_POD_CIDRS 'x' (from NETPLUGIN_BRIDGE_SUBNET=node): expected an IPv4"),
    ],
)
def test_subnet_node_errors_like_the_bash_plugin(tmp_path: Path, cidrs: str, message: str) -> None:
    env = bridge_env(tmp_path, NETPLUGIN_BRIDGE_SUBNET="node", NETPLUGIN_NODE_POD_CIDRS=cidrs)
    r = bash_config(env)
    assert r.returncode == 1
    with pytest.raises(SettingsError) as exc:
        load_settings(env)
    assert message in str(exc.value) and str(exc.value) in r.stderr


def test_settings_follow_the_node_pod_cidrs(tmp_path: Path) -> None:
    plugin = NativeBridgePlugin(state_dir=str(tmp_path))
    env = {"NETPLUGIN_BRIDGE_SUBNET": "node", "NETPLUGIN_NODE_POD_CIDRS": "10.244.1.0/24"}
    assert [str(n) for n in plugin.settings(env).subnets] == ["10.244.1.0/24"]
    env["NETPLUGIN_NODE_POD_CIDRS"] = "10.244.2.0/24,fd00:10:244:2::/64"  # the node got new CIDRs
    assert [str(n) for n in plugin.settings(env).subnets] == ["10.244.2.0/24", "fd00:10:244:2::/64"]


# --- kernel ----------------------------------------------------------------------------------------------


class NativeDual(DualNet):
    v6_prefixlen = 64

    def __post_init__(self) -> None:
        super().__post_init__()
        self.plugin = NativeBridgePlugin(state_dir=str(self.np_state))

    def ctx(self, pod: Pod | None = None, **env: str) -> CallContext:
        netns = pod.netns_path if pod is not None else ""
        return CallContext(netns=netns, env={**self.env, **env}, state_dir=str(self.np_state), timeout=30)

    @staticmethod
    def ref(pod: Pod) -> PodRef:
        return PodRef(pod.namespace, pod.name, pod.infra_id)

    def setup(self, pod: Pod, **env: str) -> None:
        self.plugin.setup(self.ref(pod), self.ctx(pod, **env))

    def teardown(self, pod: Pod, **env: str) -> None:
        self.plugin.teardown(self.ref(pod), self.ctx(pod, **env))
        # it answers before the kernel's deletion of the veth (test_bridge checks that state); these
        # tests check what is left once it is over
        self.plugin.reaper.settle(pod.host_veth, 10)

    def status(self, pod: Pod, **env: str) -> PodNetworkStatus | None:
        return self.plugin.status(self.ref(pod), self.ctx(pod, **env))


@pytest.fixture
def native_dual(bridge_net_factory: Callable[..., BridgeNet]) -> Callable[..., NativeDual]:
    def make(prefixlen: int = 24, v6_prefixlen: int = 64) -> NativeDual:
        cls = type("NativeDualN", (NativeDual,), {"v6_prefixlen": v6_prefixlen})
        net = bridge_net_factory(prefixlen, cls=cls)
        assert isinstance(net, NativeDual)
        net.plugin.init(net.ctx())
        return net

    return make


@kernel
def test_dual_stack_pods_reach_each_other_at_once(native_dual: Callable[..., NativeDual]) -> None:
    net = native_dual()
    addrs = subprocess.run(["ip", "-o", "addr", "show", "dev", net.bridge], capture_output=True, text=True).stdout
    assert f"inet {net.gateway}/24" in addrs and f"inet6 {net.gateway6}/64 scope global nodad" in addrs
    assert Path(f"/proc/sys/net/ipv6/conf/{net.bridge}/accept_dad").read_text().strip() == "0"
    pods = net.pods(3)
    for p in pods:
        net.setup(p)
    for i, p in enumerate(pods):
        v4, v6 = str(net.subnet.network_address + 2 + i), str(net.subnet6.network_address + 2 + i)
        assert pod_addrs(p) == {4: [f"{v4}/24"], 6: [f"{v6}/64"]}
        assert pod_default_routes(p) == {4: f"default via {net.gateway} dev eth0",
                                         6: f"default via {net.gateway6} dev eth0"}
        assert net.status(p) == PodNetworkStatus(v4, (v4, v6))
        # a pod with IPv6 keeps its link-local address (neighbour discovery and MLD use it)
        link = subprocess.run(["ip", "-n", p.netns, "-6", "-o", "addr", "show", "dev", "eth0", "scope", "link"],
                              capture_output=True, text=True).stdout
        assert " fe80::" in link
    net.assert_mesh(pods)
    for p in pods:
        net.teardown(p)
    assert net.ipam_files("ips") == net.ipam_files("pods") == net.ipam6_files("ips") == net.ipam6_files("pods") == []
    assert net.bridge_ports() == []


@kernel
@pytest.mark.parametrize("family", [4, 6])
def test_exhaustion_per_family_rolls_back_the_other(native_dual: Callable[..., NativeDual], family: int) -> None:
    net = native_dual(prefixlen=30) if family == 4 else native_dual(v6_prefixlen=126)
    fit = 1 if family == 4 else 2
    pods = net.pods(fit + 1)
    for p in pods[:fit]:
        net.setup(p)
    with pytest.raises(PluginFailed) as exc:
        net.setup(pods[fit])
    full = net.subnet if family == 4 else net.subnet6
    assert f"no free address in {full} (all {fit} pod addresses are allocated" in str(exc.value)
    assert pods[fit].infra_id not in net.ipam_files("pods") + net.ipam6_files("pods")
    assert len(net.ipam_files("ips")) == len(net.ipam6_files("ips")) == fit
    assert pods[fit].host_veth not in net.bridge_ports()
    net.teardown(pods[0])
    net.setup(pods[fit])
    assert len(pod_addrs(pods[fit])[4]) == len(pod_addrs(pods[fit])[6]) == 1


@kernel
def test_setup_again_keeps_both_addresses(native_dual: Callable[..., NativeDual]) -> None:
    net = native_dual()
    pod = net.pod(0)
    net.setup(pod)
    before = pod_addrs(pod)
    net.setup(pod)
    assert pod_addrs(pod) == before
    assert len(net.ipam_files("ips")) == len(net.ipam6_files("ips")) == 1


@kernel
def test_subnet_node_from_the_call_environment(native_dual: Callable[..., NativeDual]) -> None:
    net = native_dual()
    node = {"NETPLUGIN_BRIDGE_SUBNET": "node", "NETPLUGIN_NODE_POD_CIDRS": f"{net.subnet6},{net.subnet}"}
    pod = net.pod(0)
    net.setup(pod, **node)
    v4, v6 = str(net.subnet.network_address + 2), str(net.subnet6.network_address + 2)
    assert net.status(pod, **node) == PodNetworkStatus(v6, (v6, v4))  # IPv6 listed first: primary
    net.teardown(pod, **node)
    assert net.ipam6_files("pods") == []


@kernel
def test_interop_bash_sets_up_native_tears_down_and_back(native_dual: Callable[..., NativeDual]) -> None:
    net = native_dual()
    a, b = net.pods(2)
    net.ok("setup", a)  # the bash plugin
    net.setup(b)  # the native plugin, same bridge and IPAM directory
    v4a, v6a = str(net.subnet.network_address + 2), str(net.subnet6.network_address + 2)
    v4b, v6b = str(net.subnet.network_address + 3), str(net.subnet6.network_address + 3)
    assert net.status(a) == PodNetworkStatus(v4a, (v4a, v6a))
    assert net.ok("status", b).stdout.strip() == (
        f'{{"apiVersion":"v1beta1","kind":"PodNetworkStatus","ip":"{v4b}","ips":["{v4b}","{v6b}"]}}'
    )
    net.assert_mesh([a, b])
    net.teardown(a)  # native frees what bash allocated, both families
    net.ok("teardown", b)  # and bash what native allocated
    assert net.ipam_files("ips") == net.ipam_files("pods") == net.ipam6_files("ips") == net.ipam6_files("pods") == []
    assert net.bridge_ports() == []


_V6_SUBNETS = st.builds(
    lambda bits, plen: ipaddress.IPv6Network((bits >> (128 - plen) << (128 - plen), plen)),
    st.integers(0, (1 << 128) - 1),
    st.integers(48, 126),
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(net=_V6_SUBNETS, offset=st.integers(1, (1 << 40)), form=st.sampled_from(["exploded", "compressed", "upper"]))
def test_ipv6_parsing_and_formatting_match_the_bash_plugin(
    tmp_path: Path, net: ipaddress.IPv6Network, offset: int, form: str
) -> None:
    # The bash plugin parses and prints IPv6 in pure bash; Python's ipaddress is the reference.
    gw = net.network_address + offset % (net.num_addresses - 1) + 1
    text = {"exploded": gw.exploded, "compressed": str(gw), "upper": str(gw).upper()}[form]
    env = bridge_env(tmp_path, NETPLUGIN_BRIDGE_SUBNET=f"10.205.3.0/24,{net.exploded}", NETPLUGIN_BRIDGE_GATEWAY=text)
    bash = bash_settings(env)
    assert bash["NETPLUGIN_BRIDGE_SUBNET"] == f"10.205.3.0/24,{net}"
    assert bash["NETPLUGIN_BRIDGE_GATEWAY"] == f"10.205.3.1,{gw}"
    assert load_settings(env).to_env() == bash


@kernel
def test_teardown_and_status_work_after_the_node_lost_its_cidrs(native_dual: Callable[..., NativeDual]) -> None:
    net = native_dual()
    node = {"NETPLUGIN_BRIDGE_SUBNET": "node", "NETPLUGIN_NODE_POD_CIDRS": f"{net.subnet},{net.subnet6}"}
    pod = net.pod(0)
    net.setup(pod, **node)
    gone = dict(node, NETPLUGIN_NODE_POD_CIDRS="")
    with pytest.raises(PluginFailed, match="NETPLUGIN_NODE_POD_CIDRS is not set"):
        net.setup(net.pod(1), **gone)
    st = net.status(pod, **gone)
    assert st is not None and st.ips == (str(net.subnet.network_address + 2), str(net.subnet6.network_address + 2))
    net.teardown(pod, **gone)
    assert net.ipam_files("pods") == net.ipam6_files("pods") == net.ipam6_files("ips") == []
    assert net.bridge_ports() == []


@kernel
def test_ipv6_only(native_dual: Callable[..., NativeDual]) -> None:
    net = native_dual()
    only6 = {"NETPLUGIN_BRIDGE_SUBNET": str(net.subnet6)}
    pod = net.pod(0)
    net.setup(pod, **only6)
    v6 = str(net.subnet6.network_address + 2)
    assert pod_addrs(pod) == {4: [], 6: [f"{v6}/64"]}
    assert pod_default_routes(pod)[6] == f"default via {net.gateway6} dev eth0"
    assert net.status(pod, **only6) == PodNetworkStatus(v6)
    net.teardown(pod, **only6)
    assert net.ipam6_files("pods") == net.ipam6_files("ips") == []
