"""The native ``netplugin.io/bridge`` plugin (netplugin.plugins.bridge) on a real kernel.

Real namespaces, veths and bridges (names "np" + random hex, subnets: a random free /24 of
10.204.0.0/16, reserved for these tests), checked with iproute2, sysfs and real traffic (ICMP
and TCP from inside the pods via ``ip netns exec``), never with the plugin's own view alone.
Everything a test creates is removed by the fixture, pass or fail.

The interop tests run the bash plugin (exec_plugins/bridge/bridge) and the native plugin on
the same bridge and IPAM directory: a node must be able to switch plugins without losing pods.

``test_measure_per_pod_costs`` prints the per-pod numbers (run with ``-s`` to see them); it
asserts only correctness, never speed.
"""

from __future__ import annotations

import ipaddress
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from netplugin.core.errors import PluginFailed
from netplugin.core.names import PodRef
from netplugin.core.netlink import RawNetlink, retired_group
from netplugin.core.netns import netns_socket
from netplugin.core.plugin import CallContext, PodNetworkStatus
from netplugin.plugins.bridge.bridge_plugin import NativeBridgePlugin
from netplugin.plugins.bridge.reaper import LinkReaper
from netplugin.plugins.bridge.settings import SettingsError, bridge_mac, host_veth_name, load_settings
from netplugin.store.listing import list_pods
from tests.support.bridgenet import (
    BRIDGE,
    TCP_PORT,
    BridgeNet,
    Pod,
    bash_config,
    bash_settings,
    bridge_env,
    link_exists,
)
from tests.support.bridgenet import host_veth_name as mirror_veth_name
from tests.support.nettest import free_third_octet

kernel = pytest.mark.kernel

NATIVE_RANGE = ipaddress.ip_network("10.204.0.0/16")

# ICMP echo from inside a pod (iputils ping is not always installed); prints {address: replied}.
_PING = r"""
import json, os, socket, struct, sys, time
def csum(b):
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    s = (s >> 16) + (s & 0xFFFF)
    return ~(s + (s >> 16)) & 0xFFFF
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
ident = os.getpid() & 0xFFFF
out = {}
for seq, dst in enumerate(sys.argv[1:], 1):
    pkt = struct.pack("!BBHHH", 8, 0, 0, ident, seq) + b"netplugin-"
    pkt = pkt[:2] + struct.pack("!H", csum(pkt)) + pkt[4:]
    s.sendto(pkt, (dst, 0))
    ok, deadline = False, time.monotonic() + 3
    while not ok and time.monotonic() < deadline:
        s.settimeout(max(deadline - time.monotonic(), 0.01))
        try:
            data, addr = s.recvfrom(2048)
        except socket.timeout:
            break
        ihl = (data[0] & 15) * 4
        kind, _, _, rid, rseq = struct.unpack_from("!BBHHH", data, ihl)
        ok = kind == 0 and rid == ident and rseq == seq and addr[0] == dst
    out[dst] = ok
print(json.dumps(out))
"""


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)




class NativeNet(BridgeNet):
    """A BridgeNet (same cleanup, same bash-plugin runner) on 10.204.X.0/24, plus the native plugin."""

    def __post_init__(self) -> None:
        super().__post_init__()
        third = free_third_octet(str(NATIVE_RANGE))
        self.subnet = ipaddress.ip_network(f"10.204.{third}.0/{self.prefixlen}")
        self.gateway = str(self.subnet.network_address + 1)
        self.env["NETPLUGIN_BRIDGE_SUBNET"] = str(self.subnet)
        self.plugin = NativeBridgePlugin(state_dir=str(self.np_state))

    def ctx(self, pod: Pod | None = None, /, netns: str | None = None, **env: str) -> CallContext:
        path = netns if netns is not None else (pod.netns_path if pod is not None else "")
        return CallContext(netns=path, env={**self.env, **env}, state_dir=str(self.np_state), timeout=30)

    @staticmethod
    def ref(pod: Pod) -> PodRef:
        return PodRef(pod.namespace, pod.name, pod.infra_id)

    def init(self, **env: str) -> None:
        self.plugin.init(self.ctx(None, **env))

    def setup(self, pod: Pod, **env: str) -> None:
        self.plugin.setup(self.ref(pod), self.ctx(pod, **env))

    def teardown(self, pod: Pod, **env: str) -> None:
        self.plugin.teardown(self.ref(pod), self.ctx(pod, **env))

    def status(self, pod: Pod, **env: str) -> PodNetworkStatus | None:
        return self.plugin.status(self.ref(pod), self.ctx(pod, **env))

    def ping_from(self, pod: Pod, addrs: list[str]) -> dict[str, bool]:
        r = _run(["ip", "netns", "exec", pod.netns, sys.executable, "-c", _PING, *addrs])
        assert r.returncode == 0, r.stderr
        return dict(json.loads(r.stdout))


@pytest.fixture
def native_factory(bridge_net_factory: Callable[..., BridgeNet]) -> Callable[..., NativeNet]:
    def make(prefixlen: int = 24) -> NativeNet:
        net = bridge_net_factory(prefixlen, cls=NativeNet)
        assert isinstance(net, NativeNet)
        return net

    return make


@pytest.fixture
def native_net(native_factory: Callable[..., NativeNet]) -> NativeNet:
    net = native_factory()
    net.init()
    return net


def assert_mesh(net: NativeNet, pods: list[Pod]) -> None:
    """ICMP between all pods and to the gateway; TCP between all pods and from the host."""
    ips = {p.name: net.pod_ip(p) for p in pods}
    for src in pods:
        targets = [ips[d.name] for d in pods if d is not src] + [net.gateway]
        assert net.ping_from(src, targets) == dict.fromkeys(targets, True), f"ping from {src.name}"
    for p in pods:
        net.serve(p)
    for src in pods:
        answers = net.connect_from(src, [ips[d.name] for d in pods if d is not src])
        assert answers == {ips[d.name]: d.name for d in pods if d is not src}, f"tcp from {src.name}"
    import socket

    for p in pods:
        with socket.create_connection((ips[p.name], TCP_PORT), timeout=3) as c:
            assert c.recv(256).decode() == p.name


def assert_all_gone(net: NativeNet, pods: list[Pod]) -> None:
    for p in pods:
        net.plugin.reaper.settle(p.host_veth, 10)  # a teardown answers before the kernel's deletion
        assert not link_exists(p.host_veth), p.host_veth
    assert net.bridge_ports() == []
    assert net.ipam_files("ips") == []
    assert net.ipam_files("pods") == []


# --- naming and settings: identical to the bash plugin (no root needed) --------------------------------


@pytest.mark.parametrize("infra_id", ["abc123", "a", "Z9.x_y-z", "0" * 64, "f" * 256])
def test_host_veth_names_follow_the_bash_rule(infra_id: str) -> None:
    name = host_veth_name(infra_id)
    assert name == mirror_veth_name(infra_id)
    assert len(name) == 14 and name.startswith("np")


def test_host_veth_name_known_vectors() -> None:
    # Computed with the bash plugin's host_veth_name().
    assert host_veth_name("abc123") == "np62cca2412f0a"
    assert host_veth_name("Z9.x_y-z") == "np9d0e2dd6e803"
    # the bash plugin's POD_MAC of the same rule: locally administered unicast
    assert bridge_mac("np62c45bin") == "36:dc:fc:5f:52:0f"
    assert all(int(bridge_mac(name)[:2], 16) & 3 == 2 for name in ("cni0", "netplugin0", "np62c45bin"))


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"NETPLUGIN_BRIDGE_SUBNET": "10.204.3.0/24", "NETPLUGIN_BRIDGE_GATEWAY": "10.204.3.254"},
        {"NETPLUGIN_BRIDGE_MTU": "01400", "NETPLUGIN_BRIDGE_IFNAME": "net0", "NETPLUGIN_BRIDGE_IP_FORWARD": "No"},
        {"NETPLUGIN_BRIDGE_BR_NETFILTER": "0"},
        {"NETPLUGIN_BRIDGE_STATE_DIR": "/var/lib/x//", "NETPLUGIN_BRIDGE_NAME": "br.test-1"},
        {"NETPLUGIN_BRIDGE_SUBNET": "10.0.0.0/8", "NETPLUGIN_BRIDGE_NAME": ""},
    ],
)
def test_settings_match_the_bash_plugin(tmp_path: Path, extra: dict[str, str]) -> None:
    env = bridge_env(tmp_path, **extra)
    assert load_settings(env).to_env() == bash_settings(env)


def test_settings_files_match_the_bash_plugin(tmp_path: Path) -> None:
    # defaults < bridge.conf beside the bash plugin < NETPLUGIN_BRIDGE_CONF < environment
    install = tmp_path / "exec" / "bridge"
    install.mkdir(parents=True)
    exe = install / "bridge"
    exe.write_bytes(BRIDGE.read_bytes())
    exe.chmod(0o755)
    (install / "bridge.conf").write_text("# beside\n\nNAME = npbeside\r\nSUBNET=10.204.1.0/24\nIFNAME='ethb'\n")
    conf = tmp_path / "override.conf"
    conf.write_text('  SUBNET="10.204.2.0/24"\nNETPLUGIN_BRIDGE_MTU=1300\nGATEWAY=10.204.2.254')
    env = bridge_env(tmp_path, NETPLUGIN_BRIDGE_CONF=str(conf), NETPLUGIN_BRIDGE_MTU="1200", NETPLUGIN_BRIDGE_IFNAME="")
    bash = bash_settings(env, exe)
    plugin = NativeBridgePlugin(state_dir=env["NETPLUGIN_STATE_DIR"], plugin_dir=str(tmp_path / "exec"))
    assert plugin.settings(env).to_env() == bash
    assert bash["NETPLUGIN_BRIDGE_NAME"] == "npbeside" and bash["NETPLUGIN_BRIDGE_MTU"] == "1200"


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("SUBNET", "10.204.1.1/24", "host bits are set (did you mean 10.204.1.0/24?)"),
        ("SUBNET", "10.204.1.0", "expected an IPv4 network"),
        ("SUBNET", "010.204.1.0/24", "expected an IPv4 network"),
        ("SUBNET", "10.204.1.0/31", "prefix length must be 8-30"),
        ("SUBNET", "10.204.1.0/7", "prefix length must be 8-30"),
        ("GATEWAY", "10.205.0.1", "not a host address of 10.204.1.0/24"),
        ("GATEWAY", "10.204.1.255", "not a host address"),
        ("MTU", "67", "expected auto or an integer 68-65535"),
        ("MTU", "65536", "expected auto or an integer 68-65535"),
        ("NAME", "bridge-name-too-long", "invalid NETPLUGIN_BRIDGE_NAME"),
        ("IFNAME", "eth 0", "invalid NETPLUGIN_BRIDGE_IFNAME"),
        ("STATE_DIR", "relative/dir", "must be an absolute path"),
        ("STATE_DIR", "///", "refusing the root directory"),
        ("IP_FORWARD", "maybe", "expected true or false"),
        ("BR_NETFILTER", "on", "expected true or false"),
    ],
)
def test_invalid_settings_are_rejected_like_the_bash_plugin(tmp_path: Path, key: str, value: str, message: str) -> None:
    env = bridge_env(tmp_path, **{"NETPLUGIN_BRIDGE_SUBNET": "10.204.1.0/24", f"NETPLUGIN_BRIDGE_{key}": value})
    r = bash_config(env)
    assert r.returncode == 1 and message in r.stderr
    with pytest.raises(SettingsError) as exc:
        load_settings(env)
    assert message in str(exc.value)
    assert str(exc.value) in r.stderr  # the very same words


@pytest.mark.parametrize(
    "text, message",
    [
        ("NAME=cbr1\nCOLOUR=blue\n", "bridge.conf:2: unknown key 'COLOUR'"),
        ("# comment\nSUBNET 10.204.1.0/24\n", "bridge.conf:2: expected KEY=VALUE"),
    ],
)
def test_bad_settings_files(tmp_path: Path, text: str, message: str) -> None:
    conf = tmp_path / "bridge.conf"
    conf.write_text(text)
    with pytest.raises(SettingsError) as exc:
        load_settings({}, [str(conf)])
    assert message in str(exc.value)
    with pytest.raises(SettingsError) as exc:
        load_settings({}, [str(tmp_path / "nope.conf")])
    assert "nope.conf does not exist" in str(exc.value)


def test_version_identifies_the_code() -> None:
    v = NativeBridgePlugin().version()
    assert v.startswith("builtin:netplugin.io/bridge:sha256:")
    assert v == NativeBridgePlugin().version()


def test_registered_as_a_builtin_and_built_from_the_config(tmp_path: Path) -> None:
    from netplugin.core.config import load_config
    from netplugin.plugins import BUILTINS

    empty = tmp_path / "netplugin.yaml"
    empty.write_text("")
    cfg = load_config(str(empty), environ={}, overrides={"state_dir": str(tmp_path)})
    plugin = BUILTINS["netplugin.io/bridge"](cfg)
    assert isinstance(plugin, NativeBridgePlugin)
    assert plugin.name == "netplugin.io/bridge"
    assert plugin.settings({}).state_dir == f"{tmp_path}/bridge"


# --- init ------------------------------------------------------------------------------------------------


@kernel
def test_init_creates_the_bridge_and_is_idempotent(native_factory: Callable[..., NativeNet]) -> None:
    net = native_factory()
    net.init(NETPLUGIN_BRIDGE_MTU="1400")
    mac = Path(f"/sys/class/net/{net.bridge}/address").read_text()
    net.init(NETPLUGIN_BRIDGE_MTU="1400")
    out = _run(["ip", "-o", "-4", "addr", "show", "dev", net.bridge]).stdout
    assert [line.split()[3] for line in out.splitlines()] == [f"{net.gateway}/24"]
    assert Path(f"/sys/class/net/{net.bridge}/mtu").read_text().strip() == "1400"
    assert int(Path(f"/sys/class/net/{net.bridge}/flags").read_text(), 16) & 1
    assert (net.ipam / "subnet").read_text() == f"{net.subnet}\n"
    # The MAC is pinned: a pod joining must not change it (its ARP entry for the gateway would go stale).
    pod = net.pod(0)
    net.setup(pod)
    assert Path(f"/sys/class/net/{net.bridge}/address").read_text() == mac


@kernel
def test_init_enables_forwarding_in_its_own_netns(native_factory: Callable[..., NativeNet]) -> None:
    # ip_forward is per netns: init runs in a throwaway "node" netns (with its own /sys via ip netns exec).
    net = native_factory()
    node = net.add_netns("node")
    skip = ("NETPLUGIN_BRIDGE_IP_FORWARD", "NETPLUGIN_BRIDGE_BR_NETFILTER")
    env = {k: v for k, v in net.env.items() if k not in skip}
    nf = "/proc/sys/net/bridge/bridge-nf-call-iptables"  # per netns too: off in the node before init
    _run(["ip", "netns", "exec", node, "sh", "-c", f"echo 0 > {nf}"])
    code = (
        "import sys; from netplugin.plugins.bridge.bridge_plugin import NativeBridgePlugin;"
        "from netplugin.core.plugin import CallContext;"
        "import os; NativeBridgePlugin().init(CallContext(env=dict(os.environ)))"
    )
    repo = str(Path(__file__).resolve().parents[3])
    r = subprocess.run(
        ["ip", "netns", "exec", node, sys.executable, "-c", code],
        env={**env, "PYTHONPATH": repo},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert _run(["ip", "netns", "exec", node, "cat", "/proc/sys/net/ipv4/ip_forward", nf]).stdout.split() == ["1", "1"]
    assert _run(["ip", "-n", node, "-o", "link", "show", net.bridge]).returncode == 0
    assert not link_exists(net.bridge)


@kernel
def test_works_when_called_from_a_coroutine(native_factory: Callable[..., NativeNet]) -> None:
    # An asyncio daemon may call the plugin on its loop thread; pyroute2's sync API cannot run there.
    import asyncio

    net = native_factory()
    pod = net.pod(0)

    async def main() -> PodNetworkStatus | None:
        net.init()
        net.setup(pod)
        return net.status(pod)

    assert asyncio.run(main()) == PodNetworkStatus(ip=str(net.subnet.network_address + 2))
    net.teardown(pod)
    assert_all_gone(net, [pod])


@kernel
def test_init_refuses_a_non_bridge_and_a_changed_subnet(native_factory: Callable[..., NativeNet]) -> None:
    net = native_factory()
    net.extra_links.append(net.bridge)
    assert _run(["ip", "link", "add", net.bridge, "type", "veth", "peer", "name", net.bridge + "p"]).returncode == 0
    with pytest.raises(PluginFailed) as exc:
        net.init()
    assert f"{net.bridge} exists but is not a bridge" in str(exc.value)
    _run(["ip", "link", "del", net.bridge])
    net.init()
    other = "10.204.0.0/24" if str(net.subnet) != "10.204.0.0/24" else "10.204.1.0/24"
    with pytest.raises(PluginFailed) as exc:
        net.init(NETPLUGIN_BRIDGE_SUBNET=other)
    assert f"was created for subnet {net.subnet} but the configured subnet is {other}" in str(exc.value)
    out = _run(["ip", "-o", "-4", "addr", "show", "dev", net.bridge]).stdout
    assert [line.split()[3] for line in out.splitlines()] == [f"{net.gateway}/24"]  # bridge untouched


# --- setup / teardown / status ---------------------------------------------------------------------------


@kernel
def assert_port_settings(net: NativeNet, host_veth: str) -> None:
    """A pod's host veth: a port of the bridge, up, hairpin on, and no IPv6 address of its own."""
    sysfs = Path("/sys/class/net") / host_veth
    assert (sysfs / "brport" / "hairpin_mode").read_text().strip() == "1"
    assert (sysfs / "master").resolve().name == net.bridge
    assert int((sysfs / "flags").read_text(), 16) & 1  # IFF_UP
    assert Path(f"/proc/sys/net/ipv6/conf/{host_veth}/addr_gen_mode").read_text().strip() == "1"
    assert _run(["ip", "-6", "-o", "addr", "show", "dev", host_veth]).stdout == ""


@kernel
def test_a_failed_veth_creation_leaves_nothing(native_net: NativeNet) -> None:
    # The peer's name is taken in the pod netns: the whole batch (create, settings, up) fails at its first step.
    net = native_net
    pod = net.pod(0)
    net.setup(pod)
    bridge = int(Path(f"/sys/class/net/{net.bridge}/ifindex").read_text())
    before = sorted(net.bridge_ports())
    spare = pod.host_veth[:-1] + ("0" if pod.host_veth[-1] != "0" else "1")
    fd = os.open(pod.netns_path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        with RawNetlink() as nl, pytest.raises(OSError, match=f"add veth {spare}: File exists"):
            nl.add_veth(spare, "eth0", fd, 1500, bridge)
    finally:
        os.close(fd)
    assert not link_exists(spare)
    assert sorted(net.bridge_ports()) == before
    assert_port_settings(net, pod.host_veth)  # the batch's later steps did not touch another link


def test_three_pods_reach_each_other_and_teardown_removes_everything(native_net: NativeNet) -> None:
    net = native_net
    pods = net.pods(3)
    for p in pods:
        net.setup(p)
    ips = [net.pod_ip(p) for p in pods]
    assert ips == [str(net.subnet.network_address + n) for n in (2, 3, 4)]
    assert sorted(net.bridge_ports()) == sorted(p.host_veth for p in pods)
    for p, ip in zip(pods, ips, strict=True):
        assert (net.ipam / "pods" / p.infra_id).read_text() == f"{ip}/24 default {p.name}\n"
        assert (net.ipam / "ips" / ip).read_text() == f"{p.infra_id}\n"
        assert net.status(p) == PodNetworkStatus(ip=ip)
        assert_port_settings(net, p.host_veth)
        lo = _run(["ip", "-n", p.netns, "-o", "link", "show", "lo"]).stdout
        assert ",UP" in lo
    route = _run(["ip", "-n", pods[0].netns, "route", "show", "default"]).stdout
    assert route.strip() == f"default via {net.gateway} dev eth0"  # proto boot, like `ip route`

    assert_mesh(net, pods)

    for p in pods:
        net.teardown(p)
    assert_all_gone(net, pods)
    for p in pods:
        assert net.status(p) is None
        eth0 = _run(["ip", "-n", p.netns, "link", "show", "eth0"])
        assert eth0.returncode != 0


@kernel
def test_an_ipv4_pod_interface_sends_no_ipv6_multicast(native_net: NativeNet) -> None:
    """On a bridge without IPv6 the pod end gets no IPv6 link-local address, set before it is up.

    With one, it would join a solicited-node group and send MLD reports, a DAD probe and router
    solicitations: multicast that the bridge (no querier) floods to every pod present, so each
    pod start cost the node work that grows with the pods (the scale figure's growth)."""
    net = native_net
    pod, other = net.pods(2)
    net.setup(pod)
    net.setup(other)
    for p in (pod, other):
        assert _run(["ip", "-n", p.netns, "-6", "-o", "addr", "show", "dev", "eth0"]).stdout == ""
        assert "addrgenmode none" in _run(["ip", "-n", p.netns, "-d", "link", "show", "dev", "eth0"]).stdout
        groups = _run(["ip", "-n", p.netns, "-6", "maddr", "show", "dev", "eth0"]).stdout
        assert "ff02::1:ff" not in groups  # no solicited-node group: nothing to report, nothing to probe
    net.setup(pod)  # a repeated setup keeps it so
    assert _run(["ip", "-n", pod.netns, "-6", "-o", "addr", "show", "dev", "eth0"]).stdout == ""
    assert_mesh(net, [pod, other])


@kernel
def test_an_mtu_below_ipv6_minimum_leaves_no_ipv6_to_switch_off(native_factory: Callable[..., NativeNet]) -> None:
    """Below 1280 bytes a link has no IPv6 at all: "addr_gen_mode none" on either end is refused
    (EAFNOSUPPORT), which must not fail the setup."""
    net = native_factory()
    net.init(NETPLUGIN_BRIDGE_MTU="1200")
    pod, other = net.pods(2)
    for p in (pod, other):
        net.setup(p, NETPLUGIN_BRIDGE_MTU="1200")
        assert "mtu 1200" in _run(["ip", "-n", p.netns, "-o", "link", "show", "dev", "eth0"]).stdout
        assert _run(["ip", "-n", p.netns, "-6", "-o", "addr", "show", "dev", "eth0"]).stdout == ""
    assert_mesh(net, [pod, other])


@kernel
def test_setup_twice_keeps_the_address_and_the_link(native_net: NativeNet) -> None:
    net = native_net
    pod, other = net.pods(2)
    net.setup(pod)
    net.setup(other)
    first = net.pod_ip(pod)
    ifindex = Path(f"/sys/class/net/{pod.host_veth}/ifindex").read_text()
    Path(f"/sys/class/net/{pod.host_veth}/brport/hairpin_mode").write_text("0")
    net.setup(pod)
    assert net.pod_ip(pod) == first
    assert Path(f"/sys/class/net/{pod.host_veth}/ifindex").read_text() == ifindex
    assert_port_settings(net, pod.host_veth)  # the repeated setup sets hairpin again
    assert net.ipam_files("ips") == sorted([first, net.pod_ip(other)])
    assert_mesh(net, [pod, other])


@kernel
def test_setup_reports_the_pod_interface_mac(native_net: NativeNet) -> None:
    """The CNI result's MAC comes from setup (no second netns entry): it must be the pod's eth0's."""
    net = native_net
    pod = net.pod(0)
    made = net.plugin.setup(net.ref(pod), net.ctx(pod))
    words = _run(["ip", "-n", pod.netns, "-o", "link", "show", "dev", "eth0"]).stdout.split()
    assert made.mac == words[words.index("link/ether") + 1]
    again = net.plugin.setup(net.ref(pod), net.ctx(pod))  # the path that keeps an existing pair
    assert again.mac == made.mac


@kernel
def test_setup_repairs_a_pod_whose_configuration_was_lost(native_net: NativeNet) -> None:
    net = native_net
    pod = net.pod(0)
    net.setup(pod)
    ip = net.pod_ip(pod)
    _run(["ip", "-n", pod.netns, "addr", "flush", "dev", "eth0"])
    _run(["ip", "link", "set", pod.host_veth, "nomaster"])
    net.setup(pod)
    assert net.pod_ip(pod) == ip
    assert net.bridge_ports() == [pod.host_veth]
    assert net.ping_from(pod, [net.gateway]) == {net.gateway: True}


@kernel
def test_setup_replaces_a_stale_host_veth(native_net: NativeNet) -> None:
    # A leftover host veth of this infra id whose peer is not in the pod: deleted and made anew.
    net = native_net
    pod = net.pod(0)
    assert (
        _run(["ip", "link", "add", pod.host_veth, "type", "veth", "peer", "name", f"{pod.host_veth[:12]}p"]).returncode
        == 0
    )
    old = Path(f"/sys/class/net/{pod.host_veth}/ifindex").read_text()
    net.setup(pod)
    assert Path(f"/sys/class/net/{pod.host_veth}/ifindex").read_text() != old
    assert net.status(pod) == PodNetworkStatus(ip=net.pod_ip(pod))


@kernel
def test_setup_refuses_a_foreign_interface_in_the_pod(native_net: NativeNet) -> None:
    net = native_net
    pod = net.pod(0)
    assert _run(["ip", "-n", pod.netns, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p"]).returncode == 0
    with pytest.raises(PluginFailed) as exc:
        net.setup(pod)
    assert "eth0" in str(exc.value) and "File exists" in str(exc.value)
    assert_all_gone(net, [pod])
    # With a leftover host veth of the pod too, the message names the conflict.
    assert (
        _run(["ip", "link", "add", pod.host_veth, "type", "veth", "peer", "name", f"{pod.host_veth[:12]}p"]).returncode
        == 0
    )
    with pytest.raises(PluginFailed) as exc:
        net.setup(pod)
    assert f"eth0 already exists in {pod.netns_path} and is not the peer of {pod.host_veth}" in str(exc.value)
    assert net.ipam_files("pods") == []


@kernel
def test_teardown_is_idempotent(native_net: NativeNet) -> None:
    net = native_net
    pod = net.pod(0)
    net.teardown(pod)  # never set up
    net.setup(pod)
    net.teardown(pod)
    net.teardown(pod)
    assert_all_gone(net, [pod])


@kernel
def test_teardown_after_the_netns_is_gone(native_net: NativeNet) -> None:
    net = native_net
    pod = net.pod(0)
    net.setup(pod)
    ip = net.pod_ip(pod)
    _run(["ip", "netns", "del", pod.netns])
    net.teardown(pod)  # the veth may still be dying with the netns: deleted or waited for, then released
    assert net.wait_gone(pod.host_veth)
    assert not (net.ipam / "ips" / ip).exists()
    assert_all_gone(net, [pod])
    assert net.status(pod) is None


@kernel
def test_teardown_after_the_veth_is_gone(native_net: NativeNet) -> None:
    net = native_net
    pod = net.pod(0)
    net.setup(pod)
    _run(["ip", "link", "del", pod.host_veth])
    assert net.status(pod) is None  # eth0 went with its peer
    net.teardown(pod)
    assert_all_gone(net, [pod])


# --- teardown answers before the kernel's deletion ----------------------------------------------------------


@pytest.fixture
def held_deletion(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """The reaper's deletion waits until the returned event is set (so the state at the answer holds still)."""
    gate = threading.Event()
    real = RawNetlink.delete_retired

    def held(self: RawNetlink) -> None:
        gate.wait(30)
        real(self)

    monkeypatch.setattr(RawNetlink, "delete_retired", held)
    yield gate
    gate.set()


def _link_state(name: str) -> tuple[bool, int]:
    """(up, link group) of root-netns link ``name``."""
    with RawNetlink() as nl:
        found = nl.link(name)
        assert found is not None, name
        group = nl.group_of(found[0])
    flags = int(Path(f"/sys/class/net/{name}/flags").read_text(), 16)
    return bool(flags & 1), group if group is not None else -1


@kernel
def test_teardown_answers_with_the_pod_off_the_network_and_its_address_free(
    native_factory: Callable[..., NativeNet], held_deletion: threading.Event
) -> None:
    net = native_factory(30)  # one pod address: the next pod can only get the old one
    net.init()
    old, new = net.pod(0), net.pod(1)
    net.setup(old)
    ip = net.pod_ip(old)
    assert net.ping_from(old, [net.gateway]) == {net.gateway: True}
    net.teardown(old)
    # Answered, the deletion not done: the host end is down and retired, the old pod cut off.
    assert _link_state(old.host_veth) == (False, retired_group())
    assert old.host_veth in net.plugin.reaper.pending
    assert net.ping_from(old, [net.gateway]) == {net.gateway: False}
    # ... so its address went back to the pool, and the next pod gets it and works at once.
    net.setup(new)
    assert net.pod_ip(new) == ip
    assert net.ping_from(new, [net.gateway]) == {net.gateway: True}
    assert list_pods(str(net.np_state), str(net.np_state / "run")).deleting.count(old.host_veth) == 1
    held_deletion.set()
    net.plugin.reaper.settle(old.host_veth, 10)
    assert not link_exists(old.host_veth)
    assert net.bridge_ports() == [new.host_veth]
    net.teardown(new)
    assert_all_gone(net, [new])


@kernel
def test_the_same_pod_set_up_again_right_after_its_teardown(native_net: NativeNet) -> None:
    net = native_net
    pod = net.pod(0)
    for _ in range(5):  # the runtime's ADD of the same container ID right after its DEL
        net.setup(pod)
        assert _link_state(pod.host_veth) == (True, 0)
        assert net.ping_from(pod, [net.gateway]) == {net.gateway: True}
        net.teardown(pod)
    assert_all_gone(net, [pod])


@kernel
def test_a_setup_waits_for_its_old_veth_to_be_deleted(native_net: NativeNet, held_deletion: threading.Event) -> None:
    net = native_net
    pod = net.pod(0)
    net.setup(pod)
    net.teardown(pod)
    done = threading.Event()
    worker = threading.Thread(target=lambda: (net.setup(pod), done.set()))
    worker.start()
    try:
        assert not done.wait(0.5), "the setup reused a veth that is being deleted"
    finally:
        held_deletion.set()
        worker.join(30)
    assert done.is_set()
    assert _link_state(pod.host_veth) == (True, 0)
    assert net.ping_from(pod, [net.gateway]) == {net.gateway: True}
    net.teardown(pod)
    assert_all_gone(net, [pod])


_DIE_AFTER_TEARDOWN = """
import json, os, signal, sys, threading
from netplugin.core.names import PodRef
from netplugin.core.netlink import RawNetlink, retired_group
from netplugin.core.plugin import CallContext
from netplugin.plugins.bridge.bridge_plugin import NativeBridgePlugin

args = json.loads(sys.argv[1])
RawNetlink.delete_retired = lambda self: threading.Event().wait()  # the process dies before it deletes
plugin = NativeBridgePlugin(state_dir=args["state"])
for ns, name, infra, netns in args["pods"]:
    plugin.teardown(PodRef(ns, name, infra), CallContext(netns=netns, env=args["env"], state_dir=args["state"],
                                                         timeout=30))
print("answered", os.getpid(), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@kernel
def test_a_crash_between_the_answer_and_the_deletion(native_factory: Callable[..., NativeNet], tmp_path: Path) -> None:
    from netplugin.core.config import load_config
    from netplugin.hosts.base import NullHost
    from netplugin.manager.gc import run_gc
    from netplugin.manager.manager import Manager

    net = native_factory()
    net.init()
    again, left = net.pod(0), net.pod(1)
    for p in (again, left):
        net.setup(p)
    args = {"state": str(net.np_state), "env": net.env,
            "pods": [[p.namespace, p.name, p.infra_id, f"/run/netns/{p.netns}"] for p in (again, left)]}  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    done = subprocess.run([sys.executable, "-c", _DIE_AFTER_TEARDOWN, json.dumps(args)], capture_output=True,
                          text=True, timeout=60, env=env)  # fmt: skip
    assert (done.returncode, done.stdout.split()[0]) == (-9, "answered"), done.stderr
    for p in (again, left):  # off the network, never deleted
        assert _link_state(p.host_veth) == (False, retired_group(int(done.stdout.split()[1])))
    assert net.ipam_files("pods") == []
    # `netplugin pods` says so; a setup of the same pod deletes its retired veth before its own.
    assert {again.host_veth, left.host_veth} <= set(list_pods(str(net.np_state), str(tmp_path)).deleting)
    net.setup(again)
    assert _link_state(again.host_veth) == (True, 0)
    assert net.ping_from(again, [net.gateway]) == {net.gateway: True}
    # gc deletes the other and says so.
    empty = tmp_path / "netplugin.yaml"
    empty.write_text("")
    overrides = {"plugin": "netplugin.io/bridge", "state_dir": str(net.np_state), "run_dir": str(tmp_path / "run"),
                 "plugin_dir": str(tmp_path / "exec"),
                 "env": {k: v for k, v in net.env.items() if k.startswith("NETPLUGIN_BRIDGE_")}}  # fmt: skip
    m = Manager(load_config(str(empty), environ={}, overrides=overrides), NullHost(), environ={})
    report = run_gc(m, check_host=False)
    mine = [a for a in report.actions if a.target == left.host_veth]
    assert [(a.kind, a.outcome) for a in mine] == [("delete-link", "done")], report.text()
    assert f"deleted link {left.host_veth}: taken off the network by a teardown of process" in report.text()
    assert not link_exists(left.host_veth)
    assert left.host_veth not in list_pods(str(net.np_state), str(tmp_path)).deleting
    net.teardown(again)
    assert_all_gone(net, [again, left])


@kernel
def test_setup_with_a_missing_netns_fails_cleanly(native_net: NativeNet) -> None:
    net = native_net
    pod = net.pod("gone", create_netns=False)
    with pytest.raises(PluginFailed) as exc:
        net.setup(pod)
    assert f"network namespace {pod.netns_path} does not exist" in str(exc.value)
    assert exc.value.plugin == "netplugin.io/bridge" and exc.value.action == "setup"
    assert not os.path.exists(pod.netns_path)  # never created behind our back (pyroute2's default)
    assert_all_gone(net, [pod])
    assert net.status(pod) is None


@kernel
def test_setup_with_a_path_that_is_not_a_netns_rolls_back_the_address(native_net: NativeNet, tmp_path: Path) -> None:
    net = native_net
    pod = net.pod("file", create_netns=False)
    bogus = tmp_path / "not-a-netns"
    bogus.write_text("")
    with pytest.raises(PluginFailed) as exc:
        net.plugin.setup(net.ref(pod), net.ctx(pod, netns=str(bogus)))
    assert "failed to" in str(exc.value)
    assert_all_gone(net, [pod])
    with pytest.raises(PluginFailed):
        net.plugin.status(net.ref(pod), net.ctx(pod, netns=str(bogus)))


@kernel
def test_setup_recreates_a_missing_bridge(native_factory: Callable[..., NativeNet]) -> None:
    net = native_factory()  # no init
    pod = net.pod(0)
    net.setup(pod)
    assert net.bridge_ports() == [pod.host_veth]
    assert_mesh(net, [pod])


@kernel
def test_setup_applies_mtu_and_ifname(native_net: NativeNet) -> None:
    net = native_net
    pod = net.pod(0)
    env = {"NETPLUGIN_BRIDGE_MTU": "1400", "NETPLUGIN_BRIDGE_IFNAME": "net0"}
    net.setup(pod, **env)
    assert Path(f"/sys/class/net/{pod.host_veth}/mtu").read_text().strip() == "1400"
    out = _run(["ip", "-n", pod.netns, "-o", "link", "show", "net0"]).stdout
    assert "mtu 1400" in out and "LOWER_UP" in out
    assert net.status(pod, **env) == PodNetworkStatus(ip=str(net.subnet.network_address + 2))
    assert net.status(pod) is None  # no eth0 in there
    net.teardown(pod, **env)
    assert_all_gone(net, [pod])


@kernel
def test_subnet_exhaustion_fails_cleanly(native_factory: Callable[..., NativeNet]) -> None:
    net = native_factory(prefixlen=29)  # .1 gateway, .2-.6 pods
    net.init()
    pods = net.pods(6)
    for p in pods[:5]:
        net.setup(p)
    last = pods[5]
    with pytest.raises(PluginFailed) as exc:
        net.setup(last)
    assert f"no free address in {net.subnet}" in str(exc.value)
    assert not link_exists(last.host_veth)
    assert not (net.ipam / "pods" / last.infra_id).exists()
    assert len(net.ipam_files("ips")) == 5
    freed = net.pod_ip(pods[2])
    net.teardown(pods[2])
    net.setup(last)  # the cursor wraps around to the freed address
    assert net.pod_ip(last) == freed
    assert_mesh(net, [pods[0], last])


@kernel
def test_concurrent_setups_and_teardowns_from_threads(native_net: NativeNet) -> None:
    net = native_net
    pods = net.pods(20)
    barrier = threading.Barrier(len(pods))

    def call(action: Callable[[Pod], object], pod: Pod) -> None:
        barrier.wait()
        action(pod)

    with ThreadPoolExecutor(len(pods)) as ex:
        list(ex.map(lambda p: call(net.setup, p), pods))
    ips = [net.pod_ip(p) for p in pods]
    assert len(set(ips)) == 20
    assert net.ipam_files("ips") == sorted(ips)
    assert sorted(net.bridge_ports()) == sorted(p.host_veth for p in pods)
    assert all(net.status(p) == PodNetworkStatus(ip=ip) for p, ip in zip(pods, ips, strict=True))
    assert_mesh(net, pods[:4])

    barrier.reset()
    before = net.plugin.reaper.batches
    with ThreadPoolExecutor(len(pods)) as ex:
        list(ex.map(lambda p: call(net.teardown, p), pods))
    assert_all_gone(net, pods)
    # The 20 deletions overlapped: they shared kernel requests.
    assert net.plugin.reaper.batches - before < 20


@kernel
def test_threads_never_stay_in_a_pod_netns(native_net: NativeNet) -> None:
    net = native_net
    pod = net.pod(0)
    root = os.stat("/proc/self/ns/net").st_ino
    seen: set[int] = set()

    def work(_: int) -> None:
        for _ in range(50):
            netns_socket(pod.netns_path).close()
            seen.add(os.stat("/proc/thread-self/ns/net").st_ino)
        with pytest.raises(FileNotFoundError):
            netns_socket(f"/var/run/netns/np-missing-{os.getpid()}")
        with pytest.raises(OSError):
            netns_socket("/proc/self/stat")  # not a namespace: EINVAL from setns
        seen.add(os.stat("/proc/thread-self/ns/net").st_ino)

    with ThreadPoolExecutor(8) as ex:
        list(ex.map(work, range(8)))
    assert seen == {root}
    assert not os.path.exists(f"/var/run/netns/np-missing-{os.getpid()}")


@kernel
def test_reaper_deletes_many_links_in_one_request(native_factory: Callable[..., NativeNet]) -> None:
    net = native_factory()
    names = [f"np{net.tag}d{i:02d}" for i in range(12)]
    net.extra_links.extend(names)
    for n in names:
        assert _run(["ip", "link", "add", n, "type", "veth", "peer", "name", n + "p"]).returncode == 0
    indexes = [int(Path(f"/sys/class/net/{n}/ifindex").read_text()) for n in names]
    with RawNetlink() as nl:
        assert nl.delete_links([*indexes, 2**31 - 7]) == {}  # an unknown index is "already gone"
    assert [n for n in names if link_exists(n)] == []
    # Group number left over on nothing: a later group delete with no members is not an error.
    reaper = LinkReaper()
    assert _run(["ip", "link", "add", names[0], "type", "veth", "peer", "name", names[0] + "p"]).returncode == 0
    reaper.delete(names[0], int(Path(f"/sys/class/net/{names[0]}/ifindex").read_text()), 10)
    assert not link_exists(names[0])
    assert (reaper.batches, reaper.links) == (1, 1)


@kernel
def test_hairpin_over_netlink(native_net: NativeNet) -> None:
    # The sysfs-less path the plugin falls back to.
    net = native_net
    pod = net.pod(0)
    net.setup(pod)
    hairpin = Path(f"/sys/class/net/{pod.host_veth}/brport/hairpin_mode")
    hairpin.write_text("0")
    with RawNetlink() as nl:
        nl.hairpin(int(Path(f"/sys/class/net/{pod.host_veth}/ifindex").read_text()))
    assert hairpin.read_text().strip() == "1"


@kernel
def test_through_the_manager(native_factory: Callable[..., NativeNet], tmp_path: Path) -> None:
    from netplugin.core.config import load_config
    from netplugin.hosts.base import NullHost
    from netplugin.manager.manager import Manager

    net = native_factory()
    infra = f"np-{net.tag}-m"
    net.add_netns("m")
    net.infra_ids.append(infra)
    bridge_env = {k: v for k, v in net.env.items() if k.startswith("NETPLUGIN_BRIDGE_")}
    empty = tmp_path / "netplugin.yaml"
    empty.write_text("")
    cfg = load_config(
        str(empty),
        environ={},
        overrides={
            "plugin": "netplugin.io/bridge",
            "state_dir": str(net.np_state),
            "run_dir": str(tmp_path / "run"),
            "plugin_dir": str(tmp_path / "exec"),
            "env": bridge_env,
        },
    )
    m = Manager(cfg, NullHost(), environ={})
    ref = PodRef("default", "web-0", infra)
    made = m.setup(ref)
    # the chain passes the MAC the member reported on (the CNI result's interface MAC)
    words = _run(["ip", "-n", f"np-{net.tag}-m", "-o", "link", "show", "dev", "eth0"]).stdout.split()
    assert made is not None and made.mac == words[words.index("link/ether") + 1]
    st = m.status(ref)
    assert st is not None and st.ip == str(net.subnet.network_address + 2)
    assert net.bridge_ports() == [host_veth_name(infra)]
    m.teardown(ref)
    assert net.wait_gone(host_veth_name(infra))  # deleted after the answer
    assert net.bridge_ports() == [] and net.ipam_files("pods") == []
    assert m.status(ref) is None


# --- interop with the bash plugin --------------------------------------------------------------------------


@kernel
def test_bash_sets_up_native_reports_and_tears_down(native_net: NativeNet) -> None:
    net = native_net
    pods = net.pods(2)
    for p in pods:
        net.ok("setup", p)
    ips = [net.pod_ip(p) for p in pods]
    for p, ip in zip(pods, ips, strict=True):
        assert net.status(p) == PodNetworkStatus(ip=ip)
        net.setup(p)  # setup again with the other plugin: same pair, same address
        assert net.pod_ip(p) == ip
    assert sorted(net.bridge_ports()) == sorted(p.host_veth for p in pods)
    assert_mesh(net, pods)
    for p in pods:
        net.teardown(p)
    assert_all_gone(net, pods)


@kernel
def test_native_sets_up_bash_reports_and_tears_down(native_net: NativeNet) -> None:
    net = native_net
    pods = net.pods(2)
    for p in pods:
        net.setup(p)
    ips = [net.pod_ip(p) for p in pods]
    for p, ip in zip(pods, ips, strict=True):
        assert net.status_ip(p) == ip  # the bash plugin's status
        net.ok("setup", p)
        assert net.pod_ip(p) == ip
    assert_mesh(net, pods)
    for p in pods:
        net.ok("teardown", p)
    assert_all_gone(net, pods)


@kernel
def test_both_plugins_allocate_from_one_ipam_concurrently(native_net: NativeNet) -> None:
    net = native_net
    pods = net.pods(16)
    native_pods, bash_pods = pods[::2], pods[1::2]
    barrier = threading.Barrier(len(pods))

    def go(p: Pod) -> None:
        barrier.wait()
        if p in native_pods:
            net.setup(p)
        else:
            net.ok("setup", p)

    with ThreadPoolExecutor(len(pods)) as ex:
        list(ex.map(go, pods))
    ips = [net.pod_ip(p) for p in pods]
    assert len(set(ips)) == 16
    assert net.ipam_files("ips") == sorted(ips)
    assert_mesh(net, [native_pods[0], bash_pods[0], native_pods[1]])
    barrier = threading.Barrier(len(pods))

    def down(p: Pod) -> None:
        barrier.wait()
        if p in bash_pods:  # crossed over: each plugin tears down the other's pods
            net.teardown(p)
        else:
            net.ok("teardown", p)

    with ThreadPoolExecutor(len(pods)) as ex:
        list(ex.map(down, pods))
    assert_all_gone(net, pods)


@kernel
def test_bash_init_then_native_init(native_factory: Callable[..., NativeNet]) -> None:
    net = native_factory()
    net.ok("init")
    mac = Path(f"/sys/class/net/{net.bridge}/address").read_text()
    net.init()
    assert Path(f"/sys/class/net/{net.bridge}/address").read_text() == mac
    out = _run(["ip", "-o", "-4", "addr", "show", "dev", net.bridge]).stdout
    assert [line.split()[3] for line in out.splitlines()] == [f"{net.gateway}/24"]


@pytest.mark.parametrize("first", ["bash", "native"])
def test_a_bridge_made_again_has_the_mac_derived_from_its_name(
    native_factory: Callable[..., NativeNet], first: str
) -> None:
    """Either plugin creates the bridge with the same MAC, so one made again by a repair (or by the
    other plugin) keeps the MAC in the pods' neighbour entries for the gateway."""
    net = native_factory()
    inits = {"bash": lambda: net.ok("init"), "native": net.init}
    inits[first]()
    want = bridge_mac(net.bridge)
    assert Path(f"/sys/class/net/{net.bridge}/address").read_text().strip() == want
    _run(["ip", "link", "del", net.bridge])
    inits["native" if first == "bash" else "bash"]()
    assert Path(f"/sys/class/net/{net.bridge}/address").read_text().strip() == want


# --- measurements (printed, not asserted) -------------------------------------------------------------------


def _median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


@kernel
def test_measure_per_pod_costs(native_factory: Callable[..., NativeNet]) -> None:
    net = native_factory(prefixlen=24)
    net.init()
    n = 30
    pods = net.pods(n)  # netns creation is not timed
    setup_t, teardown_t = [], []
    for p in pods:
        t0 = time.perf_counter()
        net.setup(p)
        setup_t.append(time.perf_counter() - t0)
    assert len(set(net.ipam_files("ips"))) == n
    for p in pods:
        t0 = time.perf_counter()
        net.teardown(p)
        teardown_t.append(time.perf_counter() - t0)
    assert_all_gone(net, pods)

    bash_pods = [net.pod(f"b{i}") for i in range(n)]
    bash_setup, bash_teardown = [], []
    for p in bash_pods:
        t0 = time.perf_counter()
        net.ok("setup", p)
        bash_setup.append(time.perf_counter() - t0)
    for p in bash_pods:
        t0 = time.perf_counter()
        net.ok("teardown", p)
        bash_teardown.append(time.perf_counter() - t0)
    assert_all_gone(net, bash_pods)

    big = native_factory(prefixlen=24)
    big.init()
    many = [big.pod(i) for i in range(100)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(16) as ex:
        list(ex.map(big.setup, many))
    par_setup = time.perf_counter() - t0
    barrier = threading.Barrier(len(many))

    def down(p: Pod) -> float:
        barrier.wait()
        s = time.perf_counter()
        big.teardown(p)
        return time.perf_counter() - s

    b0 = big.plugin.reaper.batches
    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(many)) as ex:
        each = list(ex.map(down, many))
    coalesced = time.perf_counter() - t0
    batches = big.plugin.reaper.batches - b0
    assert_all_gone(big, many)

    print(
        "\n[native bridge per-pod costs]\n"
        f"  native, one process, {n} pods: setup median {_median_ms(setup_t):.2f} ms, "
        f"teardown median {_median_ms(teardown_t):.2f} ms (sequential: one kernel deletion each)\n"
        f"  bash plugin exec per action, {n} pods: setup median {_median_ms(bash_setup):.2f} ms, "
        f"teardown median {_median_ms(bash_teardown):.2f} ms\n"
        f"  native, 100 pods set up from 16 threads: {par_setup * 1000:.0f} ms total, "
        f"{par_setup * 10:.2f} ms/pod\n"
        f"  native, 100 concurrent teardowns (coalesced): {coalesced * 1000:.0f} ms total, "
        f"{coalesced * 10:.2f} ms/pod, {batches} kernel batches, per-call median {_median_ms(each):.1f} ms"
    )
