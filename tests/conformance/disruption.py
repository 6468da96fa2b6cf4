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

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from tests.conformance.cluster import NETPLUGIN_IMAGE, Cluster, Node

__all__ = ["DisruptionReport", "run_disruptions"]

NS = "np-traffic"
AGNHOST = "registry.k8s.io/e2e-test-images/agnhost:2.66.1"
PORT = 8080
#: how long a pod being deleted may stay held before it counts as a leak (its grace period, teardown)
LEAKS_SETTLE = 120.0
# One round: every target once, then a fifth of a second; each line "<epoch> ok|FAIL <target>".
LOOP = (
    "while true; do for t in $TARGETS; do now=$(date +%s.%N); "
    'if curl -s -o /dev/null --max-time 1 "http://$t/hostname"; then echo "$now ok $t"; '
    'else echo "$now FAIL $t"; fi; done; sleep 0.2; done'
)

# Every address lease under the state dir: the bridge IPAM's <dir>/pods/<infra-id> (netplugin's own
# records are the state dir's top-level pods/, one level up, and not leases).
LEASES = (
    "import glob; print('\\n'.join(p for p in glob.glob('/var/lib/netplugin/**/pods/*', recursive=True) "
    "if not p.startswith('/var/lib/netplugin/pods/')))"
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
    rebooted: str = ""
    total_seconds: float = 0.0

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
            f"reboot of {self.rebooted}: pods talk again: {self.reboot_talks_again} "
            f"({self.reboot_seconds_to_talk_again:.1f} s after the node came back); "
            f"leaks: {self.reboot_leaks or 'none'}",
            f"upgrade and reboot: {self.total_seconds:.1f} s in all",
        ]


def _ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or [])


def _started(status: dict[str, Any]) -> float:
    """When a container status's running container started (epoch), or 0."""
    started = ((status.get("state") or {}).get("running") or {}).get("startedAt")
    return datetime.fromisoformat(started).timestamp() if started else 0.0


def _pod(name: str, node: str, containers: list[dict[str, Any]], labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS, "labels": labels},
            "spec": {"nodeName": node, "containers": containers, "terminationGracePeriodSeconds": 1}}  # fmt: skip


class Traffic:
    """The servers, their Service and the clients, through kubectl."""

    def __init__(self, cluster: Cluster, log: Callable[[str], None]) -> None:
        self.c, self.log = cluster, log
        self.current: list[str] = []

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
            ready = [p for p in pods if _ready(p)]
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
        self.start_clients()

    def targets(self) -> list[str]:
        """Each server pod's address (once every server is ready) and the Service's."""
        servers = self.wait_ready("app=server", len(self.c.nodes))
        svc = json.loads(self.c.kubectl("-n", NS, "get", "service", "server", "-o", "json").stdout)
        return [*sorted(f"{p['status']['podIP']}:{PORT}" for p in servers), f"{svc['spec']['clusterIP']}:80"]

    def start_clients(self) -> None:
        """A client on every node asking :meth:`targets` (the ones already there are replaced)."""
        self.c.kubectl("-n", NS, "delete", "pods", "-l", "app=client", "--wait=true", "--timeout=120s", timeout=150)
        self.current = self.targets()
        for node in self.c.nodes:
            client = {"name": "client", "image": AGNHOST, "command": ["/bin/sh", "-c", LOOP],
                      "env": [{"name": "TARGETS", "value": " ".join(self.current)}]}  # fmt: skip
            self.apply(_pod(f"client-{node.name}", node.name, [client], {"app": "client"}))
        self.wait_ready("app=client", len(self.c.nodes))
        self.log(f"traffic: clients on every node ask {self.current} five times a second")

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

    def wait_recreated(self, node: str, since: float, within: float = 180) -> None:
        """Every traffic pod on ``node`` is ready in a container started after ``since`` (epoch): the
        kubelet recreated it (until it reports so, the API still shows the pod as before the reboot)."""
        deadline = time.monotonic() + within
        while True:
            pods = [p for p in self.pods() if p["spec"].get("nodeName") == node]
            stale = [p["metadata"]["name"] for p in pods if not _ready(p) or not all(
                _started(c) >= int(since) for c in p["status"].get("containerStatuses") or [{}])]  # fmt: skip
            if pods and not stale:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"pods on {node} not recreated within {within:g} s: {stale}")
            time.sleep(1)

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


def settled_leaks(cluster: Cluster, within: float = LEAKS_SETTLE) -> dict[str, str]:
    """:func:`_leaks`, once what it finds lasts: a pod being deleted (the suite's namespaces are, as it
    ends) is held until its teardown runs, which is no leak; what is still held after ``within`` is."""
    deadline = time.monotonic() + within
    while (found := _leaks(cluster)) and time.monotonic() < deadline:
        time.sleep(3)
    return found


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
            continue
        # The bridge's address leases (one file per sandbox, named by its infra id, per family): none
        # may belong to a sandbox no record holds.
        done = cluster.kubectl("-n", "kube-system", "exec", agent, "-c", "netplugin", "--", "python3", "-c",
                               LEASES, check=False)  # fmt: skip
        if done.returncode != 0:
            out[node.name] = f"listing the leases failed: {done.stderr[-500:]}"
            continue
        infra_ids = {p["infra_id"] for p in listing["pods"]}
        stray = sorted(path for path in done.stdout.split() if path.rsplit("/", 1)[1] not in infra_ids)
        if stray:
            out[node.name] = f"leases of no pod: {stray}"
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
    report.leaks_after_rollout = settled_leaks(cluster)


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
    # the pods' volume mounts (tmpfs and binds under /var/lib/kubelet/pods) do not survive a reboot either
    node.run(["sh", "-c", "findmnt -rn -o TARGET | grep '^/var/lib/kubelet/pods/' | sort -r | xargs -r umount -l"])
    came_back = time.time()
    node.start_containerd()
    node.start_kube_proxy()
    node.start_kubelet()
    try:
        traffic.wait_recreated(node.name, came_back)
    except RuntimeError as e:
        traffic.log(f"reboot: {e}")
    # A recreated server pod may have a new address (its sandbox is new): the clients then ask that one,
    # as a Service's client would once the endpoints change.
    if traffic.targets() != traffic.current:
        traffic.start_clients()
    deadline = time.monotonic() + 240
    while not traffic.all_answer(came_back + 1):
        if time.monotonic() > deadline:
            break
        time.sleep(2)
    else:
        report.reboot_talks_again = True
    report.reboot_seconds_to_talk_again = time.time() - came_back
    report.reboot_leaks = settled_leaks(cluster)


def run_disruptions(cluster: Cluster, log: Callable[[str], None], out: Path) -> DisruptionReport:
    """Both, in order; the report also goes to ``out`` (text) and ``out`` with suffix .json (its fields)."""
    t = time.monotonic()
    report = DisruptionReport()
    traffic = Traffic(cluster, log)
    traffic.start()
    rolling_update(cluster, traffic, report)
    for line in report.lines()[:2]:
        log(line)
    report.rebooted = cluster.nodes[-1].name
    reboot(cluster, cluster.nodes[-1], traffic, report)
    report.total_seconds = time.monotonic() - t
    for line in report.lines()[2:]:
        log(line)
    out.write_text("\n".join(report.lines()) + "\n")
    out.with_suffix(".json").write_text(json.dumps(dataclasses.asdict(report), indent=1) + "\n")
    return report
