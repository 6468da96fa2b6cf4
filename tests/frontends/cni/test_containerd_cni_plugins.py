"""CNI's own plugins chained after ``netplugin-cni``, under containerd: one conflist
``[netplugin-cni, portmap, bandwidth, firewall]`` with the ``portMappings`` and ``bandwidth``
capabilities declared. They find the pod's host veth and addresses in the ADD result netplugin
returns (the host veth listed without ``sandbox``, the IPs pointing at the pod interface), as after
CNI's own bridge.

Everything runs in a node netns of the test's (containerd included, so portmap's and firewall's
iptables rules and bandwidth's qdiscs are never the machine's), with an underlay host netns beside
it. One table, two rows: Debian's containernetworking-plugins 1.1.1 under Debian's containerd 1.6,
and CNI plugins v1.10 under containerd 2 (both built by scripts/build-peers.sh). The pod's hostPort
answers from the underlay host; its host veth gets the ingress TBF at the annotation's rate, and a
transfer into the pod, once containerd's burst (2^32-1 bits, 512 MiB) is spent, runs at that rate;
firewall's chain holds the pod and lets its traffic through a FORWARD policy DROP; after
StopPodSandbox nothing of it is left.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.gopeers import require
from tests.support.nettest import ip_in, kernel_unavailable_reason, tcp_rate
from tests.support.portcheck import Server, ask
from tests.support.waits import WITHIN, wait_for

from .containerd import Containerd, PortMap, unavailable_reason
from .test_containerd import CONTAINERD2_PEERS, CniNet

pytestmark = [pytest.mark.containerd, pytest.mark.kernel]

#: the chained plugins, from each row's dir
CHAINED = ("portmap", "bandwidth", "firewall")
#: row -> (where its plugins are: a dir, or a dir under the peer build; containerd 2 or Debian's 1.6)
ROWS = {"debian-1.1.1": ("/usr/lib/cni", False), "v1.10": ("cni", True)}
INGRESS = "kubernetes.io/ingress-bandwidth"


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


class Node:
    """A node netns with containerd and netplugin-cni in it, and an underlay host netns on its eth0."""

    def __init__(self, tmp: Path, plugins: str, peers: Path | None = None) -> None:
        self.tag = uuid.uuid4().hex[:6]
        self.name, self.host = f"np{self.tag}n", f"np{self.tag}u"
        self.made: list[str] = []
        for ns in (self.name, self.host):
            assert _run(["ip", "netns", "add", ns]).returncode == 0
            self.made.append(ns)
            ip_in(ns, "link", "set", "lo", "up")
        # inside namespaces of the test's own: fixed subnets cannot meet another test's
        self.node_ip, self.host_ip = "10.201.250.2", "10.201.250.1"
        ip_in(self.name, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", self.host)
        for ns, addr in ((self.name, self.node_ip), (self.host, self.host_ip)):
            ip_in(ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            ip_in(ns, "link", "set", "eth0", "up")
        ip_in(self.name, "route", "add", "default", "via", self.host_ip)
        root = tmp / "ctd"
        made = _run([sys.executable, "-m", "netplugin", "install-shim", str(tmp / "netplugin-cni-python")])
        assert made.returncode == 0, made.stderr
        native = _run([sys.executable, "-m", "netplugin", "install-shim", "--kind", "cni-native", str(tmp / "cni"),
                       "--socket", str(root / "netplugin.sock"), "--fallback", made.stdout.strip()])  # fmt: skip
        assert native.returncode == 0, native.stderr
        self.ctd = Containerd(root, Path(native.stdout.strip()), netns=self.name, peers=peers)
        self.ctd.start()
        for plugin in CHAINED:
            shutil.copy2(os.path.join(plugins, plugin), self.ctd.bin_dir / plugin)

    def close(self) -> None:
        self.ctd.close()
        for ns in self.made:
            _run(["ip", "netns", "del", ns])

    def nat_rules(self) -> str:
        return _run(["ip", "netns", "exec", self.name, "iptables", "-t", "nat", "-S"]).stdout

    def links(self) -> str:
        return ip_in(self.name, "-o", "link", "show")


@pytest.fixture(params=sorted(ROWS), ids=lambda k: f"cni-plugins-{k}")
def node(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Node]:
    where, containerd2 = ROWS[request.param]
    reason = kernel_unavailable_reason() or unavailable_reason()
    if reason or not shutil.which("iptables"):
        pytest.skip(reason or "iptables is not installed")
    peers = require(*CONTAINERD2_PEERS, *(f"{where}/{p}" for p in CHAINED)) if containerd2 else None
    plugins = str(peers / where) if peers is not None else where
    missing = [p for p in CHAINED if not os.access(os.path.join(plugins, p), os.X_OK)]
    if missing:
        pytest.skip(f"{', '.join(missing)} missing (in {plugins})")
    n = Node(tmp_path, plugins, peers)
    try:
        yield n
    finally:
        n.close()


def chained_conflist(net: CniNet, node: Node) -> dict[str, Any]:
    """The conflist, and netplugin's daemon started in the node (entered with a bare ``nsenter --net``,
    as containerd is: nothing netplugin decides comes from /sys, which stays the root netns's)."""
    config = net.daemon_config()
    text = config.read_text().replace("plugin: bridge\n", "plugin: netplugin.io/bridge\n")
    # the node netns is the test's: forwarding (for the underlay's DNATed traffic) and br_netfilter on
    for key in ("IP_FORWARD", "BR_NETFILTER"):
        text = text.replace(f'NETPLUGIN_BRIDGE_{key}: "false"', f'NETPLUGIN_BRIDGE_{key}: "true"')
    config.write_text(text)
    net.start_daemon(config, node.name)
    conflist = net.conflist()
    conflist["plugins"][0] = {"type": "netplugin-cni", "configFile": str(config), "logFile": str(net.log)}
    conflist["plugins"] += [
        {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True},
        {"type": "bandwidth", "capabilities": {"bandwidth": True}},
        {"type": "firewall"},
    ]
    return conflist


#: the annotation's rate, and what is sent once containerd's burst (2^32-1 bits) is spent
RATE_MBIT = 20
BURST_BYTES = (2**32 - 1) // 8


def _shaped_rate(node: Node, sb_netns: str, ip: str) -> float:
    """Bits per second into the pod once the TBF's bucket is empty: one transfer spends the burst,
    the next (2 s at the rate) is the measure."""
    tcp_rate(node.host, sb_netns, ip, BURST_BYTES + (4 << 20))
    return tcp_rate(node.host, sb_netns, ip, RATE_MBIT * 1_000_000 * 2 // 8)


def test_cnis_portmap_bandwidth_and_firewall_chain_after_netplugin_cni(node: Node, tmp_path: Path) -> None:
    net = CniNet(node.ctd, tmp_path / "net")
    net.subnet = ipaddress.ip_network("10.201.251.0/24")
    servers: list[Server] = []
    try:
        node.ctd.use_network(chained_conflist(net, node))
        sb = net.ctd.run_pod("np-chain", "web", str(uuid.uuid4()), annotations={INGRESS: f"{RATE_MBIT}M"},
                             ports=[PortMap(31080, 8080)])  # fmt: skip
        net.sandboxes.append(sb.id)
        assert sb.ip, "containerd reported no pod IP"
        servers.append(Server(sb.netns_name, 8080, "web"))
        # portmap found the pod's address and DNATs the node's port to it
        assert ask(node.host, node.node_ip, 31080) == "web", node.nat_rules()
        assert sb.ip in node.nat_rules()
        # bandwidth found the host veth (the interface without sandbox) and shapes traffic into the pod
        record = json.loads(next((net.state / "pods").glob("*.json")).read_text())
        veth = record["chain"][0]["host_interface"]
        assert veth in node.links()
        qdisc = _run(["ip", "netns", "exec", node.name, "tc", "qdisc", "show", "dev", veth]).stdout
        assert "tbf" in qdisc and f"rate {RATE_MBIT}Mbit" in qdisc, qdisc
        ip_in(node.host, "route", "add", str(net.subnet), "via", node.node_ip)
        rate = _shaped_rate(node, sb.netns_name, sb.ip)
        print(f"shaped transfer into the pod: {rate / 1e6:.1f} Mbit/s (annotation {RATE_MBIT}M)")
        assert 0.5 * RATE_MBIT * 1e6 < rate < 1.5 * RATE_MBIT * 1e6, rate
        # firewall's chain holds the pod, and lets the pod's own traffic through a FORWARD policy DROP
        assert sb.ip in _run(["ip", "netns", "exec", node.name, "iptables", "-S", "CNI-FORWARD"]).stdout
        assert _run(["ip", "netns", "exec", node.name, "iptables", "-P", "FORWARD", "DROP"]).returncode == 0
        servers.append(Server(node.host, 8081, "underlay"))
        assert ask(sb.netns_name, node.host_ip, 8081) == "underlay"
        for server in servers:
            server.close()
        servers.clear()
        node.ctd.stop_remove(sb.id)
        net.sandboxes.remove(sb.id)
        assert sb.ip not in node.nat_rules()
        assert sb.ip not in _run(["ip", "netns", "exec", node.name, "iptables", "-S"]).stdout
        # the built-in bridge answers with the veth off the network; the kernel deletes it just after
        wait_for(lambda: veth not in node.links(), f"{veth} deleted", WITHIN)
        assert ask(node.host, node.node_ip, 31080, timeout=1) == ""
    finally:
        for server in servers:
            server.close()
        net.close()
