"""CNI's own plugins chained after ``netplugin-cni``, under containerd: one conflist
``[netplugin-cni, portmap, bandwidth]`` with the ``portMappings`` and ``bandwidth`` capabilities
declared. They find the pod's host veth and addresses in the ADD result netplugin returns (the host
veth listed without ``sandbox``, the IPs pointing at the pod interface), as after CNI's own bridge.

Everything runs in a node netns of the test's (containerd included, so portmap's iptables rules
and bandwidth's qdiscs are never the machine's), with an underlay host netns beside it. The pod's
hostPort answers from the underlay host, its host veth gets the ingress qdisc, and after StopPodSandbox nothing
of it is left. The plugins' dir is a parameter: Debian's containernetworking-plugins now, another
build (``NETPLUGIN_TEST_CNI_PLUGINS=DIR``, e.g. v1.10 built from Go) beside it.
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
from nettest import ip_in, kernel_unavailable_reason
from portcheck import Server, ask

from .containerd import Containerd, PortMap, unavailable_reason
from .test_containerd import CniNet

pytestmark = [pytest.mark.containerd, pytest.mark.kernel]

PLUGIN_DIRS = {"debian": "/usr/lib/cni"}
if os.environ.get("NETPLUGIN_TEST_CNI_PLUGINS"):
    PLUGIN_DIRS["given"] = os.environ["NETPLUGIN_TEST_CNI_PLUGINS"]
INGRESS = "kubernetes.io/ingress-bandwidth"


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


class Node:
    """A node netns with containerd and netplugin-cni in it, and an underlay host netns on its eth0."""

    def __init__(self, tmp: Path, plugins: str) -> None:
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
        self.ctd = Containerd(root, Path(native.stdout.strip()), netns=self.name)
        self.ctd.start()
        for plugin in ("portmap", "bandwidth"):
            shutil.copy2(os.path.join(plugins, plugin), self.ctd.bin_dir / plugin)

    def close(self) -> None:
        self.ctd.close()
        for ns in self.made:
            _run(["ip", "netns", "del", ns])

    def nat_rules(self) -> str:
        return _run(["ip", "netns", "exec", self.name, "iptables", "-t", "nat", "-S"]).stdout

    def links(self) -> str:
        return ip_in(self.name, "-o", "link", "show")


@pytest.fixture(params=sorted(PLUGIN_DIRS), ids=lambda k: f"cni-plugins-{k}")
def node(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Node]:
    plugins = PLUGIN_DIRS[request.param]
    reason = kernel_unavailable_reason() or unavailable_reason()
    missing = [p for p in ("portmap", "bandwidth") if not os.access(os.path.join(plugins, p), os.X_OK)]
    if reason or missing or not shutil.which("iptables"):
        pytest.skip(reason or f"{', '.join(missing) or 'iptables'} missing (in {plugins})")
    n = Node(tmp_path, plugins)
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
    ]
    return conflist


def test_cnis_portmap_and_bandwidth_chain_after_netplugin_cni(node: Node, tmp_path: Path) -> None:
    net = CniNet(node.ctd, tmp_path / "net")
    net.subnet = ipaddress.ip_network("10.201.251.0/24")
    server: Server | None = None
    try:
        node.ctd.use_network(chained_conflist(net, node))
        sb = net.ctd.run_pod("np-chain", "web", str(uuid.uuid4()), annotations={INGRESS: "20M"},
                             ports=[PortMap(31080, 8080)])  # fmt: skip
        net.sandboxes.append(sb.id)
        assert sb.ip, "containerd reported no pod IP"
        server = Server(sb.netns_name, 8080, "web")
        # portmap found the pod's address and DNATs the node's port to it
        assert ask(node.host, node.node_ip, 31080) == "web", node.nat_rules()
        assert sb.ip in node.nat_rules()
        # bandwidth found the host veth (the interface without sandbox) and shapes traffic into the pod
        # bandwidth found the host veth (the interface without sandbox) and shapes traffic into the pod;
        # containerd 1.6 asks for a burst of 2^32-1 bits (512 MB), so the qdisc is checked, not a transfer
        record = json.loads(next((net.state / "pods").glob("*.json")).read_text())
        veth = record["chain"][0]["host_interface"]
        assert veth in node.links()
        qdisc = _run(["ip", "netns", "exec", node.name, "tc", "qdisc", "show", "dev", veth]).stdout
        assert "tbf" in qdisc and "rate 20Mbit" in qdisc, qdisc
        server.close()
        server = None
        node.ctd.stop_remove(sb.id)
        net.sandboxes.remove(sb.id)
        assert sb.ip not in node.nat_rules()
        assert veth not in node.links()
        assert ask(node.host, node.node_ip, 31080, timeout=1) == ""
    finally:
        if server is not None:
            server.close()
        net.close()
