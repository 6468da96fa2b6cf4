"""NetworkPolicy beside netplugin: the real kube-network-policies on nodes installed as shipped, and
netplugin's self-repair while a deny policy is in force.

Two nodes (network namespaces on an underlay) against Kubernetes' own API server
(tests/support/kubeplane.py). Each node is installed from the shipped ConfigMap and DaemonSet
(tests/cluster/shippednodes.py: the init container's install, the daemon container's command) and
runs the real kube-network-policies as its upstream DaemonSet does (tests/cluster/policyagent.py:
hostNetwork, the manifest's flags and RBAC, pod IPs from the API). Pods are network namespaces set up
by each node's netplugin; their Pod objects carry their labels and addresses, as a kubelet reports
them.

One policy selects ``role=server`` and admits only ``role=client`` on TCP 8080. The matrix: a client
and a stranger on the server's node (bridged: the policy sees them only through br_netfilter) and on
the other node (routed: netplugin's egress masquerade must keep their source), and the stranger's
path to an unselected pod (so that a refusal is the policy's, not a broken network).

Then netplugin's tables go, two ways, with probes running from the stranger the whole time:

* netplugin's own (its egress table, its hostPort table, its FORWARD chain): the daemon puts them
  back; the agent's table is left byte for byte as it was (same rules, same handles);
* ``nft flush ruleset``, as a firewall reload does: everything goes, the agent's table too. The
  agent re-syncs its table on the next Pod or NetworkPolicy event (it has no periodic re-sync;
  until then nothing of it exists, which is the agent's window, not netplugin's). The daemon is
  held stopped until the agent has re-synced, so that netplugin's repair runs under the policy.

In both, no denied probe gets through, and the allowed ones do once the repair is done.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from netplugin.frontends.lab.simcluster.apiobjects import make_node, make_pod
from netplugin.frontends.lab.simcluster.cluster import UNDERLAY_V4, SimNode, SimPod
from netplugin.nodenet.forward import CHAIN
from tests.cluster.kubecluster import KubeCluster, apply_shipped_rbac
from tests.cluster.labnodes import cluster_unavailable_reason
from tests.cluster.policyagent import AGENT, AGENT_PEERS, PolicyAgent, apply_rbac
from tests.cluster.shippednodes import ShippedNodes
from tests.support.gopeers import require
from tests.support.kubeplane import KUBE_PEERS, ControlPlane
from tests.support.waits import wait_for

pytestmark = pytest.mark.kernel

PORT = 8080
#: the server's hostPort (to its PORT), on its node's address
HOST_PORT = 30080
NAMESPACE = "default"
POLICY = "server-admits-clients"
#: pod name -> (node index, role label)
PODS = {
    "server": (0, "server"),
    "open": (0, "open"),
    "near-client": (0, "client"),
    "near-stranger": (0, "stranger"),
    "far-client": (1, "client"),
    "far-stranger": (1, "stranger"),
}
#: (client, target, allowed): what the policy decides, and the unselected pod every client reaches.
#: "hostport" is the server's hostPort on its node's address: DNATed before the agent judges, so it
#: sees the server's port and the client's own address from the same node; from the other node the
#: client reaches a node address, which its own node masquerades: the agent sees that node.
MATRIX = [
    ("near-client", "server", True),
    ("near-stranger", "server", False),
    ("far-client", "server", True),
    ("far-stranger", "server", False),
    ("near-stranger", "open", True),
    ("far-stranger", "open", True),
    ("near-client", "hostport", True),
    ("near-stranger", "hostport", False),
    ("far-client", "hostport", False),
]
#: netplugin's nftables tables are named so (``inet netplugin``, the egress table; ``inet netplugin_hostport``)
NETPLUGIN_PREFIX = "netplugin"


class PolicyNodes(ShippedNodes, KubeCluster):
    """Nodes installed as shipped (no runtime: pods are set up through the node's netplugin), against ``plane``."""

    def join(self) -> SimNode:
        node = self.add_node(start=False, register=False)
        self.plane.apply(make_node(node.name, [], list(node.internal_ips)))
        node.pod_cidrs = tuple(self.wait_pod_cidrs(node.name))
        self.start_daemon(node)
        return node

    def labelled_pod(self, node: SimNode, name: str, role: str, host_port: int | None = None) -> SimPod:
        """A Pod labelled ``role=ROLE`` (with a hostPort to PORT), set up by the node's netplugin, which
        reads the hostPort from the Pod's spec as it does when the runtime passes none."""
        pod = SimPod(node, NAMESPACE, name, f"np{self.tag}p{len(self.pods)}{secrets.token_hex(2)}")
        obj = make_pod(NAMESPACE, name, node.name, labels={"role": role})
        if host_port is not None:
            obj["spec"]["containers"][0]["ports"] = [{"containerPort": PORT, "hostPort": host_port, "protocol": "TCP"}]
        self.plane.apply(obj)
        self._add_netns(pod.infra_id)
        self.pods[(NAMESPACE, name)] = pod
        self.netplugin(node, "setup", NAMESPACE, name, pod.infra_id)
        pod.ips = self.pod_ips(pod)
        return pod


@pytest.fixture(scope="module")
def peers() -> Path:
    return require(*KUBE_PEERS, *AGENT_PEERS)


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory, peers: Path) -> Iterator[ControlPlane]:
    reason = cluster_unavailable_reason()
    if reason:
        pytest.skip(reason)
    relay = str(UNDERLAY_V4.network_address + 1)
    with ControlPlane(tmp_path_factory.mktemp("kubeplane"), peers, san_ips=(relay,)) as cp:
        apply_shipped_rbac(cp)
        cp.wait_for("ServiceAccount default/default", lambda: cp.objects("ServiceAccount", "default"))
        yield cp


@pytest.fixture(scope="module")
def cluster(plane: ControlPlane) -> Iterator[PolicyNodes]:
    with PolicyNodes(plane, bookmark_interval=0.5) as c:
        for _ in range(2):
            c.join()
        c.wait_routes(30.0)
        yield c


def _report_status(plane: ControlPlane, pod: SimPod) -> None:
    """The Pod's status as a kubelet reports it: Running, its addresses."""
    path = f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}"
    obj = plane.request("GET", path)
    obj["status"] = {
        "phase": "Running",
        "hostIP": pod.node.ipv4,
        "podIP": pod.ips[0],
        "podIPs": [{"ip": a} for a in pod.ips],
    }
    plane.request("PUT", f"{path}/status", obj)


@pytest.fixture(scope="module")
def pods(cluster: PolicyNodes) -> dict[str, SimPod]:
    nodes = list(cluster.nodes.values())
    made = {}
    for name, (index, role) in PODS.items():
        port = HOST_PORT if name == "server" else None
        made[name] = pod = cluster.labelled_pod(nodes[index], name, role, port)
        assert pod.ip(4), pod.ips
        _report_status(cluster.plane, pod)
    return made


def _policy() -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": POLICY, "namespace": NAMESPACE},
        "spec": {
            "podSelector": {"matchLabels": {"role": "server"}},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": {"role": "client"}}}],
                    "ports": [{"protocol": "TCP", "port": PORT}],
                }
            ],
        },
    }


POLICIES = f"/apis/networking.k8s.io/v1/namespaces/{NAMESPACE}/networkpolicies"


@pytest.fixture(scope="module")
def agents(cluster: PolicyNodes, pods: dict[str, SimPod], peers: Path) -> Iterator[dict[str, PolicyAgent]]:
    namespace, account = apply_rbac(cluster.plane, peers)
    cluster.plane.request("POST", POLICIES, _policy())
    assert cluster.relay is not None
    started: dict[str, PolicyAgent] = {}
    try:
        for node in cluster.nodes.values():
            token = cluster.plane.service_account_token(namespace, account)
            agent = PolicyAgent(cluster, node, peers, token, cluster.relay.port)
            started[node.name] = agent
            agent.start(cluster.plane.pki / "ca.crt")
        # Enforced once the server's node queues the server's address (the agent's set of selected local
        # pods); with the stand-in the agent has its caches (the policy, the pods) once it tried its table.
        server = pods["server"]
        if not started[server.node.name].standin:
            wait_for(
                lambda: server.ip(4) in _agent_set(started[server.node.name]),
                f"{AGENT} selecting the server's address",
                60.0,
                detail=started[server.node.name].log_tail,
            )
        yield started
    finally:
        for agent in started.values():
            agent.stop()


def _agent_set(agent: PolicyAgent) -> str:
    done = agent.cluster.exec_in(agent.node.netns, ["nft", "list", "set", "inet", AGENT, "podips-v4"])
    return done.stdout.decode() if done.returncode == 0 else ""


# A prober: connects to ADDRESS:PORT over and over (each attempt bounded), one line per attempt,
# "<monotonic time> 1" when the connection was made, "<time> 0" when not; until killed.
_PROBE = r"""
import socket, sys, time
address, port = sys.argv[1], int(sys.argv[2])
while True:
    start = time.monotonic()
    try:
        socket.create_connection((address, port), timeout=0.4).close()
        ok = 1
    except OSError:
        ok = 0
    print(f"{time.monotonic():.3f} {ok}", flush=True)
    time.sleep(max(0.0, 0.15 - (time.monotonic() - start)))
"""


class Probes:
    """A prober per (client, server) pair, from the client's netns, recording every attempt."""

    def __init__(self, cluster: PolicyNodes, pods: dict[str, SimPod], pairs: list[tuple[str, str]]) -> None:
        self.results: dict[tuple[str, str], list[tuple[float, bool]]] = {p: [] for p in pairs}
        self.procs: list[subprocess.Popen[bytes]] = []
        for client, server in pairs:
            argv = ["ip", "netns", "exec", pods[client].infra_id, sys.executable, "-c", _PROBE, str(pods[server].ip(4)),
                    str(PORT)]  # fmt: skip
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True)
            self.procs.append(proc)
            threading.Thread(target=self._read, args=(proc, self.results[(client, server)]), daemon=True).start()

    @staticmethod
    def _read(proc: subprocess.Popen[bytes], into: list[tuple[float, bool]]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            t, ok = line.split()
            into.append((float(t), ok == b"1"))

    def stop(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def passed(self, pair: tuple[str, str], since: float = 0.0) -> int:
        return sum(1 for t, ok in self.results[pair] if ok and t >= since)

    def tried(self, pair: tuple[str, str], since: float = 0.0) -> int:
        return sum(1 for t, _ in self.results[pair] if t >= since)


@contextlib.contextmanager
def probing(cluster: PolicyNodes, pods: dict[str, SimPod], pairs: list[tuple[str, str]]) -> Iterator[Probes]:
    probes = Probes(cluster, pods, pairs)
    try:
        yield probes
    finally:
        probes.stop()


def _reaches(cluster: PolicyNodes, pods: dict[str, SimPod], client: str, target: str) -> bool:
    if target == "hostport":
        address, port = pods["server"].node.ipv4, HOST_PORT
    else:
        address, port = str(pods[target].ip(4)), PORT
    return bool(cluster.connect(pods[client].infra_id, address, port, timeout=2.0))


def _listening(cluster: PolicyNodes, pods: dict[str, SimPod]) -> contextlib.AbstractContextManager[None]:
    return cluster.listeners([pods["server"].infra_id, pods["open"].infra_id], PORT, lambda ns: ns)


def _nft(cluster: PolicyNodes, node: SimNode, *args: str) -> str:
    done = cluster.exec_in(node.netns, ["nft", *args])
    assert done.returncode == 0, done.stderr
    return done.stdout.decode()


def _tables(cluster: PolicyNodes, node: SimNode) -> set[tuple[str, str]]:
    doc = json.loads(_nft(cluster, node, "-j", "list", "tables") or "{}")
    return {(t["table"]["family"], t["table"]["name"]) for t in doc.get("nftables", []) if "table" in t}


def _netplugin_tables(cluster: PolicyNodes, node: SimNode) -> list[tuple[str, str]]:
    return sorted(t for t in _tables(cluster, node) if t[1].startswith(NETPLUGIN_PREFIX))


def _netplugin_state(cluster: PolicyNodes, node: SimNode) -> dict[str, str]:
    """netplugin's nftables tables (their rules, handles left out) and its FORWARD chain, as listed."""
    out = {f"{f} {n}": _nft(cluster, node, "list", "table", f, n) for f, n in _netplugin_tables(cluster, node)}
    done = cluster.exec_in(node.netns, ["iptables", "-w", "-S", CHAIN])
    out[CHAIN] = done.stdout.decode() if done.returncode == 0 else ""
    return out


def _repaired(cluster: PolicyNodes, node: SimNode, want: dict[str, str]) -> bool:
    with contextlib.suppress(AssertionError):
        return _netplugin_state(cluster, node) == want
    return False


def test_the_policy_is_enforced_on_one_node_and_across_nodes(
    cluster: PolicyNodes, pods: dict[str, SimPod], agents: dict[str, PolicyAgent]
) -> None:
    with _listening(cluster, pods):
        seen = {(c, s): _reaches(cluster, pods, c, s) for c, s, _ in MATRIX}
    assert seen == {(c, s): allowed for c, s, allowed in MATRIX}


def _doctor(cluster: PolicyNodes, node: SimNode) -> tuple[int, dict[str, dict[str, Any]]]:
    """``netplugin doctor`` in the node, on its installed conflist: exit status, checks by name."""
    argv = ["ip", "netns", "exec", node.netns, sys.executable, "-m", "netplugin", "--config", str(node.config_path),
            "-o", "json", "doctor", "--cni-conf-dir", str(node.root / "cni-conf"),
            "--cni-bin-dir", str(node.root / "cni-bin")]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, env=cluster.env, timeout=120, check=False)
    assert b"Traceback" not in done.stderr, done.stderr
    return done.returncode, {c["name"]: c for c in json.loads(done.stdout)["checks"]}


def test_the_doctor_names_the_agent_and_br_netfilter_is_on(
    cluster: PolicyNodes, pods: dict[str, SimPod], agents: dict[str, PolicyAgent]
) -> None:
    if any(a.standin for a in agents.values()):
        pytest.skip(STANDIN)
    for node in cluster.nodes.values():
        policy = _doctor(cluster, node)[1]["policy"]
        assert policy["ok"], policy
        assert f"{AGENT} (nftables table inet {AGENT})" in policy["found"]


def test_without_br_netfilter_the_same_node_stranger_bypasses_the_policy(
    cluster: PolicyNodes, pods: dict[str, SimPod], agents: dict[str, PolicyAgent]
) -> None:
    # What the shipped setting (the bridge plugin's BR_NETFILTER, on) prevents: bridged frames skip
    # netfilter, the agent never sees them. Turned off in the server's node alone, then back on.
    node = pods["server"].node
    cluster.sysctl(node.netns, "net.bridge.bridge-nf-call-iptables=0")
    try:
        with _listening(cluster, pods):
            near = _reaches(cluster, pods, "near-stranger", "server")
            far = _reaches(cluster, pods, "far-stranger", "server")
        code, checks = _doctor(cluster, node)
    finally:
        cluster.sysctl(node.netns, "net.bridge.bridge-nf-call-iptables=1")
    assert (near, far) == (True, False)  # routed traffic still meets the agent
    if agents[node.name].standin:
        return  # doctor names the agent by its table, which this kernel refuses it (STANDIN)
    policy = checks["policy"]
    assert code == 7 and not policy["ok"], policy
    assert f"bridge-nf-call-iptables off while {AGENT} enforces NetworkPolicy" in policy["problem"]


STANDIN = (
    "this kernel has no nft queue expression (CONFIG_NFT_QUEUE): the agent cannot write its table, which is "
    "what netplugin doctor names it by (tests/frontends/test_doctor_network.py checks that with the table)"
)
STRANGERS = [("near-stranger", "server"), ("far-stranger", "server")]
CLIENTS = [("near-client", "server"), ("far-client", "server")]


def _delete_netplugin_tables(cluster: PolicyNodes, node: SimNode) -> None:
    """What is netplugin's alone: its FORWARD chain (the jump first), then its nftables tables."""
    jump = ["iptables", "-w", "-D", "FORWARD", "-m", "comment", "--comment", "netplugin pod forwarding", "-j", CHAIN]
    while cluster.exec_in(node.netns, jump).returncode == 0:
        pass
    for flag in ("-F", "-X"):
        cluster.exec_in(node.netns, ["iptables", "-w", flag, CHAIN])
    for family, name in _netplugin_tables(cluster, node):
        _nft(cluster, node, "delete", "table", family, name)


@pytest.mark.parametrize("node_index", [0, 1], ids=["server-node", "client-node"])
def test_netplugin_puts_back_its_tables_and_leaves_the_agents_alone_while_denied_stays_denied(
    cluster: PolicyNodes, pods: dict[str, SimPod], agents: dict[str, PolicyAgent], node_index: int
) -> None:
    node = list(cluster.nodes.values())[node_index]
    agent = agents[node.name]
    want, before = _netplugin_state(cluster, node), agent.table()
    assert f"inet {NETPLUGIN_PREFIX}" in want and all(want.values()), want
    with _listening(cluster, pods), probing(cluster, pods, STRANGERS + CLIENTS) as probes:
        wait_for(lambda: all(probes.passed(p) for p in CLIENTS), "the clients' probes to answer", 30.0)
        _delete_netplugin_tables(cluster, node)
        gone = time.monotonic()
        wait_for(lambda: _repaired(cluster, node, want), f"netplugin's tables back on {node.name}", 60.0,
                 detail=lambda: cluster.daemon_log(node)[-1500:])  # fmt: skip
        repaired = time.monotonic()
        # Probed across the repair, and after it: each stranger's attempts run back to back throughout.
        wait_for(
            lambda: (
                all(probes.passed(p, repaired) for p in CLIENTS)
                and all(probes.tried(p, repaired) >= 2 for p in STRANGERS)
            ),
            "the clients' and strangers' probes after the repair",
            30.0,
        )
    assert agent.table() == before  # not one rule of the agent's rewritten, moved or removed
    assert {p: probes.passed(p) for p in STRANGERS} == dict.fromkeys(STRANGERS, 0)
    assert all(probes.tried(p, gone) >= 2 for p in STRANGERS), "the strangers were probed across the repair"
    assert "repair" in cluster.daemon_log(node)


def test_after_a_full_flush_netplugin_repairs_under_the_re_synced_policy(
    cluster: PolicyNodes, pods: dict[str, SimPod], agents: dict[str, PolicyAgent]
) -> None:
    node = pods["server"].node
    agent = agents[node.name]
    want = _netplugin_state(cluster, node)
    assert node.daemon is not None
    os.kill(node.daemon.pid, signal.SIGSTOP)  # held until the agent is back: its repair must run under the policy
    try:
        _nft(cluster, node, "flush", "ruleset")
        assert _tables(cluster, node) == set()
        # Any Pod or NetworkPolicy event makes the agent write its table again (it has no periodic re-sync).
        path = f"{POLICIES}/{POLICY}"
        obj = cluster.plane.request("GET", path)
        obj["metadata"].setdefault("annotations", {})["netplugin.test/resync"] = str(time.time())
        cluster.plane.request("PUT", path, obj)
        agent.resync()
        if not agent.standin:
            server = str(pods["server"].ip(4))
            wait_for(lambda: server in _agent_set(agent), f"{AGENT} re-synced", 60.0, detail=agent.log_tail)
        before = agent.table()
        with _listening(cluster, pods), probing(cluster, pods, STRANGERS + CLIENTS) as probes:
            wait_for(lambda: all(probes.tried(p) >= 3 for p in STRANGERS), "the strangers' probes", 30.0)
            os.kill(node.daemon.pid, signal.SIGCONT)
            wait_for(lambda: _repaired(cluster, node, want), f"netplugin's tables back on {node.name}", 60.0,
                     detail=lambda: cluster.daemon_log(node)[-1500:])  # fmt: skip
            repaired = time.monotonic()
            wait_for(
                lambda: (
                    all(probes.passed(p, repaired) for p in CLIENTS)
                    and all(probes.tried(p, repaired) >= 2 for p in STRANGERS)
                ),
                "the clients' and strangers' probes after the repair",
                30.0,
            )
    finally:
        os.kill(node.daemon.pid, signal.SIGCONT)
    assert agent.table() == before
    assert {p: probes.passed(p) for p in STRANGERS} == dict.fromkeys(STRANGERS, 0)
