"""Real pods: a kubelet per node, the scheduler places them, containerd 2 runs them, netplugin networks them.

Two nodes (tests/cluster/kubeletnodes.py), each a network namespace holding containerd 2, netplugin
installed as the shipped DaemonSet installs it (its daemon started with the container's command), and
a kubelet (1.37, from scripts/build-peers.sh) that registers its Node with the real control plane of
tests/support/kubeplane.py, where kube-controller-manager allocates each Node's pod CIDRs and kube-scheduler
runs. Everything after the nodes joined goes through the API only, as a user deploys an app: a
Deployment whose Pods are spread over both nodes by a topology spread constraint; its ReplicaSet
creates them, the scheduler binds them, each kubelet runs its own through containerd, whose CNI
calls reach netplugin's daemon. A rollout then replaces every Pod, and the Deployment is deleted;
netplugin must have torn each replaced or deleted Pod down. The tests run in file order on one
cluster.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from netplugin.frontends.lab.simcluster.cluster import UNDERLAY_V4, SimNode
from netplugin.frontends.lab.simcluster.nsexec import ip_json
from tests.cluster.kubecluster import apply_shipped_rbac
from tests.cluster.kubeletnodes import KERNEL_TUNABLES, KUBELET_PEERS, WEB_IMAGE, KubeletCluster
from tests.cluster.labnodes import cluster_unavailable_reason, plugin_operations
from tests.frontends.cni.containerd import unavailable_reason
from tests.support.gopeers import require
from tests.support.kubeplane import KUBE_PEERS, ControlPlane

pytestmark = [pytest.mark.kernel, pytest.mark.containerd]

NAMESPACE = "default"
APP = "kubelet-web"  # the Deployment's name and its Pods' app label
PODS = 4  # two per node: the spread constraint allows no other placement
PORT = 8080
#: generous bounds for two kubelets and a control plane on two shared cores; only a failure waits them out
RUNNING_WITHIN = 120.0
GONE_WITHIN = 60.0
#: paths a kubelet uses by default on a real node: none of them may appear on this machine
KUBELET_DEFAULT_PATHS = (
    "/var/lib/kubelet",
    "/var/log/pods",
    "/var/log/containers",
    "/usr/libexec/kubernetes/kubelet-plugins/volume",
)
# The container: its pod's name as the page httpd serves, and an exit on SIGTERM (as PID 1, the shell
# would ignore it and the kubelet would wait out the grace period).
# From inside a container: the page at $0 on PORT, over HTTP/1.0 (busybox-static's wget crashes
# without the libc files of a full image; its nc needs none).
FETCH = f'set -o pipefail; printf "GET / HTTP/1.0\\r\\n\\r\\n" | nc -w 5 "$0" {PORT} | tail -n 1'
#: what the kubelet's service-account volume puts in every container
SA_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
SERVE = f'trap "exit 0" TERM; mkdir -p /www; echo "$POD_NAME" > /www/index.html; httpd -f -p {PORT} -h /www & wait'


def _tunables() -> dict[str, str]:
    return {p: Path("/proc/sys", p).read_text().strip() for p in KERNEL_TUNABLES}


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    reason = cluster_unavailable_reason() or unavailable_reason()
    if reason:
        pytest.skip(reason)
    peers = require(*KUBE_PEERS, *KUBELET_PEERS)
    root: Path = tmp_path_factory.mktemp("kubeplane")
    with ControlPlane(root, peers, san_ips=(str(UNDERLAY_V4.network_address + 1),), for_kubelets=True) as cp:
        apply_shipped_rbac(cp)  # the daemons' identity and rights, as shipped
        cp.wait_for("ServiceAccount default/default", lambda: cp.objects("ServiceAccount", NAMESPACE))
        yield cp


@pytest.fixture(scope="module")
def cluster(plane: ControlPlane) -> Iterator[KubeletCluster]:
    before = _tunables()
    existed = {p for p in KUBELET_DEFAULT_PATHS if os.path.lexists(p)}
    with KubeletCluster(plane, plane.peers) as c:
        for _ in range(2):
            c.join()
        c.wait_routes(30.0)
        yield c
    # The kubelets changed nothing of the machine's own: its sysctls, its default paths.
    assert _tunables() == before
    assert [p for p in KUBELET_DEFAULT_PATHS if os.path.lexists(p) and p not in existed] == []


@dataclass
class RunningPod:
    """A Pod as the API reports it once Running, and where its sandbox is on its node."""

    name: str
    uid: str
    node: SimNode
    ips: list[str]
    seconds_to_running: float
    sandbox_id: str
    netns: str
    container_id: str


@dataclass
class Fleet:
    """The Deployment's Pods: those running now, and every one that ever ran (a rollout replaces them)."""

    current: dict[str, RunningPod]
    ever: dict[str, RunningPod]

    def take(self, pods: dict[str, RunningPod]) -> None:
        self.current = pods
        self.ever.update(pods)


def _deployment(revision: int) -> dict[str, Any]:
    """The app's Deployment; a new ``revision`` changes its Pod template, so it rolls out new Pods."""
    container = {
        "name": "web",
        "image": WEB_IMAGE,
        "imagePullPolicy": "Never",  # imported into each node's containerd: no registry is reachable
        "command": ["/bin/sh", "-c", SERVE],
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "ports": [{"containerPort": PORT}],
        # probed by the kubelet from its node: node -> pod through netplugin's bridge
        "readinessProbe": {"httpGet": {"path": "/", "port": PORT}, "periodSeconds": 1},
    }
    # No nodeName anywhere: the scheduler chooses, evenly over the nodes. matchLabelKeys counts only
    # the Pods of one template, so a rollout's new Pods are spread among themselves, not around the old.
    spread = {
        "maxSkew": 1,
        "topologyKey": "kubernetes.io/hostname",
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"app": APP}},
        "matchLabelKeys": ["pod-template-hash"],
    }
    template = {
        "metadata": {"labels": {"app": APP}, "annotations": {"netplugin.test/revision": str(revision)}},
        "spec": {
            "containers": [container],
            "topologySpreadConstraints": [spread],
            "dnsPolicy": "Default",
            "terminationGracePeriodSeconds": 5,
        },
    }
    spec = {"replicas": PODS, "selector": {"matchLabels": {"app": APP}}, "template": template}
    metadata = {"name": APP, "namespace": NAMESPACE}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata, "spec": spec}


def _deployment_path() -> str:
    return f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{APP}"


def _crictl(cluster: KubeletCluster, node: SimNode, *args: str, timeout: float = 60) -> str:
    sock = f"unix://{cluster.containerds[node.name].socket}"
    argv = [str(cluster.plane.peers / "crictl"), f"--runtime-endpoint={sock}", f"--image-endpoint={sock}"]
    argv += ["--timeout=30s", *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"crictl {' '.join(args)} on {node.name}: {done.stderr}"
    return done.stdout.strip()


def _kubelet_logs(cluster: KubeletCluster) -> str:
    return "\n".join(f"--- {n.name}:\n{cluster.kubelet_log(n)}" for n in cluster.nodes.values())


def _app_pods(cluster: KubeletCluster) -> dict[str, dict[str, Any]]:
    return {
        p["metadata"]["name"]: p
        for p in cluster.plane.objects("Pod", NAMESPACE)
        if (p["metadata"].get("labels") or {}).get("app") == APP
    }


def _wait_rolled_out(cluster: KubeletCluster, since: float, gone: set[str]) -> dict[str, tuple[dict[str, Any], float]]:
    """The Deployment's Pods once its latest generation is fully rolled out (every Pod of the new
    template Running and Ready, none of the old left in the API, ``gone`` among them), with the
    seconds from ``since`` to each Pod's first Running seen."""
    plane = cluster.plane
    running: dict[str, float] = {}
    deadline = time.monotonic() + RUNNING_WITHIN
    while True:
        deployment = plane.request("GET", _deployment_path())
        status = deployment["status"]
        pods = _app_pods(cluster)
        now = time.monotonic()
        for name, pod in pods.items():
            if pod["status"].get("phase") == "Running" and name not in running:
                running[name] = now - since
        ready = {
            name
            for name, pod in pods.items()
            if any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or [])
        }
        counts = [status.get(k, 0) for k in ("replicas", "updatedReplicas", "readyReplicas", "availableReplicas")]
        done = status.get("observedGeneration") == deployment["metadata"]["generation"] and counts == [PODS] * 4
        if done and len(pods) == PODS and ready == set(pods) <= set(running) and not gone & set(pods):
            return {name: (pod, running[name]) for name, pod in pods.items()}
        if now > deadline:
            states = {n: (p["spec"].get("nodeName"), p["status"]) for n, p in pods.items() if n not in ready}
            raise AssertionError(
                f"Deployment {APP} not rolled out within {RUNNING_WITHIN:g} s: status {status}; "
                f"Pods not Ready {states}; old Pods left {sorted(gone & set(pods))}\n{_kubelet_logs(cluster)}"
            )
        time.sleep(0.1)


def _sandbox(cluster: KubeletCluster, node: SimNode, uid: str) -> tuple[str, str, str]:
    """(sandbox id, its netns path, the web container's id) of the Pod ``uid`` on ``node``'s containerd."""
    sandbox_id = _crictl(cluster, node, "pods", "-q", "--state", "ready", "--label", f"io.kubernetes.pod.uid={uid}")
    assert sandbox_id and "\n" not in sandbox_id, f"one sandbox for pod {uid} on {node.name}: {sandbox_id!r}"
    sandbox = cluster.containerds[node.name].status(sandbox_id)
    container_id = _crictl(cluster, node, "ps", "-q", "--pod", sandbox_id, "--name", "web")
    return sandbox_id, sandbox.netns, container_id


def _running_pods(cluster: KubeletCluster, since: float, gone: set[str]) -> dict[str, RunningPod]:
    out = {}
    for name, (pod, seconds) in _wait_rolled_out(cluster, since, gone).items():
        node = cluster.nodes[pod["spec"]["nodeName"]]
        ips = [a["ip"] for a in pod["status"]["podIPs"]]
        sandbox_id, netns, container_id = _sandbox(cluster, node, pod["metadata"]["uid"])
        out[name] = RunningPod(name, pod["metadata"]["uid"], node, ips, seconds, sandbox_id, netns, container_id)
    return out


def _assert_node_holds_exactly(cluster: KubeletCluster, pods: dict[str, RunningPod]) -> None:
    """Each node has a veth, an address lease and a daemon record for its ``pods``, and nothing more."""
    for node in cluster.nodes.values():
        mine = sorted(p.name for p in pods.values() if p.node is node)
        listing = cluster.netplugin(node, "pods")
        assert sorted(p["name"] for p in listing["pods"]) == mine and listing["corrupt"] == [], listing
        veths = [link["ifname"] for link in ip_json("-n", node.netns, "link", "show", "type", "veth")]
        assert len(veths) == len(mine) + 1 and "eth0" in veths, f"{node.name}: veths {veths} for pods {mine}"
        ipam = node.root / "state" / "bridge"
        leases = sorted(p.name for p in ipam.rglob("*") if p.parent.name == "ips" and not p.name.startswith("."))
        held = sorted(a for p in pods.values() if p.node is node for a in p.ips)
        assert leases == held, f"addresses allocated on {node.name}: {leases}, pods hold {held}"


@pytest.fixture(scope="module")
def fleet(cluster: KubeletCluster) -> Fleet:
    started = time.monotonic()
    cluster.plane.apply(_deployment(1))
    pods = _running_pods(cluster, started, set())
    print("\nDeployment create -> each Pod Running (s):", {n: round(p.seconds_to_running, 2) for n, p in pods.items()})
    return Fleet(current=pods, ever=dict(pods))


def test_each_kubelet_registers_its_node_which_is_ready_once_netplugin_answers(cluster: KubeletCluster) -> None:
    for node in cluster.nodes.values():
        obj = cluster.node_object(node.name)
        assert obj is not None
        info = obj["status"]["nodeInfo"]
        assert info["kubeletVersion"] == "v1.37.2" and info["containerRuntimeVersion"].startswith("containerd://2."), (
            info
        )
        # registered by its kubelet (the test never created it), its addresses the kubelet's --node-ip
        assert {m["manager"] for m in obj["metadata"]["managedFields"]} >= {"kubelet"}, obj["metadata"]["managedFields"]
        internal = [a["address"] for a in obj["status"]["addresses"] if a["type"] == "InternalIP"]
        assert internal == [node.ipv4, node.ipv6]
        # one pod CIDR per family from the controller-manager, and the daemon serves exactly those
        assert obj["spec"]["podCIDRs"] == list(node.pod_cidrs) and len(node.pod_cidrs) == 2
        assert cluster.health(node)["node"]["pod_cidrs"] == list(node.pod_cidrs)
        # Before netplugin's daemon ran, containerd's CNI STATUS failed and the kubelet said why.
        before = cluster.not_ready[node.name]
        assert before["status"] == "False" and "NetworkReady=false" in before["message"], before
        print(f"\n{node.name} NotReady before its daemon ran: {before['message']}")


def test_the_scheduler_places_the_pods_and_each_runs_on_its_nodes_network(
    cluster: KubeletCluster, fleet: Fleet
) -> None:
    pods = fleet.current
    for pod in pods.values():
        obj = cluster.plane.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{pod.name}")
        # made by the Deployment's ReplicaSet, bound by the scheduler
        assert [o["kind"] for o in obj["metadata"]["ownerReferences"]] == ["ReplicaSet"], obj["metadata"]
        assert any(c["type"] == "PodScheduled" and c["status"] == "True" for c in obj["status"]["conditions"])
        # every IP in its own node's pod CIDR of its family, one per family
        cidrs = {ipaddress.ip_network(c).version: ipaddress.ip_network(c) for c in pod.node.pod_cidrs}
        assert sorted(ipaddress.ip_address(a).version for a in pod.ips) == [4, 6], pod.ips
        assert all(ipaddress.ip_address(a) in cidrs[ipaddress.ip_address(a).version] for a in pod.ips), pod
        assert obj["status"]["podIP"] == pod.ips[0]
        # the addresses really are on the pod's eth0, inside the sandbox's netns
        shown = subprocess.run(
            ["nsenter", f"--net={pod.netns}", "ip", "-j", "addr", "show", "dev", "eth0"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout  # fmt: skip
        on_eth0 = {a["local"] for link in json.loads(shown) for a in link["addr_info"]}
        assert set(pod.ips) <= on_eth0, (pod.name, on_eth0)
        # the kubelet's service-account volume reached the container (its root dir is a shared mount)
        ns = _crictl(cluster, pod.node, "exec", "-s", pod.container_id, "cat", SA_NAMESPACE_FILE)
        assert ns == NAMESPACE
    # The scheduler chose, the test never did: two pods on each node, and it says so in events.
    per_node = sorted(sum(1 for p in pods.values() if p.node is n) for n in cluster.nodes.values())
    assert per_node == [PODS // 2, PODS // 2], {p.name: p.node.name for p in pods.values()}
    events = cluster.plane.request("GET", f"/api/v1/namespaces/{NAMESPACE}/events")["items"]
    scheduled = {
        e["involvedObject"]["name"]
        for e in events
        if e["reason"] == "Scheduled"
        and "default-scheduler" in (e.get("reportingComponent"), e["source"].get("component"))
    }
    assert scheduled >= set(pods), scheduled
    # Each node's daemon knows its pods by name (the shim forwarded every ADD to it), and holds
    # one veth and one lease per address for them.
    _assert_node_holds_exactly(cluster, pods)


def _cross_node_failures(cluster: KubeletCluster, pods: dict[str, RunningPod]) -> list[str]:
    """Each pod fetches the page of every pod on the other node, at each of its addresses."""
    failures = []
    for src in pods.values():
        for dst in pods.values():
            if dst.node is src.node:
                continue
            for address in dst.ips:
                answer = _crictl(cluster, src.node, "exec", "-s", src.container_id, "/bin/sh", "-c", FETCH, address)
                if answer != dst.name:
                    failures.append(f"{src.name}@{src.node.name} -> {dst.name} {address}: {answer!r}")
    return failures


def test_a_container_reaches_the_pods_of_the_other_node_over_both_families(
    cluster: KubeletCluster, fleet: Fleet
) -> None:
    assert _cross_node_failures(cluster, fleet.current) == []


def test_a_rollout_replaces_every_pod_and_netplugin_tears_the_old_ones_down(
    cluster: KubeletCluster, fleet: Fleet
) -> None:
    old = fleet.current
    deployment = cluster.plane.request("GET", _deployment_path())
    deployment["spec"]["template"] = _deployment(2)["spec"]["template"]
    started = time.monotonic()
    cluster.plane.request("PUT", _deployment_path(), deployment)
    # The rolling update creates and deletes Pods a few at a time; it is over when only new ones are left.
    new = _running_pods(cluster, started, set(old))
    fleet.take(new)
    print(f"\nRollout -> every Pod replaced, the old gone from the API: {time.monotonic() - started:.2f} s")
    assert not set(new) & set(old)
    per_node = sorted(sum(1 for p in new.values() if p.node is n) for n in cluster.nodes.values())
    assert per_node == [PODS // 2, PODS // 2], {p.name: p.node.name for p in new.values()}
    # The kubelet removes a Pod from the API once its sandbox is stopped: each old Pod's CNI DEL has
    # run, and netplugin released what it held; each address a node hands out again is one it freed.
    _assert_node_holds_exactly(cluster, new)
    for pod in old.values():
        assert not os.path.exists(pod.netns), f"{pod.name}'s netns {pod.netns} is left"
    assert _cross_node_failures(cluster, new) == []


def test_the_deleted_deployments_pods_are_torn_down_by_netplugin(cluster: KubeletCluster, fleet: Fleet) -> None:
    # As kubectl deletes: the Deployment at once, the garbage collector its ReplicaSets and their Pods.
    cluster.plane.request(
        "DELETE", _deployment_path(), {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
    )
    started = time.monotonic()
    deadline = started + GONE_WITHIN
    while names := set(_app_pods(cluster)):
        if time.monotonic() > deadline:
            raise AssertionError(
                f"Pods {sorted(names)} still in the API after {GONE_WITHIN:g} s\n{_kubelet_logs(cluster)}"
            )
        time.sleep(0.1)
    print(f"\nDeployment deleted -> its Pods gone from the API: {time.monotonic() - started:.2f} s")
    _assert_node_holds_exactly(cluster, {})
    for node in cluster.nodes.values():
        held = sorted(
            p.name for p in (node.root / "state" / "bridge").rglob("*") if p.is_file() and p.parent.name == "pods"
        )
        assert held == [], f"pod records of the IPAM left on {node.name}: {held}"
        # one setup and at least one teardown for every Pod the node ever ran (both templates)
        ran = sum(1 for p in fleet.ever.values() if p.node is node)
        ops = plugin_operations(cluster, node)
        assert ops["set_up_pod"] == ran and ops["tear_down_pod"] >= ran, ops
    for pod in fleet.current.values():
        assert not os.path.exists(pod.netns), f"{pod.name}'s netns {pod.netns} is left"
