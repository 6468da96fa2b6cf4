"""The bash bridge plugin with IPv4 and IPv6 (dual stack) and with SUBNET=node (issue 11).

Real namespaces, veths and a bridge in the host netns (names "np" + random hex, 10.205.X.0/24 and
fd00:10:205:X::/64, see tests/support/dualnet.py), checked with iproute2, the IPAM files and real TCP
traffic over both families; the forwarding test runs init inside a namespace of its own.
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.bridgenet import BRIDGE, BridgeNet
from tests.support.dualnet import DualNet, pod_addrs, pod_default_routes

pytestmark = pytest.mark.kernel


@pytest.fixture
def dual(bridge_net_factory: Callable[..., BridgeNet]) -> Callable[..., DualNet]:
    def make(prefixlen: int = 24, v6_prefixlen: int = 64) -> DualNet:
        cls = type("Dual", (DualNet,), {"v6_prefixlen": v6_prefixlen})
        net = bridge_net_factory(prefixlen, cls=cls)
        assert isinstance(net, DualNet)
        return net

    return make


def test_dual_stack_pods_reach_each_other_at_once(dual: Callable[..., DualNet]) -> None:
    net = dual()
    net.ok("init")
    addrs = subprocess.run(["ip", "-o", "addr", "show", "dev", net.bridge], capture_output=True, text=True).stdout
    assert f"inet {net.gateway}/24" in addrs and f"inet6 {net.gateway6}/64 scope global nodad" in addrs
    assert Path(f"/proc/sys/net/ipv6/conf/{net.bridge}/accept_dad").read_text().strip() == "0"

    pods = net.pods(3)
    for p in pods:
        net.ok("setup", p)
    for i, p in enumerate(pods):
        assert pod_addrs(p) == {4: [f"{net.subnet.network_address + 2 + i}/24"],
                                6: [f"{net.subnet6.network_address + 2 + i}/64"]}
        assert pod_default_routes(p) == {4: f"default via {net.gateway} dev eth0",
                                         6: f"default via {net.gateway6} dev eth0"}
        doc = json.loads(net.ok("status", p).stdout)
        v4, v6 = str(net.subnet.network_address + 2 + i), str(net.subnet6.network_address + 2 + i)
        assert doc == {"apiVersion": "v1beta1", "kind": "PodNetworkStatus", "ip": v4, "ips": [v4, v6]}
    # No sleep: IPv6 addresses are usable as soon as setup returns (nodad).
    net.assert_mesh(pods)

    for p in pods:
        net.ok("teardown", p)
    assert net.ipam_files("ips") == net.ipam_files("pods") == []
    assert net.ipam6_files("ips") == net.ipam6_files("pods") == []
    assert net.bridge_ports() == []


def test_ipam_files_per_family_and_repeated_setup(dual: Callable[..., DualNet]) -> None:
    net = dual()
    net.ok("init")
    pod = net.pod(0)
    net.ok("setup", pod)
    net.ok("setup", pod)  # idempotent: same addresses, no second allocation
    v4, v6 = str(net.subnet.network_address + 2), str(net.subnet6.network_address + 2)
    assert (net.ipam / "subnet").read_text() == f"{net.subnet}\n"
    assert (net.ipam6 / "subnet").read_text() == f"{net.subnet6}\n"
    assert (net.ipam / "ips" / v4).read_text() == f"{pod.infra_id}\n"
    assert (net.ipam6 / "ips" / v6).read_text() == f"{pod.infra_id}\n"
    assert (net.ipam / "pods" / pod.infra_id).read_text() == f"{v4}/24 default pod-0\n"
    assert (net.ipam6 / "pods" / pod.infra_id).read_text() == f"{v6}/64 default pod-0\n"
    assert (net.ipam6 / "cursor").read_text() == f"{v6:<39}\n"
    assert pod_addrs(pod) == {4: [f"{v4}/24"], 6: [f"{v6}/64"]}


@pytest.mark.parametrize("family", [4, 6])
def test_exhaustion_per_family_rolls_back_the_other(dual: Callable[..., DualNet], family: int) -> None:
    # /30 holds one IPv4 pod, /126 two IPv6 pods; the other family is roomy.
    net = dual(prefixlen=30) if family == 4 else dual(v6_prefixlen=126)
    net.ok("init")
    fit = 1 if family == 4 else 2
    pods = net.pods(fit + 1)
    for p in pods[:fit]:
        net.ok("setup", p)
    r = net.run("setup", pods[fit])
    full = net.subnet if family == 4 else net.subnet6
    assert r.returncode == 1
    assert f"no free address in {full} (all {fit} pod addresses are allocated)" in r.stderr
    # Nothing of the failed pod is left: no address of either family, no veth.
    assert pods[fit].infra_id not in net.ipam_files("pods") + net.ipam6_files("pods")
    assert len(net.ipam_files("ips")) == len(net.ipam6_files("ips")) == fit
    assert pods[fit].host_veth not in net.bridge_ports()
    # Freeing one pod makes room again, in both families.
    net.ok("teardown", pods[0])
    net.ok("setup", pods[fit])
    assert len(pod_addrs(pods[fit])[4]) == len(pod_addrs(pods[fit])[6]) == 1


def test_ipv6_only_and_ipv6_primary(dual: Callable[..., DualNet]) -> None:
    net = dual()
    net.ok("init", env={"NETPLUGIN_BRIDGE_SUBNET": str(net.subnet6)})
    pod = net.pod(0)
    net.ok("setup", pod, env={"NETPLUGIN_BRIDGE_SUBNET": str(net.subnet6)})
    v6 = str(net.subnet6.network_address + 2)
    assert pod_addrs(pod) == {4: [], 6: [f"{v6}/64"]}
    assert json.loads(net.ok("status", pod, env={"NETPLUGIN_BRIDGE_SUBNET": str(net.subnet6)}).stdout)["ip"] == v6
    net.ok("teardown", pod, env={"NETPLUGIN_BRIDGE_SUBNET": str(net.subnet6)})
    assert net.ipam6_files("pods") == []

    # IPv6 first in SUBNET: the primary family, reported first.
    swapped = {"NETPLUGIN_BRIDGE_SUBNET": f"{net.subnet6},{net.subnet}"}
    other = net.pod(1)
    net.ok("setup", other, env=swapped)
    doc = json.loads(net.ok("status", other, env=swapped).stdout)
    assert doc["ip"] == doc["ips"][0] and ":" in doc["ip"] and "." in doc["ips"][1]


def test_teardown_frees_a_family_dropped_from_the_settings(dual: Callable[..., DualNet]) -> None:
    net = dual()
    net.ok("init")
    pod = net.pod(0)
    net.ok("setup", pod)
    net.ok("teardown", pod, env={"NETPLUGIN_BRIDGE_SUBNET": str(net.subnet)})
    assert net.ipam_files("pods") == net.ipam6_files("pods") == []
    assert net.ipam6_files("ips") == []


def test_subnet_node_takes_the_node_pod_cidrs(dual: Callable[..., DualNet]) -> None:
    net = dual()
    node = {"NETPLUGIN_BRIDGE_SUBNET": "node", "NETPLUGIN_NODE_POD_CIDRS": f"{net.subnet},{net.subnet6}"}
    cfg = dict(line.split("=", 1) for line in net.ok("config", env=node).stdout.splitlines())
    assert cfg["NETPLUGIN_BRIDGE_SUBNET"] == f"{net.subnet},{net.subnet6}"
    assert cfg["NETPLUGIN_BRIDGE_GATEWAY"] == f"{net.gateway},{net.gateway6}"
    net.ok("init", env=node)
    pod = net.pod(0)
    net.ok("setup", pod, env=node)
    assert pod_addrs(pod) == {4: [f"{net.subnet.network_address + 2}/24"],
                              6: [f"{net.subnet6.network_address + 2}/64"]}
    net.ok("teardown", pod, env=node)


@pytest.mark.parametrize(
    ("cidrs", "message"),
    [
        ("", "NETPLUGIN_BRIDGE_SUBNET is 'node' but NETPLUGIN_NODE_POD_CIDRS is not set"),
        ("10.205.0.0/33", "invalid NETPLUGIN_NODE_POD_CIDRS '10.205.0.0/33' (from NETPLUGIN_BRIDGE_SUBNET=node): "
                          "prefix length must be 8-30"),
        ("10.205.0.0/24,10.205.1.0/24", "more than one IPv4 network (at most one per family)"),
        ("fd00:10:205::1/64", "host bits are set (did you mean fd00:10:205::/64?)"),
    ],
)
def test_subnet_node_bad_values_name_the_variable(dual: Callable[..., DualNet], cidrs: str, message: str) -> None:
    net = dual()
    for action in ("config", "init"):
        r = net.run(action, env={"NETPLUGIN_BRIDGE_SUBNET": "node", "NETPLUGIN_NODE_POD_CIDRS": cidrs})
        assert r.returncode == 1 and message in r.stderr, r.stderr
    assert not (net.ipam).exists()  # refused before anything was touched


def test_init_enables_forwarding_per_family_in_its_netns(tmp_path: Path) -> None:
    # In a namespace of our own: forwarding is a per-namespace switch, never the machine's.
    ns = f"np-{secrets.token_hex(3)}-fwd"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        env = {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "NETPLUGIN_STATE_DIR": f"{tmp_path}/state",
            "NETPLUGIN_BRIDGE_NAME": "npfwd0",
            "NETPLUGIN_BRIDGE_SUBNET": "10.205.0.0/24,fd00:10:205::/64",
            "NETPLUGIN_BRIDGE_IP_FORWARD": "true",
        }
        r = subprocess.run(["ip", "netns", "exec", ns, str(BRIDGE), "init"], env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        sysctl = subprocess.run(
            ["ip", "netns", "exec", ns, "sysctl", "-n", "net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding"],
            capture_output=True, text=True,
        ).stdout.split()
        assert sysctl == ["1", "1"]
    finally:
        subprocess.run(["ip", "netns", "del", ns])


def test_teardown_and_status_work_after_the_node_lost_its_cidrs(dual: Callable[..., DualNet]) -> None:
    # The Node object was deleted: netplugin passes NETPLUGIN_NODE_POD_CIDRS empty. Setup must
    # refuse, teardown must still free the pod (its records say what to release).
    net = dual()
    node = {"NETPLUGIN_BRIDGE_SUBNET": "node", "NETPLUGIN_NODE_POD_CIDRS": f"{net.subnet},{net.subnet6}"}
    net.ok("init", env=node)
    pod = net.pod(0)
    net.ok("setup", pod, env=node)
    gone = dict(node, NETPLUGIN_NODE_POD_CIDRS="")
    assert net.run("setup", net.pod(1), env=gone).returncode == 1
    assert json.loads(net.ok("status", pod, env=gone).stdout)["ips"] == [
        str(net.subnet.network_address + 2), str(net.subnet6.network_address + 2)]
    net.ok("teardown", pod, env=gone)
    assert net.ipam_files("pods") == net.ipam6_files("pods") == net.ipam6_files("ips") == []
    assert net.bridge_ports() == []


def test_settings_only_in_files_load_the_sections_setup_skips(dual: Callable[..., DualNet], tmp_path: Path) -> None:
    # An IPv4-looking environment runs setup from the script's first dispatch line, which parses
    # neither the settings-file reader nor the IPv6 helpers: the files (dual stack) must load them.
    net = dual()
    install = tmp_path / "bridge"
    install.mkdir()
    exe = install / "bridge"
    shutil.copy2(BRIDGE, exe)
    (install / "bridge.conf").write_text(f"SUBNET={net.subnet},{net.subnet6}\n")
    extra = tmp_path / "extra.conf"
    extra.write_text("MTU=1400\n")
    env = {"NETPLUGIN_BRIDGE_SUBNET": "", "NETPLUGIN_BRIDGE_CONF": str(extra)}
    net.ok("init", plugin=exe, env=env)
    pod = net.pod(0)
    r = net.ok("setup", pod, plugin=exe, env=env)
    assert r.stderr == ""
    v4, v6 = str(net.subnet.network_address + 2), str(net.subnet6.network_address + 2)
    assert json.loads(r.stdout)["ips"] == [v4, v6]
    assert pod_addrs(pod) == {4: [f"{v4}/24"], 6: [f"{v6}/64"]}
    assert Path(f"/sys/class/net/{pod.host_veth}/mtu").read_text().strip() == "1400"
    r = net.ok("status", pod, plugin=exe, env=env)
    assert (json.loads(r.stdout)["ips"], r.stderr) == ([v4, v6], "")
    r = net.ok("teardown", pod, plugin=exe, env=env)
    assert r.stderr == ""
    assert net.ipam_files("pods") == net.ipam6_files("pods") == net.ipam6_files("ips") == []
    assert net.bridge_ports() == []
