"""hostPorts under containerd through netplugin's own chain: the native bridge, then the shipped
``hostport`` exec plugin or the built-in ``netplugin.io/hostport`` (the same table of checks).

The conflist declares the ``portMappings`` capability, containerd passes a sandbox's port mappings
in ``runtimeConfig.portMappings``, netplugin hands them to the chain in ``NETPLUGIN_HOST_PORTS``,
and the hostport member DNATs them in its nft table. In a node netns of the
test's own (containerd, the daemon and every rule inside it) with an underlay host beside it:
the pod's hostPort answers (TCP and UDP) from the underlay host, from the node itself, from
another pod and from the pod itself (hairpin); a second pod asking for the same port gets a clear
error naming the holder; after StopPodSandbox nothing of the pod is left in the table.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.support.portcheck import Server, ask

from .containerd import PortMap
from .test_containerd import CniNet
from .test_containerd_cni_plugins import Node, _run, node  # noqa: F401 - the node fixture

pytestmark = [pytest.mark.containerd, pytest.mark.kernel]

REPO = Path(__file__).resolve().parents[3]
HOSTPORT = REPO / "exec_plugins" / "hostport" / "hostport"


@pytest.fixture(params=["hostport", "netplugin.io/hostport"], ids=["bash", "native"])
def net(node: Node, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[CniNet]:  # noqa: F811
    n = CniNet(node.ctd, tmp_path / "net")
    n.subnet = ipaddress.ip_network("10.201.251.0/24")
    d = n.exec_dir / "hostport"
    d.mkdir(mode=0o755)
    shutil.copyfile(HOSTPORT, d / "hostport")
    os.chmod(d / "hostport", 0o755)
    config = n.daemon_config()
    text = config.read_text().replace("plugin: bridge\n", f"plugins: [netplugin.io/bridge, {request.param}]\n")
    for key in ("IP_FORWARD", "BR_NETFILTER"):  # the node netns is the test's
        text = text.replace(f'NETPLUGIN_BRIDGE_{key}: "false"', f'NETPLUGIN_BRIDGE_{key}: "true"')
    config.write_text(text)
    n.start_daemon(config, node.name)
    conflist: dict[str, Any] = n.conflist()
    conflist["plugins"] = [{"type": "netplugin-cni", "configFile": str(config), "logFile": str(n.log),
                            "capabilities": {"portMappings": True}}]  # fmt: skip
    node.ctd.use_network(conflist)
    try:
        yield n
    finally:
        n.close()


def _table(n: Node) -> str:
    return _run(["ip", "netns", "exec", n.name, "nft", "list", "table", "inet", "netplugin_hostport"]).stdout


def test_a_pods_hostport_answers_from_everywhere_and_leaves_nothing(node: Node, net: CniNet) -> None:  # noqa: F811
    ports = [PortMap(31080, 8080), PortMap(31053, 5353, "udp")]
    web = net.ctd.run_pod("np-hp", "web", str(uuid.uuid4()), ports=ports)
    net.sandboxes.append(web.id)
    client = net.ctd.run_pod("np-hp", "client", str(uuid.uuid4()))
    net.sandboxes.append(client.id)
    servers = [Server(web.netns_name, 8080, "web"), Server(web.netns_name, 5353, "web-udp", "udp")]
    try:
        for proto, port, token in (("tcp", 31080, "web"), ("udp", 31053, "web-udp")):
            seen = {
                "underlay host": ask(node.host, node.node_ip, port, proto),
                "the node itself": ask(node.name, node.node_ip, port, proto),
                "another pod": ask(client.netns_name, node.node_ip, port, proto),
                "the pod itself": ask(web.netns_name, node.node_ip, port, proto),
            }
            assert seen == dict.fromkeys(seen, token), (proto, seen, _table(node))
        # traffic to an address that is not the node's is never DNATed
        assert ask(node.host, "10.201.250.77", 31080, timeout=1) == ""
        with pytest.raises(grpc.RpcError) as info:
            net.ctd.run_pod("np-hp", "rival", str(uuid.uuid4()), ports=[PortMap(31080, 80)])
        assert "hostPort 31080/tcp is already held by pod np-hp/web" in str(info.value.details())
        assert ask(node.host, node.node_ip, 31080) == "web"  # the rival changed nothing
    finally:
        for s in servers:
            s.close()
    net.ctd.stop_remove(web.id)
    net.sandboxes.remove(web.id)
    table = _table(node)
    assert "pod_" not in table and "31080" not in table and "31053" not in table, table
    assert not list((net.state / "hostport").glob("pod_*"))
    assert ask(node.host, node.node_ip, 31080, timeout=1) == ""
