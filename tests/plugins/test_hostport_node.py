"""The hostport members on a real node: a node netns of the test's own with the native bridge and a
pod behind it, then the bash ``hostport`` or the built-in ``netplugin.io/hostport`` (one table of cases
for both).

* The localhost setting (``NETPLUGIN_HOSTPORT_LOCALHOST``): on (the default, as Kubernetes' portmap),
  the node's own 127.0.0.1:hostPort answers from the pod, with ``route_localnet`` on the pod's bridge
  and on no other link, and kube-proxy's guard in the table keeps a pod off what the node binds to
  localhost; off, 127.0.0.1 is not mapped (refused) and ``route_localnet`` stays off.
  Either way the node's own address answers, from the node and from the underlay.
* Stale UDP: a UDP flow to the host port that predates the mapping has a conntrack entry (not
  DNATed); the setup deletes it, so the same flow (same source port) then reaches the pod.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from netplugin.core.hostports import ENV_LOCALHOST
from netplugin.plugins.hostport import chain_name
from tests.support.nettest import ip_in
from tests.support.nodebridge import NodeBridge
from tests.support.portcheck import Server, ask

from .test_hostport import call

pytestmark = pytest.mark.kernel
KINDS = ["bash", "native"]


@pytest.fixture
def node(node_factory: Callable[[str], NodeBridge]) -> NodeBridge:
    n = node_factory("native")
    n.init()
    return n


def hostport(node: NodeBridge, kind: str, tmp: Path, action: str, *pod: str, **env: str) -> None:
    done = call(node.node, kind, tmp, action, *pod, **env)
    assert done.returncode == 0, done.stderr


def route_localnet(node: NodeBridge, link: str) -> str:
    return node.sysctl(f"/proc/sys/net/ipv4/conf/{link}/route_localnet")


#: (setting, the pod's answer on 127.0.0.1:hostPort from the node, route_localnet on the bridge)
LOCALHOST_CASES = [("false", "", "0"), ("", "web", "1"), ("true", "web", "1")]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("setting", "on_localhost", "bridge_localnet"), LOCALHOST_CASES)
def test_localhost_hostports_unless_the_setting_is_off(
    node: NodeBridge, tmp_path: Path, kind: str, setting: str, on_localhost: str, bridge_localnet: str
) -> None:
    host, _, node_ip = node.outside()
    env = {ENV_LOCALHOST: setting}
    hostport(node, kind, tmp_path, "init", **env)
    pod_ip = node.add_pod("web")
    hostport(node, kind, tmp_path, "setup", "default", "web", "infra-web", NETPLUGIN_HOST_PORTS="tcp/31080/8080",
             NETPLUGIN_PREV_IPS=pod_ip, **env)  # fmt: skip
    server = Server(node.pod_ns("web"), 8080, "web")
    try:
        seen = {
            "127.0.0.1 from the node": ask(node.node, "127.0.0.1", 31080, timeout=2),
            "the node's address from the node": ask(node.node, node_ip, 31080),
            "the node's address from the underlay": ask(host, node_ip, 31080),
        }
        want = {"127.0.0.1 from the node": on_localhost}
        assert seen == {**dict.fromkeys(seen, "web"), **want}, seen
        assert route_localnet(node, f"npbr{node.tag}") == bridge_localnet
        assert route_localnet(node, "eth0") == "0" and route_localnet(node, "all") == "0"
        table = node.in_node("nft", "list", "table", "inet", "netplugin_hostport").stdout
        # kube-proxy's guard is always in: it also covers a route_localnet left on by an earlier setting
        assert "ip daddr 127.0.0.0/8 ip saddr != 127.0.0.0/8 ct status & dnat != dnat" in table, table
        output = node.in_node("nft", "list", "chain", "inet", "netplugin_hostport", "output").stdout
        assert ("ip daddr 127.0.0.0/8 return" in output) is (on_localhost == ""), output
        # a packet to 127.0.0.1 that arrives from a link is never DNATed, whatever the setting
        prerouting = node.in_node("nft", "list", "chain", "inet", "netplugin_hostport", "prerouting").stdout
        assert "ip daddr 127.0.0.0/8 return" in prerouting, prerouting
    finally:
        server.close()


@pytest.mark.parametrize("kind", KINDS)
def test_the_guard_keeps_pods_off_the_nodes_localhost_services(node: NodeBridge, tmp_path: Path, kind: str) -> None:
    # CVE-2020-8558: with route_localnet on the bridge, a pod that routes 127.0.0.2 to its gateway
    # reaches what the node binds to localhost, unless the guard drops it.
    hostport(node, kind, tmp_path, "init", **{ENV_LOCALHOST: "true"})
    pod_ip = node.add_pod("evil")
    hostport(node, kind, tmp_path, "setup", "default", "evil", "infra-evil", NETPLUGIN_HOST_PORTS="tcp/31080/8080",
             NETPLUGIN_PREV_IPS=pod_ip, **{ENV_LOCALHOST: "true"})  # fmt: skip
    pod = node.pod_ns("evil")
    ip_in(pod, "route", "del", "table", "local", "local", "127.0.0.0/8", "dev", "lo")
    ip_in(pod, "route", "add", "127.0.0.2/32", "via", node.gateway)
    for link in ("all", "eth0"):  # the pod's own netns: it may send to 127.0.0.2
        done = subprocess.run(["ip", "netns", "exec", pod, "sh", "-c",
                               f"echo 1 > /proc/sys/net/ipv4/conf/{link}/route_localnet"])  # fmt: skip
        assert done.returncode == 0
    server = Server(node.node, 9999, "node-localhost")
    try:
        assert ask(pod, "127.0.0.2", 9999, timeout=2) == ""
        assert node.in_node("nft", "flush", "chain", "inet", "netplugin_hostport", "guard").returncode == 0
        assert ask(pod, "127.0.0.2", 9999, timeout=2) == "node-localhost"  # what the guard stopped
    finally:
        server.close()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("ports", "refused"),
    [
        pytest.param("tcp/31080/80/127.0.0.1", True, id="loopback-host-ip-refused"),
        pytest.param("tcp/31080/80", False, id="no-host-ip-mapped-without-127.0.0.1"),
    ],
)
def test_route_localnet_goes_on_a_bridge_only(node: NodeBridge, tmp_path: Path, kind: str, ports: str,
                                              refused: bool) -> None:  # fmt: skip
    # an address that routes by the underlay link (a misordered chain): eth0 left alone; a mapping
    # on 127.0.0.1 itself, which would map nothing, is refused; one without hostIP keeps the node's addresses
    _, host_ip, _ = node.outside()
    hostport(node, kind, tmp_path, "init")
    done = call(node.node, kind, tmp_path, "setup", "default", "odd", "infra-odd", NETPLUGIN_HOST_PORTS=ports,
                NETPLUGIN_PREV_IPS=host_ip)  # fmt: skip
    assert route_localnet(node, "eth0") == "0"
    table = node.in_node("nft", "list", "table", "inet", "netplugin_hostport").stdout
    if not refused:
        assert done.returncode == 0 and chain_name("infra-odd") in table, done.stderr
        return
    assert done.returncode != 0 and f"{host_ip} is not behind a bridge (via eth0)" in done.stderr, done.stderr
    assert chain_name("infra-odd") not in table
    assert not (tmp_path / "hostport").is_dir() or not list((tmp_path / "hostport").glob("pod_*"))


def test_the_native_init_turns_route_localnet_back_on_for_recorded_pods(node: NodeBridge, tmp_path: Path) -> None:
    # a reboot makes the bridge again with route_localnet off; the daemon's start (init) restores it
    # for the bridges of recorded pods, and only with the setting on
    node.outside()
    on = {ENV_LOCALHOST: "true"}
    hostport(node, "bash", tmp_path, "init", **on)
    pod_ip = node.add_pod("web")
    hostport(node, "bash", tmp_path, "setup", "default", "web", "infra-web", NETPLUGIN_HOST_PORTS="tcp/31080/8080",
             NETPLUGIN_PREV_IPS=f"{pod_ip},fd00:10:205::2", **on)  # fmt: skip
    bridge = f"npbr{node.tag}"
    for setting, want in (("false", "0"), ("true", "1")):
        node.sysctl(f"/proc/sys/net/ipv4/conf/{bridge}/route_localnet", "0")
        hostport(node, "native", tmp_path, "init", **{ENV_LOCALHOST: setting})
        assert route_localnet(node, bridge) == want, setting
    assert route_localnet(node, "eth0") == "0"


@pytest.mark.parametrize("kind", KINDS)
def test_repair_puts_back_the_localhost_mapping_and_route_localnet(node: NodeBridge, tmp_path: Path, kind: str) -> None:
    # after `nft flush ruleset` and a bridge made again (route_localnet off), the member's repair
    # brings back the table with its 127.0.0.1 DNAT and route_localnet on the pod's bridge
    node.outside()
    on = {ENV_LOCALHOST: "true"}
    hostport(node, kind, tmp_path, "init", **on)
    pod_ip = node.add_pod("web")
    pod = ("default", "web", "infra-web")
    hostport(node, kind, tmp_path, "setup", *pod, NETPLUGIN_HOST_PORTS="tcp/31080/8080",
             NETPLUGIN_PREV_IPS=pod_ip, **on)  # fmt: skip
    bridge = f"npbr{node.tag}"
    node.in_node("nft", "flush", "ruleset")
    node.sysctl(f"/proc/sys/net/ipv4/conf/{bridge}/route_localnet", "0")
    hostport(node, kind, tmp_path, "repair", *pod, NETPLUGIN_PREV_IPS=pod_ip, **on)
    assert route_localnet(node, bridge) == "1"
    table = node.in_node("nft", "list", "table", "inet", "netplugin_hostport").stdout
    output = node.in_node("nft", "list", "chain", "inet", "netplugin_hostport", "output").stdout
    assert chain_name("infra-web") in table and "ip daddr 127.0.0.0/8 return" not in output, table
    server = Server(node.pod_ns("web"), 8080, "web")
    try:
        assert ask(node.node, "127.0.0.1", 31080) == "web"
    finally:
        server.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_bad_localhost_setting_is_refused_naming_it(node: NodeBridge, tmp_path: Path, kind: str) -> None:
    done = call(node.node, kind, tmp_path, "init", **{ENV_LOCALHOST: "maybe"})
    assert done.returncode != 0 and f"invalid {ENV_LOCALHOST} 'maybe'" in done.stderr, done.stderr
    assert node.in_node("nft", "list", "tables").stdout.count("netplugin_hostport") == 0


def conntrack_udp(node: NodeBridge, port: int) -> str:
    return node.in_node("conntrack", "-L", "-p", "udp", "--dport", str(port)).stdout


@pytest.mark.parametrize("kind", KINDS)
def test_setup_flushes_a_stale_udp_flow_so_it_reaches_the_pod(node: NodeBridge, tmp_path: Path, kind: str) -> None:
    if not shutil.which("conntrack"):
        pytest.fail("conntrack is not installed (scripts/install-deps.sh installs it)", pytrace=False)
    host, _, node_ip = node.outside()
    hostport(node, kind, tmp_path, "init")
    pod_ip = node.add_pod("dns")
    server = Server(node.pod_ns("dns"), 5353, "pod-dns", "udp")
    try:
        # the flow starts before the pod's mapping: nothing answers, but conntrack keeps its entry
        assert ask(host, node_ip, 31053, "udp", timeout=1, source_port=40053) == ""
        assert "dport=31053" in conntrack_udp(node, 31053)
        hostport(node, kind, tmp_path, "setup", "default", "dns", "infra-dns", NETPLUGIN_HOST_PORTS="udp/31053/5353",
                 NETPLUGIN_PREV_IPS=pod_ip)  # fmt: skip
        assert "dport=31053" not in conntrack_udp(node, 31053)
        # the same flow (same source port) now goes through the DNAT to the pod
        assert ask(host, node_ip, 31053, "udp", source_port=40053) == "pod-dns"
        assert f"src={pod_ip}" in conntrack_udp(node, 31053)
    finally:
        server.close()


def test_without_the_flush_the_stale_flow_misses_the_pod(node: NodeBridge, tmp_path: Path) -> None:
    # What the flush is for: the same steps with the mapping's rules added by hand, no flush.
    host, _, node_ip = node.outside()
    hostport(node, "native", tmp_path, "init")
    pod_ip = node.add_pod("dns")
    server = Server(node.pod_ns("dns"), 5353, "pod-dns", "udp")
    try:
        assert ask(host, node_ip, 31053, "udp", timeout=1, source_port=40053) == ""
        rule = f"add rule inet netplugin_hostport prerouting udp dport 31053 dnat ip to {pod_ip}:5353"
        done = subprocess.run(["ip", "netns", "exec", node.node, "nft", rule], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert ask(host, node_ip, 31053, "udp", timeout=1, source_port=40053) == ""
    finally:
        server.close()
