"""On the kubelet cluster: a Deployment of a node's pods pinned to one node, from create to all Ready.

The cluster is ``scripts/conformance.sh``'s (:mod:`tests.conformance.cluster`): a control plane and two
nodes on this machine, each a network and a mount namespace with containerd 2, a kubelet and
kube-proxy. The two nodes differ only in their network:

* N, node-1: netplugin, deployed from the shipped ``etc/kubernetes`` (the DaemonSet running the image
  ``scripts/build-image.sh`` builds): the compiled shim, the daemon, the native bridge and hostPort;
* A, node-2: the CNI v1.10 ``bridge`` + ``host-local`` + ``portmap`` of the peer build, from a
  conflist in the node's ``/etc/cni/net.d`` over the Node's pod CIDRs (netplugin's DaemonSet stays
  off it).

Per round and row (the order rotating): a Deployment of ``plan.deployment_replicas`` replicas (110, a
node's maxPods) of the pause image, with a nodeSelector for the row's node, is created; a watch of
its pods stamps each event as it arrives, until every replica is Ready. The makespan runs from the
create request to the last pod's Ready; each pod's startup from its first event (the ReplicaSet
controller created it) to its Ready. Then the Deployment is deleted and the round waits, untimed,
until its pods are gone from the API and the node's containerd holds no sandbox of theirs. A
warm-up wave of 3 replicas per node comes first, not kept.

The kubelets' maxPods is raised to :data:`MAX_PODS`: the 110 replicas and node-1's DaemonSet pod do
not fit the default 110, which counts every pod of the node.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from netplugin import __version__

from .contenders import PEERS_ENV, reference_version
from .context import RunContext
from .harness import Live, Plan, wave_row
from .report import Figure
from .util import REPO, BenchError, ms, rotate

__all__ = ["MAX_PODS", "fig_kubelet_cluster"]

#: the kubelets' maxPods: a full Deployment and the node's own DaemonSet pods
MAX_PODS = 120
NAMESPACE = "wave"
#: bounds of the waits: a node's pods on two shared cores, and their teardown
WAVE_WITHIN = 600.0
LABELS = {
    "N": "netplugin (shipped DaemonSet: compiled shim, daemon, native bridge + hostPort)",
    "A": "CNI {version} bridge + host-local + portmap (conflist)",
}


def _deployment(name: str, node: str, replicas: int, pause: str) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "terminationGracePeriodSeconds": 0,
                    "enableServiceLinks": False,
                    "automountServiceAccountToken": False,
                    "containers": [{"name": "pause", "image": pause, "imagePullPolicy": "Never"}],
                },
            },
        },
    }  # fmt: skip


def _ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


class Waves:
    """Deployments on the cluster's nodes: one wave at a time, timed from the watch of its pods."""

    def __init__(self, cluster: Any, pause: str, say: Callable[[str], None]) -> None:
        self.cluster = cluster
        self.plane = cluster.plane
        self.pause = pause
        self.say = say
        self.count = 0

    def run(self, node: Any, replicas: int) -> tuple[float, list[float]]:
        """One Deployment of ``replicas`` on ``node``: (makespan, each pod's startup), ms; then gone."""
        self.count += 1
        name = f"wave{self.count}"
        path = f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector=app%3D{name}"
        first: dict[str, float] = {}
        ready: dict[str, float] = {}
        ips: dict[str, str] = {}
        t0: float | None = None
        deadline = time.monotonic() + WAVE_WITHIN
        while len(ready) < replicas and time.monotonic() < deadline:
            # A watch may end at any time: watched again, it starts with every pod as it is now (as
            # a client's reflector does); the stamps already taken stay.
            with self.plane.watch(path, timeout=WAVE_WITHIN) as stream:
                if t0 is None:  # created once the watch is open: every pod's first event is seen
                    t0 = time.monotonic()
                    deadline = t0 + WAVE_WITHIN
                    self.plane.apply(_deployment(name, node.name, replicas, self.pause))
                for at, event in stream:
                    if event["type"] == "ERROR":  # a Status, such as 410 Gone: watched again
                        self.say(f"    {name}: the watch said {event['object'].get('message')!r}; watching again")
                        break
                    self._seen(node, name, event["object"], at, first, ready, ips)
                    if len(ready) == replicas or at > deadline:
                        break
                else:
                    self.say(f"    {name}: the watch ended with {len(ready)} pods Ready; watching again")
        if t0 is None or len(ready) < replicas:
            raise BenchError(f"{name} on {node.name}: {len(ready)} of {replicas} pods Ready within {WAVE_WITHIN:g} s")
        self._check_network(node, name, ips)
        self._remove(node, name)
        return ms(max(ready.values()) - t0), [ms(ready[u] - first[u]) for u in ready]

    @staticmethod
    def _seen(node: Any, name: str, pod: dict[str, Any], at: float, first: dict[str, float],
              ready: dict[str, float], ips: dict[str, str]) -> None:  # fmt: skip
        uid = pod["metadata"]["uid"]
        first.setdefault(uid, at)
        if uid in ready or not _ready(pod):
            return
        if pod["spec"].get("nodeName") != node.name:
            raise BenchError(f"{name}: pod {pod['metadata']['name']} ran on {pod['spec'].get('nodeName')}")
        ready[uid] = at
        ips[uid] = pod["status"].get("podIP", "")

    def _check_network(self, node: Any, name: str, ips: dict[str, str]) -> None:
        """Every pod's address is in the node's pod CIDR, and distinct: the node's network gave them."""
        nets = [ipaddress.ip_network(c) for c in node.pod_cidrs]
        addrs = [ipaddress.ip_address(a) for a in ips.values() if a]
        if len(set(addrs)) != len(ips) or not all(any(a in n for n in nets) for a in addrs):
            raise BenchError(f"{name} on {node.name}: pod addresses {sorted(map(str, addrs))} not all distinct "
                             f"and from {node.pod_cidrs}")  # fmt: skip

    def _remove(self, node: Any, name: str) -> None:
        self.plane.delete("Deployment", name, NAMESPACE)
        crictl = [str(self.cluster.peers / "crictl"), "--runtime-endpoint", "unix:///run/containerd/containerd.sock",
                  "pods", "--namespace", NAMESPACE, "--state", "ready", "-q"]  # fmt: skip

        def gone() -> bool:
            pods = self.plane.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector=app%3D{name}")
            return not pods["items"] and not node.run(crictl).stdout.split()

        self.plane.wait_for(f"{name}'s pods gone from {node.name}", gone, WAVE_WITHIN)


def _check_networks(cluster: Any) -> None:
    """netplugin's DaemonSet runs on node-1 alone, and node-2's network is the CNI bridge alone."""
    from tests.conformance.cluster import BRIDGE_PLUGINS

    pods = cluster.plane.objects("Pod", "kube-system")
    where = sorted(p["spec"].get("nodeName") for p in pods
                   if any(o["kind"] == "DaemonSet" for o in p["metadata"].get("ownerReferences") or []))  # fmt: skip
    if where != [cluster.nodes[0].name]:
        raise BenchError(f"kubelet cluster: netplugin's DaemonSet pods run on {where}, "
                         f"not on {cluster.nodes[0].name} alone")  # fmt: skip
    installed = sorted(os.listdir(cluster.nodes[1].host_dir("/opt/cni/bin")))
    if installed != sorted(BRIDGE_PLUGINS):
        raise BenchError(f"kubelet cluster: {cluster.nodes[1].name}'s /opt/cni/bin holds {installed}")


def _images(peers: Path, work: Path, say: Callable[[str], None]) -> tuple[list[Path], Path]:
    """The pause image and netplugin's, as the conformance run builds and serves them."""
    from tests.conformance.cluster import PAUSE_IMAGE
    from tests.conformance.run import build_images

    built = subprocess.run(["bash", str(REPO / "scripts" / "build-image.sh")], capture_output=True, text=True,
                           timeout=1800, stdin=subprocess.DEVNULL, check=False)  # fmt: skip
    if built.returncode != 0:
        raise BenchError(f"scripts/build-image.sh failed: {built.stderr[-2000:]}")
    say(f"  kubelet cluster: netplugin's image {built.stdout.split()[0][:12]} (scripts/build-image.sh)")
    archives: list[Path]
    netplugin: Path
    archives, netplugin = build_images(peers, f"localhost/netplugin:{__version__}", work, refs=[PAUSE_IMAGE])
    return archives, netplugin


def fig_kubelet_cluster(ctx: RunContext, plan: Plan) -> list[Figure]:
    """The makespan of a Deployment of a node's pods, and each pod's startup, N against A."""
    peers = Path(os.environ.get(PEERS_ENV, ""))
    if not os.environ.get(PEERS_ENV) or not os.access(peers / "kubelet", os.X_OK):
        raise BenchError(f"kubelet cluster: the Kubernetes peers are not built (export {PEERS_ENV}=$(bash "
                         "scripts/build-peers.sh))")  # fmt: skip
    sys.path.insert(0, str(REPO))
    from tests.conformance.cluster import PAUSE_IMAGE, Cluster

    replicas, rounds = plan.deployment_replicas, plan.node_burst_rounds
    # not under the run's scratch dir: containerd's socket path, below it, must fit a sockaddr_un
    work = Path(tempfile.mkdtemp(prefix=f"{ctx.tag}k-"))
    ctx.cleanup.push("kubelet cluster's dir", lambda: shutil.rmtree(work, ignore_errors=True))
    os.chmod(work, 0o755)
    archives, netplugin = _images(peers, work, ctx.progress)
    (work / "cluster").mkdir()
    cluster = Cluster(peers, archives, netplugin, nodes=2, bridge_nodes=1, max_pods=MAX_PODS, coredns=False,
                      root=work / "cluster", log=lambda m: ctx.progress(f"  {m}"))  # fmt: skip
    makespans: dict[str, list[float]] = {k: [] for k in LABELS}
    each: dict[str, list[float]] = {k: [] for k in LABELS}
    live = Live(ctx, "kubelet-cluster", list(LABELS))
    with cluster:
        _check_networks(cluster)
        cluster.plane.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        nodes = {"N": cluster.nodes[0], "A": cluster.nodes[1]}
        waves = Waves(cluster, PAUSE_IMAGE, ctx.progress)
        for k in LABELS:  # warm-up: the first pods of a node (its bridge, the image's first container)
            live.call(k, waves.run, nodes[k], 3)
        ctx.progress(f"  kubelet cluster: {rounds} round(s) of a {replicas}-replica Deployment per node")
        for r in range(rounds):
            for k in rotate(list(LABELS), r):
                if k in live.failed:
                    continue
                got = live.call(k, waves.run, nodes[k], replicas)
                if got is not None:
                    makespans[k].append(got[0])
                    each[k] += got[1]
                    ctx.progress(f"    {k}: {got[0]:.0f} ms")
    return [_figure(live, makespans, each, replicas, rounds)]


def _figure(live: Live, makespans: dict[str, list[float]], each: dict[str, list[float]], n: int,
            rounds: int) -> Figure:  # fmt: skip
    cols = ["median", "min", "max", "per pod", "p50 startup", "p99 startup"]
    fig = Figure("kubelet-cluster", f"Kubelet cluster: a {n}-replica Deployment on one node, create to all Ready "
                 f"({rounds} round(s))", "ms", cols, ratio_column="median", samples=makespans,
                 params={"replicas": n, "rounds": rounds, "maxPods": MAX_PODS})  # fmt: skip
    for k, label in LABELS.items():
        name = label.format(version=reference_version("A"))
        fig.rows.append(wave_row(live, k, name, makespans[k], each[k], n, ("p50 startup", "p99 startup")))
    fig.notes = [
        "Two kubelet nodes of one cluster (tests/conformance/cluster.py: containerd 2, kubelet, kube-proxy, "
        "each in its own network and mount namespace), alike but for their network: N's is netplugin's "
        "shipped DaemonSet, A's the CNI bridge conflist. Makespan: from the Deployment's create request to the "
        "last of its pods Ready, seen by a watch of its pods; startup: a pod's first watch event (created by "
        "the ReplicaSet controller) to its Ready. The kubelet starts the sandboxes; the scheduler, the "
        f"controllers and the kubelet's status updates are in both rows alike. The kubelets' maxPods is "
        f"{MAX_PODS} (the default 110 counts the DaemonSet's pod too).",
    ]
    return fig
