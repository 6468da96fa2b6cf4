"""A node installed as shipped repairs what is broken under its pods: the self-repair end to end.

The node of :mod:`tests.deploy.test_node_installed` (``scripts/install.sh``, the daemon started with
the unit's ``ExecStart=``, containerd 1.6 and 2 calling the compiled shim), but in a node netns of
the test's own, where the daemon and containerd are entered with ``nsenter --net``, and with the
chain ``bridge`` then ``hostport`` (the shipped bash plugins) installed with ``--config-from``. Its
log file is named by ``JOURNAL_STREAM``, as systemd names the journal, so its lines carry the
journal's priority prefixes. Pods run through containerd (RunPodSandbox), the first with a hostPort.
The node is dual-stack (its bridge's SUBNET an IPv4 and an IPv6 network), so every case covers both
families.

Each breakage is made in the node netns; the test waits (generously bounded, never timed) until
the kernel object is back, then checks that pod -> pod, pod -> gateway and pod -> node traffic
flows over IPv4 and IPv6, and node -> pod from the node's underlay address (what the node forwards
from other nodes, resolved with the bridge's link-local address) with no neighbour entry left, that
``netplugin -o json health`` and ``/metrics`` count the repair by kind, and that the log has the
repair's line. Last, a pod's host veth deleted: ``netplugin pods`` shows it ``broken`` and
``netplugin health`` names it. The cases run in file order on one node per containerd.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.test_node_installed import CONTAINERD_ROWS, InstalledNode, installed_node
from tests.frontends.cni.containerd import PortMap, Sandbox
from tests.support.nettest import host_veth_name, ip_in, kernel_gate, underlay_netns
from tests.support.waits import WITHIN, wait_for

pytestmark = [
    pytest.mark.containerd,
    pytest.mark.kernel,
    pytest.mark.skipif(os.geteuid() != 0, reason="installs root-owned files and runs containerd; run as root"),
]

NODE_IP = "10.206.0.81"  # the node's underlay addresses, inside its own netns
NODE_IP6 = "fd00:10:206::81"
HOST_PORT = 18081


@dataclass
class RepairNode:
    """The installed node in its netns, and its pods: ``web`` (with the hostPort) and ``peer``."""

    node: InstalledNode
    web: Sandbox
    peer: Sandbox

    @property
    def ns(self) -> str:
        assert self.node.netns is not None
        return self.node.netns

    def link(self, name: str) -> dict[str, Any] | None:
        done = subprocess.run(
            ["ip", "-n", self.ns, "-j", "-d", "link", "show", "dev", name], capture_output=True, text=True, timeout=30
        )
        return json.loads(done.stdout)[0] if done.returncode == 0 and done.stdout.strip() else None

    def in_ns(self, *argv: str) -> str:
        return subprocess.run(
            ["ip", "netns", "exec", self.ns, *argv], capture_output=True, text=True, timeout=30, check=True
        ).stdout

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """The installed ``netplugin`` with the node's config (it reaches the daemon at its socket)."""
        argv = [str(self.node.dirs["prefix"] / "bin" / "netplugin"), "--config", str(self.node.config), *args]
        env = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_")}
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)

    def health_json(self) -> dict[str, Any]:
        done = self.cli("-o", "json", "health")
        assert done.returncode == 0, done.stdout + done.stderr
        result: dict[str, Any] = json.loads(done.stdout)
        return result

    def repairs(self) -> dict[str, float]:
        return self.node.metrics("netplugin_repairs_total", "kind")

    def log(self) -> str:
        return (self.node.root / "daemon.log").read_text()

    @property
    def gateways(self) -> set[str]:
        """The bridge's gateway addresses (CIDR form): the first host of each subnet."""
        nets = [ipaddress.ip_network(n) for n in (self.node.subnet, self.node.subnet6) if n]
        return {f"{n[1]}/{n.prefixlen}" for n in nets}

    def ip6(self, sb: Sandbox) -> str:
        """The pod's IPv6 address, read in its netns (the CRI reports the primary, IPv4, one)."""
        out = ip_in(sb.netns_name, "-j", "-6", "addr", "show", "dev", "eth0", "scope", "global")
        [addr] = [a["local"] for a in json.loads(out)[0]["addr_info"] if "local" in a]  # filtered out: {}
        return str(addr)


def _ping(sb: Sandbox | str, ip: str, source: str | None = None) -> bool:
    """Whether ``ip`` answers from the pod ``sb`` (or a netns named so), from ``source`` if given."""
    netns = sb.netns_name if isinstance(sb, Sandbox) else sb
    argv = ["ip", "netns", "exec", netns, "ping", "-c", "1", "-W", "3", *(["-I", source] if source else []), ip]
    return subprocess.run(argv, capture_output=True, timeout=30).returncode == 0


def _flows(rn: RepairNode) -> None:
    """Pod -> pod, pod -> gateway, pod -> node over both families, and node -> pod from its underlay."""
    web6, peer6 = rn.ip6(rn.web), rn.ip6(rn.peer)
    gateways = [g.split("/")[0] for g in sorted(rn.gateways)]
    for sb, dst in [
        (rn.web, rn.peer.ip), (rn.web, peer6), (rn.peer, rn.web.ip), (rn.peer, web6),
        (rn.web, NODE_IP), (rn.web, NODE_IP6), *((rn.peer, g) for g in gateways),
    ]:  # fmt: skip
        assert _ping(sb, dst), f"{sb.name} -> {dst}"
    # the source of forwarded traffic is not the bridge's: its neighbour solicitation needs the
    # bridge's link-local address
    ip_in(rn.ns, "-6", "neigh", "flush", "dev", rn.node.bridge)
    assert _ping(rn.ns, web6, source=NODE_IP6), f"{NODE_IP6} -> {web6}"


@pytest.fixture(scope="module", **CONTAINERD_ROWS)
def repair_node(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, dists: dict[str, Path]
) -> Iterator[RepairNode]:
    kernel_gate(request)
    chain = ("bridge", "hostport")
    with (
        underlay_netns("r", [f"{NODE_IP}/24", f"{NODE_IP6}/64"]) as ns,
        installed_node(request.param, tmp_path_factory, dists["wheel"], netns=ns, plugins=chain, dual_stack=True) as n,
    ):
        n.start_daemon()
        web = n.run_pod("web", ports=[PortMap(HOST_PORT, 8080)])
        peer = n.run_pod("peer")
        yield RepairNode(n, web, peer)


def _port(rn: RepairNode) -> dict[str, Any]:
    slave = ((rn.link(host_veth_name(rn.web.id)) or {}).get("linkinfo") or {}).get("info_slave_data") or {}
    return dict(slave)


def _port_ok(rn: RepairNode) -> bool:
    link = rn.link(host_veth_name(rn.web.id))
    return link is not None and link.get("master") == rn.node.bridge and bool(_port(rn).get("hairpin"))


def _bridge_ok(rn: RepairNode) -> bool:
    """Up, both gateway addresses and a link-local one, both ports on it (the web pod's with hairpin)."""
    link = rn.link(rn.node.bridge)
    if link is None:
        return False
    peer = rn.link(host_veth_name(rn.peer.id))
    done = subprocess.run(["ip", "-n", rn.ns, "-j", "addr", "show", "dev", rn.node.bridge],
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    addrs = json.loads(done.stdout or "[]") if done.returncode == 0 else []
    have = {f"{a['local']}/{a['prefixlen']}" for x in addrs for a in x.get("addr_info", [])}
    return (
        "UP" in link.get("flags", [])
        and rn.gateways <= have
        and any(a.startswith("fe80:") for a in have)
        and _port_ok(rn)
        and peer is not None
        and peer.get("master") == rn.node.bridge
    )


def _tables_ok(rn: RepairNode) -> bool:
    tables = rn.in_ns("nft", "list", "tables")
    return "table inet netplugin_hostport" in tables and f"dport {HOST_PORT}" in rn.in_ns("nft", "list", "ruleset")


def _hairpin_off(rn: RepairNode) -> None:
    ip_in(rn.ns, "link", "set", "dev", host_veth_name(rn.web.id), "type", "bridge_slave", "hairpin", "off")


def _ipv6_flush(rn: RepairNode) -> None:
    ip_in(rn.ns, "-6", "addr", "flush", "dev", rn.node.bridge)


#: name -> (the breakage, whether the kernel object is back, the repair kinds it is counted under,
#: what the repair's log lines say)
BREAKAGES: dict[str, tuple[Callable[[RepairNode], object], Callable[[RepairNode], bool], set[str], list[str]]] = {
    "hairpin off": (_hairpin_off, _port_ok, {"port"}, ["hairpin on"]),
    "nft flush ruleset": (lambda rn: rn.in_ns("nft", "flush", "ruleset"), _tables_ok, {"hostport"}, [" rebuilt"]),
    "bridge deleted": (
        lambda rn: ip_in(rn.ns, "link", "del", rn.node.bridge), _bridge_ok, {"bridge", "port"}, [" recreated with "]
    ),
    # the gateway and the link-local address, which the kernel does not make again on a running bridge
    "ipv6 flush": (_ipv6_flush, _bridge_ok, {"bridge"}, [":1/64 re-added", " address fe80:"]),
}


@pytest.mark.parametrize("breakage", list(BREAKAGES))
def test_a_breakage_in_the_node_is_repaired_counted_and_logged(repair_node: RepairNode, breakage: str) -> None:
    rn = repair_node
    breaks, back, kinds, said = BREAKAGES[breakage]
    # the bridge's link-local address comes with carrier
    wait_for(lambda: back(rn), f"{breakage}: intact before", WITHIN)
    _flows(rn)
    counted = rn.repairs()
    logged = len(rn.log())
    breaks(rn)
    wait_for(lambda: back(rn), f"{breakage}: the kernel object back", WITHIN)
    # the count follows the repair's own log line; wait for both kinds (a bridge repair re-attaches ports)
    wait_for(
        lambda: all(rn.repairs().get(k, 0) > counted.get(k, 0) for k in kinds), f"repairs of {kinds} counted", WITHIN
    )
    # pod -> node: the gateway's MAC in the pods' neighbour entries is still the bridge's
    _flows(rn)
    health = rn.health_json()["node"]
    assert all(health["repairs"].get(k, 0) >= rn.repairs()[k] for k in kinds), health
    lines = rn.log()[logged:].splitlines()
    for kind in kinds:  # journal-style: the warning priority prefix, no timestamp of its own
        assert any(line.startswith(f"<4>repair ({kind})") for line in lines), lines
    print("", *(line for line in lines if line.startswith("<4>repair (")), sep="\n")  # the times, for the record
    for words in said:
        assert any(line.startswith("<4>repair (") and words in line for line in lines), (words, lines)
    assert "Traceback" not in rn.log()


def test_a_pod_whose_host_veth_is_gone_is_shown_broken(repair_node: RepairNode) -> None:
    rn = repair_node
    ip_in(rn.ns, "link", "del", host_veth_name(rn.peer.id))  # the pod's end goes with it: not repairable

    def rows() -> dict[str, str]:
        done = rn.cli("-o", "json", "pods")
        assert done.returncode == 0, done.stdout + done.stderr
        return {p["name"]: p["condition"] for p in json.loads(done.stdout)["pods"]}

    wait_for(lambda: rows().get(rn.peer.name) == "broken", "the peer pod shown broken", WITHIN)
    assert rows()[rn.web.name] == "ready"
    health = rn.cli("health")
    assert health.returncode == 0 and "1 pod(s) broken" in health.stdout, health
    broken = rn.health_json()["node"]["broken"]
    assert any(rn.peer.name in key for key in broken), broken
    assert f"pod np-inst/{rn.peer.name}/" in rn.log() and "is broken" in rn.log()
    assert _ping(rn.web, NODE_IP)  # the other pod is untouched
    table = rn.cli("pods").stdout
    assert "broken" in table and rn.peer.name in table, table
