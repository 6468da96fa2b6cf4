"""Egress masquerade (netplugin.nodenet.egress) against real nftables, in namespaces of our own.

Topology, all inside network namespaces this test creates (nothing in the machine's own)::

    pod  eth0 10.206.1.2 / fd00:10:206:1::2  ──veth──  node  10.206.1.1 / fd00:10:206:1::1
    node up0  10.206.255.2 / fd00:10:206:ff00::2  ──veth──  outside up0 10.206.255.1 / ...:ff00::1
    node pr0  10.206.254.2 / fd00:10:206:fe00::2  ──veth──  peer pr0 10.206.254.1 / ...:fe00::1
    outside lo: 10.206.240.1, fd00:10:206:f000::1  (outside the cluster CIDRs, no route back to pods)
    peer lo:    10.206.2.1,   fd00:10:206:2::1     ("a pod on another node": inside, routes back)

The cluster CIDRs are 10.206.0.0/20 and fd00:10:206::/56. Traffic to the outside addresses gets
an answer only when masqueraded (the outside has no route to the pods), and the server there
reports the source address it saw.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

from netplugin.core.errors import InvalidArgument
from netplugin.nodenet.egress import Egress, EgressError

pytestmark = pytest.mark.kernel

CLUSTER = ["10.206.0.0/20", "fd00:10:206::/56"]
POD_CIDRS = ["10.206.1.0/24", "fd00:10:206:1::/64"]
OUTSIDE = ["10.206.240.1", "fd00:10:206:f000::1"]
INSIDE = ["10.206.2.1", "fd00:10:206:2::1"]
NODE_UPLINK = ["10.206.255.2", "fd00:10:206:ff00::2"]
POD = ["10.206.1.2", "fd00:10:206:1::2"]
PORT = 8080

# Answers every connection with the peer address it saw, on every address given.
_SERVER = """
import socket, sys, threading
def serve(addr):
    fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
    s = socket.socket(fam)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, int(sys.argv[1])))
    s.listen(16)
    while True:
        c, peer = s.accept()
        c.sendall(peer[0].encode())
        c.close()
for a in sys.argv[2:]:
    threading.Thread(target=serve, args=(a,), daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
"""

_CLIENT = """
import json, socket, sys
out = {}
for addr in sys.argv[3:]:
    try:
        with socket.create_connection((addr, int(sys.argv[1])), timeout=float(sys.argv[2])) as c:
            out[addr] = c.recv(100).decode()
    except OSError as e:
        out[addr] = "error: %s" % e
print(json.dumps(out))
"""


def sh(*argv: str) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(list(argv), capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, f"{argv}: {r.stderr}"
    return r


@dataclass
class EgressNet:
    node: str
    pod: str
    outside: str
    peer: str
    table: str

    @property
    def node_path(self) -> str:
        return f"/var/run/netns/{self.node}"

    def in_ns(self, ns: str, *argv: str) -> subprocess.CompletedProcess[str]:
        return sh("ip", "netns", "exec", ns, *argv)

    def ruleset(self) -> str:
        return self.in_ns(self.node, "nft", "list", "ruleset").stdout

    def egress(self) -> Egress:
        return Egress(self.table, netns=self.node_path)

    def connect(self, addrs: list[str], timeout: float = 5.0) -> dict[str, str]:
        """{address: the source address the server saw, or "error: ..."}; short ``timeout`` for expected failures."""
        out = self.in_ns(self.pod, sys.executable, "-c", _CLIENT, str(PORT), str(timeout), *addrs).stdout
        result: dict[str, str] = json.loads(out)
        return result


def _batch(ns: str, lines: list[str]) -> None:
    r = subprocess.run(
        ["ip", "netns", "exec", ns, "ip", "-batch", "-"], input="\n".join(lines) + "\n", capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr


def _settle(n: EgressNet, ns: str) -> None:
    """Wait until IPv6 is configured on every link of ``ns``.

    The kernel adds a link's multicast route (needed to receive neighbour solicitations) when it
    sees the carrier, which linkwatch may report up to a second late (pairs of links with equal
    ifindexes in two fresh namespaces are not urgent events).
    """
    deadline = time.monotonic() + 5
    while True:
        links = {
            line.split(":")[1].strip().split("@")[0]
            for line in n.in_ns(ns, "ip", "-o", "link", "show", "up").stdout.splitlines()
        } - {"lo"}
        mroutes = n.in_ns(ns, "ip", "-6", "route", "show", "table", "local", "type", "multicast").stdout
        if all(f" dev {link} " in mroutes for link in links):
            return
        assert time.monotonic() < deadline, f"IPv6 not ready on {links} in {ns}: {mroutes!r}"
        time.sleep(0.02)


@contextmanager
def _topology(full: bool) -> Iterator[EgressNet]:
    """The namespaces above; without ``full`` only the node (for tests that send no traffic)."""
    tag = secrets.token_hex(3)
    n = EgressNet(
        node=f"np-{tag}-node", pod=f"np-{tag}-pod", outside=f"np-{tag}-out", peer=f"np-{tag}-peer", table=f"np_{tag}"
    )
    made: list[str] = []
    servers: list[subprocess.Popen[str]] = []
    try:
        for ns in (n.node, n.pod, n.outside, n.peer) if full else (n.node,):
            sh("ip", "netns", "add", ns)
            made.append(ns)
            # A router sends neighbour solicitations for forwarded packets from its link-local
            # address, which is unusable while duplicate address detection runs (1-2 s).
            n.in_ns(ns, "sysctl", "-qw", "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0")
        if not full:
            yield n
            return
        # Links are created inside the node netns, their peers straight in the other namespaces.
        _batch(
            n.node,
            [
                "link set lo up",
                f"link add pod0 type veth peer name eth0 netns /var/run/netns/{n.pod}",
                f"link add up0 type veth peer name up0 netns /var/run/netns/{n.outside}",
                f"link add pr0 type veth peer name pr0 netns /var/run/netns/{n.peer}",
                "addr add 10.206.1.1/24 dev pod0",
                "addr add fd00:10:206:1::1/64 dev pod0 nodad",
                "addr add 10.206.255.2/24 dev up0",
                "addr add fd00:10:206:ff00::2/64 dev up0 nodad",
                "link set pod0 up",
                "addr add 10.206.254.2/24 dev pr0",
                "addr add fd00:10:206:fe00::2/64 dev pr0 nodad",
                "link set up0 up",
                "link set pr0 up",
                "route add 10.206.240.0/24 via 10.206.255.1",
                "route add fd00:10:206:f000::/64 via fd00:10:206:ff00::1",
                "route add 10.206.2.0/24 via 10.206.254.1",
                "route add fd00:10:206:2::/64 via fd00:10:206:fe00::1",
            ],
        )
        _batch(
            n.pod,
            [
                "link set lo up",
                "addr add 10.206.1.2/24 dev eth0",
                "addr add fd00:10:206:1::2/64 dev eth0 nodad",
                "link set eth0 up",
                "route add default via 10.206.1.1",
                "route add default via fd00:10:206:1::1",
            ],
        )
        _batch(
            n.outside,
            [
                "link set lo up",
                "addr add 10.206.255.1/24 dev up0",
                "addr add fd00:10:206:ff00::1/64 dev up0 nodad",
                "link set up0 up",
                "addr add 10.206.240.1/32 dev lo",
                "addr add fd00:10:206:f000::1/128 dev lo",
                # No route to the pods: an answer from here proves the masquerade.
            ],
        )
        _batch(
            n.peer,
            [
                "link set lo up",
                "addr add 10.206.254.1/24 dev pr0",
                "addr add fd00:10:206:fe00::1/64 dev pr0 nodad",
                "link set pr0 up",
                "addr add 10.206.2.1/32 dev lo",
                "addr add fd00:10:206:2::1/128 dev lo",
                # As routes between nodes would: the pods are reachable from inside the cluster.
                "route add 10.206.1.0/24 via 10.206.254.2",
                "route add fd00:10:206:1::/64 via fd00:10:206:fe00::2",
            ],
        )
        n.in_ns(n.node, "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")
        for ns in made:
            _settle(n, ns)
        for ns, addrs in ((n.outside, OUTSIDE), (n.peer, INSIDE)):
            server = subprocess.Popen(
                ["ip", "netns", "exec", ns, sys.executable, "-c", _SERVER, str(PORT), *addrs],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            servers.append(server)
            assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        yield n
    finally:
        for server in servers:
            server.kill()
            server.wait()
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@pytest.fixture
def net() -> Iterator[EgressNet]:
    with _topology(full=True) as n:
        yield n


@pytest.fixture
def node() -> Iterator[EgressNet]:
    with _topology(full=False) as n:
        yield n


def test_pod_reaches_outside_only_masqueraded(net: EgressNet) -> None:
    before = net.connect(INSIDE) | net.connect(OUTSIDE, timeout=0.5)
    # Without the masquerade the outside cannot answer (no route back); the "other node" can.
    assert all(before[a].startswith("error") for a in OUTSIDE), before
    assert [before[a] for a in INSIDE] == POD

    net.egress().ensure(CLUSTER, POD_CIDRS)
    after = net.connect(OUTSIDE + INSIDE)
    assert [after[a] for a in OUTSIDE] == NODE_UPLINK, after
    # Inside the cluster the pod keeps its own address.
    assert [after[a] for a in INSIDE] == POD, after

    net.egress().remove()
    again = net.connect(OUTSIDE, timeout=0.5)
    assert all(again[a].startswith("error") for a in OUTSIDE), again


def test_cluster_cidrs_alone_masquerade_every_pod_address(net: EgressNet) -> None:
    net.egress().ensure(",".join(CLUSTER))
    after = net.connect(OUTSIDE + INSIDE)
    assert [after[a] for a in OUTSIDE] == NODE_UPLINK, after
    assert [after[a] for a in INSIDE] == POD, after


def test_ensure_twice_is_one_rule_set_and_follows_changes(node: EgressNet) -> None:
    eg = node.egress()
    assert not eg.present()
    eg.ensure(CLUSTER, POD_CIDRS)
    first = node.ruleset()
    eg.ensure(CLUSTER, POD_CIDRS)
    assert node.ruleset() == first
    assert first.count(f"table inet {node.table} ") == 1
    assert first.count("masquerade") == 2
    assert eg.present() and "fd00:10:206:1::/64" in eg.listing()

    # New CIDRs replace the old ones; an IPv4-only cluster has no IPv6 rule at all.
    eg.ensure(["10.206.0.0/16"], ["10.206.1.0/24"])
    listing = eg.listing()
    assert "10.206.0.0/16" in listing and "10.206.0.0/20" not in listing
    assert "ip6" not in listing and listing.count("masquerade") == 1


def test_remove_leaves_foreign_tables_alone(node: EgressNet) -> None:
    foreign = """
table ip np_foreign {
    chain fw { type filter hook forward priority 0; policy accept; counter; }
}
table inet np_other {
    chain post { type nat hook postrouting priority srcnat; policy accept; ip daddr 10.206.99.0/24 masquerade; }
}
"""
    r = subprocess.run(
        ["ip", "netns", "exec", node.node, "nft", "-f", "-"], input=foreign, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    before = node.ruleset()
    eg = node.egress()
    eg.remove()  # nothing of ours yet: a no-op
    assert node.ruleset() == before
    eg.ensure(CLUSTER, POD_CIDRS)
    assert "np_foreign" in node.ruleset() and "np_other" in node.ruleset()
    eg.remove()
    eg.remove()
    assert node.ruleset() == before
    assert not eg.present()


@pytest.mark.parametrize(
    ("cluster", "pods", "field", "reason"),
    [
        (["10.206.0.1/20"], [], "cluster_cidrs", "not a network in CIDR form"),
        (["10.206.0.0/20"], ["fd00:10:206:1::1/64"], "pod_cidrs", "not a network in CIDR form"),
        ("10.206.0.0/20,", [], "cluster_cidrs", "not a network in CIDR form"),
        ([], [], "cluster_cidrs", "needs at least one cluster or pod CIDR"),
    ],
)
def test_bad_cidrs_name_the_field_and_change_nothing(
    node: EgressNet, cluster: list[str] | str, pods: list[str], field: str, reason: str
) -> None:
    before = node.ruleset()
    with pytest.raises(InvalidArgument) as exc:
        node.egress().ensure(cluster, pods)
    assert exc.value.field == field and reason in str(exc.value)
    assert node.ruleset() == before


def test_bad_table_name() -> None:
    with pytest.raises(InvalidArgument, match="invalid table 'a b'"):
        Egress("a b")


def test_nft_missing_or_failing_is_a_clear_error(node: EgressNet) -> None:
    with pytest.raises(EgressError, match=r"not found .*install the nftables package"):
        Egress(node.table, netns=node.node_path, nft="/nonexistent/nft").ensure(CLUSTER)
    with pytest.raises(EgressError, match=r"exited with status \d+: .*") as exc:
        Egress(node.table, netns="/nonexistent/netns").remove()
    assert exc.value.details["exit_status"] != 0


def test_concurrent_ensures_leave_one_rule_set(node: EgressNet) -> None:
    eg = node.egress()
    with ThreadPoolExecutor(6) as ex:
        list(ex.map(lambda _: eg.ensure(CLUSTER, POD_CIDRS), range(12)))
    ruleset = node.ruleset()
    assert ruleset.count(f"table inet {node.table} ") == 1 and ruleset.count("masquerade") == 2
    eg.remove()
    assert f"table inet {node.table}" not in node.ruleset()
