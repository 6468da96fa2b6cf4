"""hostPorts keyed as Kubernetes keys them (protocol, port, hostIP), for the bash ``hostport`` and the
built-in ``netplugin.io/hostport`` alike (one table of cases for both, and for one beside the other):

* which pairs of mappings conflict (the kubelet's and scheduler's rule): refused naming the holder,
  with nothing applied, or accepted, each in its map;
* the conformance spec "HostPort validates that there is no conflict between pods with same
  hostPort but different hostIP and protocol" on a node netns of the test's own: 127.0.0.1,
  the node's address over TCP and over UDP, three pods on one port;
* ``NETPLUGIN_HOSTPORT_LOCALHOST=false``: a 127.0.0.1 hostIP is refused, naming the setting;
* records and a table written by the previous version (keys without hostIP, one map) keep their
  ports through a setup, ``init`` and the ``node`` action.
"""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from netplugin.core.hostports import ENV_LOCALHOST, parse_env
from netplugin.plugins.hostport import TABLE, chain_name, pod_rules
from tests.support.nodebridge import NodeBridge
from tests.support.portcheck import Server, ask

from .test_hostport import call, nft

pytestmark = pytest.mark.kernel
#: (the member that sets the first pod up, the one that sets the second up)
KINDS = [("bash", "bash"), ("native", "native"), ("bash", "native"), ("native", "bash")]
KIND = ["bash", "native"]
IPS = {"first": "10.201.9.2,fd00:10:201:9::2", "second": "10.201.9.3,fd00:10:201:9::3"}


@pytest.fixture
def bare(tmp_path: Path) -> Iterator[str]:
    name = f"np{secrets.token_hex(3)}hi"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def table(netns: str) -> str:
    return nft(netns, "list", "table", *TABLE.split())


#: (the first pod's mappings, the second's, what the second's refusal says or None: accepted, and
#: then the element its key makes)
CONFLICTS = [
    pytest.param("tcp/8080/80", "tcp/8080/80/10.0.0.5",
                 "hostPort 8080/tcp on 10.0.0.5 is already held by pod default/first (its hostPort 8080/tcp)",
                 id="no-host-ip-then-host-ip"),
    pytest.param("tcp/8080/80/10.0.0.5", "tcp/8080/80",
                 "hostPort 8080/tcp is already held by pod default/first (its hostPort 8080/tcp on 10.0.0.5)",
                 id="host-ip-then-no-host-ip"),
    pytest.param("tcp/8080/80/fd00::5", "tcp/8080/80", "hostPort 8080/tcp is already held by pod default/first",
                 id="ipv6-host-ip-then-no-host-ip"),
    pytest.param("tcp/8080/80/10.0.0.5", "tcp/8080/80/10.0.0.5",
                 "hostPort 8080/tcp on 10.0.0.5 is already held by pod default/first", id="same-host-ip"),
    pytest.param("tcp/8080/80", "tcp/8080/80", "hostPort 8080/tcp is already held by pod default/first",
                 id="both-without-host-ip"),
    pytest.param("tcp/8080/80/10.0.0.5", "tcp/8080/80/10.0.0.6", "10.0.0.6 . tcp . 8080", id="different-host-ips"),
    pytest.param("tcp/8080/80/10.0.0.5", "tcp/8080/80/fd00::5", "fd00::5 . tcp . 8080", id="different-families"),
    pytest.param("tcp/8080/80/10.0.0.5", "udp/8080/80/10.0.0.5", "10.0.0.5 . udp . 8080", id="tcp-then-udp"),
    pytest.param("tcp/8080/80", "udp/8080/80", "udp . 8080", id="tcp-then-udp-without-host-ip"),
    pytest.param("sctp/8080/80", "tcp/8080/80/10.0.0.5", "10.0.0.5 . tcp . 8080", id="sctp-then-tcp"),
]  # fmt: skip


@pytest.mark.parametrize(("first_kind", "second_kind"), KINDS)
@pytest.mark.parametrize(("first", "second", "said"), CONFLICTS)
def test_conflicts_are_the_kubelets(
    bare: str, tmp_path: Path, first_kind: str, second_kind: str, first: str, second: str, said: str
) -> None:
    assert call(bare, first_kind, tmp_path, "init").returncode == 0
    done = call(bare, first_kind, tmp_path, "setup", "default", "first", "infra-first",
                NETPLUGIN_HOST_PORTS=first, NETPLUGIN_PREV_IPS=IPS["first"])  # fmt: skip
    assert done.returncode == 0, done.stderr
    before = table(bare)
    done = call(bare, second_kind, tmp_path, "setup", "default", "second", "infra-second",
                NETPLUGIN_HOST_PORTS=second, NETPLUGIN_PREV_IPS=IPS["second"])  # fmt: skip
    record = tmp_path / "hostport" / chain_name("infra-second")
    if " is already held " in said:
        assert done.returncode != 0 and said in done.stderr, done.stderr
        assert table(bare) == before  # nothing of the second pod's applied
        assert not record.exists()
        return
    assert done.returncode == 0, done.stderr
    assert f"{said} : jump {chain_name('infra-second')}" in table(bare), table(bare)
    assert record.exists()
    # each member's node action agrees with the table both wrote: nothing to put right
    for kind in KIND:
        again = call(bare, kind, tmp_path, "node")
        assert again.returncode == 0 and again.stdout.strip() in ("", "()"), (kind, again)


@pytest.fixture
def node(node_factory: Callable[[str], NodeBridge]) -> NodeBridge:
    n = node_factory("native")
    n.init()
    return n


@pytest.mark.parametrize("kind", KIND)
def test_the_conformance_scenario_same_port_different_host_ip_and_protocol(
    node: NodeBridge, tmp_path: Path, kind: str
) -> None:
    # e2e's pod1 on 127.0.0.1, pod2 on the node's address over TCP, pod3 on it over UDP, one port,
    # with the shipped default setting; its client is the node itself (a hostNetwork pod)
    host, _, node_ip = node.outside()
    assert call(node.node, kind, tmp_path, "init").returncode == 0
    pods = {"pod1": ("tcp", "127.0.0.1"), "pod2": ("tcp", node_ip), "pod3": ("udp", node_ip)}
    servers = []
    try:
        for name, (proto, host_ip) in pods.items():
            pod_ip = node.add_pod(name)
            done = call(node.node, kind, tmp_path, "setup", "default", name, f"infra-{name}",
                        NETPLUGIN_HOST_PORTS=f"{proto}/54323/8080/{host_ip}", NETPLUGIN_PREV_IPS=pod_ip)  # fmt: skip
            assert done.returncode == 0, done.stderr
            servers.append(Server(node.pod_ns(name), 8080, name, proto))
        seen = {
            "curl --interface nodeIP http://127.0.0.1:54323": ask(node.node, "127.0.0.1", 54323, source=node_ip),
            "curl http://127.0.0.1:54323": ask(node.node, "127.0.0.1", 54323),
            "curl http://nodeIP:54323": ask(node.node, node_ip, 54323),
            "nc -u nodeIP 54323": ask(node.node, node_ip, 54323, "udp"),
            "from the underlay, TCP to nodeIP": ask(host, node_ip, 54323),
            "from the underlay, UDP to nodeIP": ask(host, node_ip, 54323, "udp"),
        }
        assert list(seen.values()) == ["pod1", "pod1", "pod2", "pod3", "pod2", "pod3"], seen
    finally:
        for server in servers:
            server.close()


@pytest.mark.parametrize("kind", KIND)
def test_a_loopback_host_ip_is_refused_with_the_setting_off(node: NodeBridge, tmp_path: Path, kind: str) -> None:
    off = {ENV_LOCALHOST: "false"}
    assert call(node.node, kind, tmp_path, "init", **off).returncode == 0
    pod_ip = node.add_pod("web")
    before = node.in_node("nft", "list", "table", *TABLE.split()).stdout
    done = call(node.node, kind, tmp_path, "setup", "default", "web", "infra-web",
                NETPLUGIN_HOST_PORTS="tcp/54323/8080/127.0.0.1", NETPLUGIN_PREV_IPS=pod_ip, **off)  # fmt: skip
    assert done.returncode != 0, done
    assert "127.0.0.1" in done.stderr and "hostIP" in done.stderr and ENV_LOCALHOST in done.stderr, done.stderr
    assert node.in_node("nft", "list", "table", *TABLE.split()).stdout == before
    assert not (tmp_path / "hostport" / chain_name("infra-web")).exists()
    assert node.sysctl(f"/proc/sys/net/ipv4/conf/npbr{node.tag}/route_localnet") == "0"


#: the table the previous version made: one map keyed by protocol and port
OLD_TABLE = f"""add table {TABLE}
add map {TABLE} ports {{ type inet_proto . inet_service : verdict; }}
add chain {TABLE} prerouting {{ type nat hook prerouting priority dstnat; policy accept; }}
add chain {TABLE} output {{ type nat hook output priority -100; policy accept; }}
add rule {TABLE} prerouting fib daddr type local meta l4proto . th dport vmap @ports
add rule {TABLE} output fib daddr type local meta l4proto . th dport vmap @ports
"""


def plant_previous_version(netns: str, state: Path, host_ports: str) -> str:
    """Pod default/old (infra-old) with ``host_ports``, as the previous version left it in ``netns``
    and in ``state``'s records: keys without hostIP, the table of :data:`OLD_TABLE`; its chain's name."""
    records = state / "hostport"
    records.mkdir()
    old = chain_name("infra-old")
    mappings = parse_env(host_ports)
    rules = pod_rules(old, mappings, ["10.201.9.2"])
    keys = " ".join(f"{m.protocol}.{m.host_port}" for m in mappings)
    (records / old).write_text(f"default/old infra-old\n{keys}\n" + "\n".join(rules) + "\n")
    elements = ", ".join(f"{m.protocol} . {m.host_port} : jump {old}" for m in mappings)
    script = OLD_TABLE + f"add chain {TABLE} {old}\n" + "".join(r + "\n" for r in rules)
    script += f"add element {TABLE} ports {{ {elements} }}\n"
    subprocess.run(["ip", "netns", "exec", netns, "nft", "-f", "-"], input=script, text=True, check=True)
    return old


@pytest.mark.parametrize("kind", KIND)
def test_the_previous_versions_records_and_table_keep_their_ports(bare: str, tmp_path: Path, kind: str) -> None:
    # its records: keys without hostIP, a hostIP only in the rules
    old = plant_previous_version(bare, tmp_path, "tcp/8080/80 udp/53/53/10.0.0.5")
    # a setup before the daemon's init (the bash member on a node mid-upgrade) makes the new table
    done = call(bare, kind, tmp_path, "setup", "default", "new", "infra-new",
                NETPLUGIN_HOST_PORTS="tcp/9090/90/10.0.0.5", NETPLUGIN_PREV_IPS="10.201.9.3")  # fmt: skip
    assert done.returncode == 0, done.stderr
    held = table(bare)
    assert f"tcp . 8080 : jump {old}" in held and f"udp . 53 : jump {old}" in held, held
    assert f"10.0.0.5 . tcp . 9090 : jump {chain_name('infra-new')}" in held, held
    # the old key still holds its port on every address
    done = call(bare, kind, tmp_path, "setup", "default", "other", "infra-other",
                NETPLUGIN_HOST_PORTS="udp/53/53/10.0.0.9", NETPLUGIN_PREV_IPS="10.201.9.4")  # fmt: skip
    assert done.returncode != 0 and "hostPort 53/udp on 10.0.0.9 is already held by pod default/old" in done.stderr
    # after a flush, init rebuilds both from the records, and the node action finds nothing to fix
    subprocess.run(["ip", "netns", "exec", bare, "nft", "flush", "ruleset"], check=True)
    assert call(bare, "native", tmp_path, "init").returncode == 0
    assert sorted(table(bare).splitlines()) == sorted(held.splitlines())  # in the records' order
    for member in KIND:
        again = call(bare, member, tmp_path, "node")
        assert again.returncode == 0 and again.stdout.strip() in ("", "()"), (member, again)


@pytest.mark.parametrize("kind", KIND)
def test_a_teardown_on_the_previous_versions_table_removes_the_pods_rules(bare: str, tmp_path: Path, kind: str) -> None:
    # a pod deleted on a node mid-upgrade, before anything made the table again
    old = plant_previous_version(bare, tmp_path, "tcp/8080/80")
    records = tmp_path / "hostport"
    done = call(bare, kind, tmp_path, "teardown", "default", "old", "infra-old")
    assert done.returncode == 0, done.stderr
    assert old not in table(bare) and "8080" not in table(bare), table(bare)
    assert not (records / old).exists()
