"""Upgrade and reboot under real traffic, on the conformance cluster (:mod:`tests.conformance.cluster`).

Pods on both nodes exchange requests in a loop the whole time: each client pod (one per node, agnhost
with curl) asks every server pod (one per node, agnhost netexec) directly, across nodes and on its own
node, and the server Service, five times a second, and logs each answer or failure with its time.

* **Rolling update**: the DaemonSet's image goes to a new tag (``kubectl set image``); while it rolls
  out, a new pod starts on each node. The requests lost during the rollout are counted (the goal is
  none: the dataplane never depends on the daemon being up); the new pods must start; afterwards
  each node's daemon holds exactly the pods of its node (nothing leaked).
* **Reboot** of one node: its kubelet, kube-proxy and containerd stop, every process of the node
  dies (containers and netplugin's daemon with them), every pod netns and the bridge are removed and
  /run's runtime state is wiped, as a reboot does; then containerd, kube-proxy and the kubelet start
  again. The kubelet recreates the pods (netplugin's DaemonSet pod first: its init container and
  daemon run again), the old leases and records are freed without anyone running ``netplugin gc``,
  and the pods talk again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.conformance.cluster import NETPLUGIN_IMAGE, Cluster, Node

__all__ = ["DisruptionReport", "run_disruptions"]

NS = "np-traffic"
AGNHOST = "registry.k8s.io/e2e-test-images/agnhost:2.66.1"
PORT = 8080
# One round: every target once, then a fifth of a second; each line "<epoch> ok|FAIL <target>".
LOOP = (
    "while true; do for t in $TARGETS; do now=$(date +%s.%N); "
    'if curl -s -o /dev/null --max-time 1 "http://$t/hostname"; then echo "$now ok $t"; '
    'else echo "$now FAIL $t"; fi; done; sleep 0.2; done'
)


@dataclass
class Window:
    """Requests in a time window, per target."""

    sent: int = 0
    failed: int = 0
    failures: list[str] = field(default_factory=list)


@dataclass
class DisruptionReport:
    rollout_seconds: float = 0.0
    rollout: Window = field(default_factory=Window)
    new_pods_started: bool = False
    leaks_after_rollout: dict[str, str] = field(default_factory=dict)
    reboot_seconds_to_talk_again: float = 0.0
    reboot_leaks: dict[str, str] = field(default_factory=dict)
    reboot_talks_again: bool = False

    def ok(self) -> bool:
        return (self.new_pods_started and not self.leaks_after_rollout and self.reboot_talks_again
                and not self.reboot_leaks)  # fmt: skip

    def lines(self) -> list[str]:
        r = self.rollout
        return [
            f"rolling update: {self.rollout_seconds:.1f} s; requests during it: {r.sent} sent, {r.failed} lost"
            + (f" ({', '.join(r.failures[:5])})" if r.failures else ""),
            f"rolling update: pods created during it started: {self.new_pods_started}; "
            f"leaks after it: {self.leaks_after_rollout or 'none'}",
            f"reboot: pods talk again: {self.reboot_talks_again} ({self.reboot_seconds_to_talk_again:.1f} s after "
            f"the node came back); leaks: {self.reboot_leaks or 'none'}",
        ]


def _pod(name: str, node: str, containers: list[dict[str, Any]], labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS, "labels": labels},
            "spec": {"nodeName": node, "containers": containers, "terminationGracePeriodSeconds": 1}}  # fmt: skip


class Traffic:
    """The servers, their Service and the clients, through kubectl."""

    def __init__(self, cluster: Cluster, log: Callable[[str], None]) -> None:
        self.c, self.log = cluster, log

    def apply(self, obj: dict[str, Any]) -> None:
        path = self.c.root / f"obj-{obj['metadata']['name']}.json"
        path.write_text(json.dumps(obj))
        self.c.kubectl("apply", "-f", str(path))

    def pods(self, label: str = "") -> list[dict[str, Any]]:
        args = ["-n", NS, "get", "pods", "-o", "json", *(["-l", label] if label else [])]
        items: list[dict[str, Any]] = json.loads(self.c.kubectl(*args).stdout)["items"]
        return items

    def wait_ready(self, label: str, count: int, within: float = 180) -> list[dict[str, Any]]:
        deadline = time.monotonic() + within
        while True:
            pods = [p for p in self.pods(label) if not p["metadata"].get("deletionTimestamp")]
            ready = [
                p for p in pods
                if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or [])
            ]  # fmt: skip
            if len(ready) == count == len(pods):
                return ready
            if time.monotonic() > deadline:
                raise RuntimeError(f"pods {label}: {len(ready)} of {count} ready: {[p['status'] for p in pods]}")
            time.sleep(1)

    def start(self) -> None:
        self.c.kubectl("create", "namespace", NS)
        for node in self.c.nodes:
            probe = {"httpGet": {"path": "/healthz", "port": PORT}, "periodSeconds": 1}
            netexec = {"name": "server", "image": AGNHOST, "args": ["netexec", f"--http-port={PORT}"],
                       "readinessProbe": probe}  # fmt: skip
            self.apply(_pod(f"server-{node.name}", node.name, [netexec], {"app": "server"}))
        service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "server", "namespace": NS},
                   "spec": {"selector": {"app": "server"}, "ports": [{"port": 80, "targetPort": PORT}]}}  # fmt: skip
        self.apply(service)
        servers = self.wait_ready("app=server", len(self.c.nodes))
        svc = json.loads(self.c.kubectl("-n", NS, "get", "service", "server", "-o", "json").stdout)
        targets = [f"{p['status']['podIP']}:{PORT}" for p in servers] + [f"{svc['spec']['clusterIP']}:80"]
        for node in self.c.nodes:
            client = {"name": "client", "image": AGNHOST, "command": ["/bin/sh", "-c", LOOP],
                      "env": [{"name": "TARGETS", "value": " ".join(targets)}]}  # fmt: skip
            self.apply(_pod(f"client-{node.name}", node.name, [client], {"app": "client"}))
        self.wait_ready("app=client", len(self.c.nodes))
        self.log(f"traffic: clients on every node ask {targets} five times a second")

    def window(self, start: float, end: float) -> Window:
        """The clients' requests sent in [start, end] (epoch seconds)."""
        w = Window()
        for node in self.c.nodes:
            out = self.c.kubectl("-n", NS, "logs", f"client-{node.name}", check=False).stdout
            for line in out.splitlines():
                parts = line.split()
                if len(parts) != 3:
                    continue
                with_time = float(parts[0])
                if start <= with_time <= end:
                    w.sent += 1
                    if parts[1] != "ok":
                        w.failed += 1
                        w.failures.append(f"{node.name}->{parts[2]}@{with_time:.1f}")
        return w

    def all_answer(self, since: float) -> bool:
        """Every client's every target answered at least once after ``since`` (epoch)."""
        targets: set[str] = set()
        answered: set[tuple[str, str]] = set()
        for node in self.c.nodes:
            out = self.c.kubectl("-n", NS, "logs", f"client-{node.name}", "--tail=400", check=False).stdout
            for line in out.splitlines():
                parts = line.split()
                if len(parts) == 3:
                    targets.add(parts[2])
                    if parts[1] == "ok" and float(parts[0]) > since:
                        answered.add((node.name, parts[2]))
        return bool(targets) and len(answered) == len(targets) * len(self.c.nodes)


def _leaks(cluster: Cluster) -> dict[str, str]:
    """Per node: what netplugin's daemon holds beyond the pods the API places there (empty: nothing)."""
    out: dict[str, str] = {}
    pods = json.loads(cluster.kubectl("get", "pods", "-A", "-o", "json").stdout)["items"]
    for node in cluster.nodes:
        want = sorted(
            f"{p['metadata']['namespace']}/{p['metadata']['name']}"
            for p in pods
            if p["spec"].get("nodeName") == node.name and not p["spec"].get("hostNetwork")
            and p["status"].get("phase") in ("Running", "Pending") and not p["metadata"].get("deletionTimestamp")
        )  # fmt: skip
        [agent] = [
            p["metadata"]["name"] for p in pods
            if p["metadata"]["name"].startswith("netplugin-") and p["spec"].get("nodeName") == node.name
            and not p["metadata"].get("deletionTimestamp")
        ]  # fmt: skip
        argv = ["netplugin", "--config", "/etc/netplugin/netplugin.yaml", "-o", "json", "pods"]
        done = cluster.kubectl("-n", "kube-system", "exec", agent, "-c", "netplugin", "--", *argv, check=False)
        if done.returncode != 0:
            out[node.name] = f"netplugin pods failed: {done.stderr[-500:]}"
            continue
        listing = json.loads(done.stdout)
        held = sorted(f"{p['namespace']}/{p['name']}" for p in listing["pods"])
        if held != want or listing.get("corrupt"):
            out[node.name] = f"holds {held}, the API places {want}, corrupt {listing.get('corrupt')}"
    return out


def rolling_update(cluster: Cluster, traffic: Traffic, report: DisruptionReport) -> None:
    tag = f"{cluster.netplugin_tag}-rollout"
    for node in cluster.nodes:
        node.ctr("images", "tag", f"{NETPLUGIN_IMAGE}:{cluster.netplugin_tag}", f"{NETPLUGIN_IMAGE}:{tag}")
    start = time.time()
    t = time.monotonic()
    image = f"{NETPLUGIN_IMAGE}:{tag}"
    cluster.kubectl("-n", "kube-system", "set", "image", "daemonset/netplugin", f"install={image}",
                    f"netplugin={image}")  # fmt: skip
    for node in cluster.nodes:  # pods created while it rolls out
        sleeper = {"name": "c", "image": AGNHOST, "args": ["pause"]}
        traffic.apply(_pod(f"during-rollout-{node.name}", node.name, [sleeper], {"app": "during"}))
    cluster.kubectl("-n", "kube-system", "rollout", "status", "daemonset/netplugin", "--timeout=300s", timeout=320)
    report.rollout_seconds = time.monotonic() - t
    try:
        traffic.wait_ready("app=during", len(cluster.nodes))
        report.new_pods_started = True
    except RuntimeError as e:
        traffic.log(f"rolling update: {e}")
    time.sleep(2)  # the clients' last lines of the window
    report.rollout = traffic.window(start, time.time() - 1)
    report.leaks_after_rollout = _leaks(cluster)


def reboot(cluster: Cluster, node: Node, traffic: Traffic, report: DisruptionReport) -> None:
    """``node`` goes down as in a reboot and comes back (module docstring)."""
    for name in ("kubelet", "kube-proxy", "containerd"):
        proc = node.procs.pop(name, None)
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    node.kill_all_but_hold()
    # What a reboot takes: every pod netns, the bridge, /run's runtime state (tmpfs).
    node.run(["sh", "-c", "for n in /run/netns/*; do [ -e \"$n\" ] && ip netns delete \"$(basename \"$n\")\"; done; "
                          "ip link del cbr0; rm -rf /run/netplugin/* /run/containerd/*"])  # fmt: skip
    node.run(["sh", "-c", "umount -R /var/lib/kubelet/pods/* 2>/dev/null; true"])
    came_back = time.time()
    node.start_containerd()
    node.start_kube_proxy()
    node.start_kubelet()
    deadline = time.monotonic() + 240
    while not traffic.all_answer(came_back + 1):
        if time.monotonic() > deadline:
            break
        time.sleep(2)
    else:
        report.reboot_talks_again = True
    report.reboot_seconds_to_talk_again = time.time() - came_back
    report.reboot_leaks = _leaks(cluster)


def run_disruptions(cluster: Cluster, log: Callable[[str], None], out: Path) -> DisruptionReport:
    report = DisruptionReport()
    traffic = Traffic(cluster, log)
    traffic.start()
    rolling_update(cluster, traffic, report)
    for line in report.lines()[:2]:
        log(line)
    reboot(cluster, cluster.nodes[-1], traffic, report)
    for line in report.lines():
        log(line)
    out.write_text("\n".join(report.lines()) + "\n")
    return report
