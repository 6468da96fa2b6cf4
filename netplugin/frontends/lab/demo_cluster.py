"""``netplugin demo --nodes N``: a small cluster on this machine, pods on different nodes talking.

What it shows a new user, step by step (see :mod:`netplugin.frontends.lab.simcluster.cluster` for
the layout, all inside network namespaces the demo creates and removes):

1. N nodes come up, each with its own ``netplugin serve`` watching a Kubernetes API (a small
   simulated one: no cluster needed), each with a dual-stack pod CIDR from its Node object;
2. each daemon routes to the other nodes' pod CIDRs via their InternalIPs (host-gw);
3. one pod per node is set up through that node's CLI; every pod reaches every other pod, over
   IPv4 and IPv6, and sees the others' real addresses;
4. pods reach an address outside the cluster, which sees the node's address (masquerade);
5. the last node is removed (its pods torn down, its daemon stopped, its Node deleted): every
   other node's routes to it are gone, and how fast;
6. everything is torn down and checked: no route, nft table, veth, address or record is left.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from netplugin.core.errors import InvalidArgument, NetpluginError, SystemFailure
from netplugin.frontends.lab.simcluster.cluster import OUTSIDE_V4, OUTSIDE_V6, SimCluster, SimNode, SimPod
from netplugin.frontends.lab.simcluster.nsexec import netns_exists

__all__ = ["ClusterReport", "run_cluster_demo"]

PORT = 8080


@dataclass
class ClusterReport:
    nodes: list[dict[str, Any]] = field(default_factory=list)
    pods: list[dict[str, Any]] = field(default_factory=list)
    checks: list[tuple[str, str, bool]] = field(default_factory=list)
    removed_node: str | None = None
    route_convergence_ms: float | None = None
    #: node -> ms until its routes were complete, after the last node started / after the removal
    routes_after_start_ms: dict[str, float] = field(default_factory=dict)
    routes_after_removal_ms: dict[str, float] = field(default_factory=dict)
    leftovers: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(ok for _, _, ok in self.checks) and not self.leftovers

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "nodes": self.nodes,
            "pods": self.pods,
            "checks": [{"from": a, "to": b, "ok": ok} for a, b, ok in self.checks],
            "removed_node": self.removed_node,
            "route_convergence_ms": self.route_convergence_ms,
            "routes_after_start_ms": self.routes_after_start_ms,
            "routes_after_removal_ms": self.routes_after_removal_ms,
            "leftovers": self.leftovers,
        }


def run_cluster_demo(
    nodes: int = 3,
    *,
    plugin: str = "bridge",
    plugin_source: str | None = None,
    progress: Callable[[str], None] = lambda _msg: None,
) -> ClusterReport:
    """Run the cluster demo (see the module doc); cleans up whatever happens. Needs root and nft."""
    if not 2 <= nodes <= 8:
        raise InvalidArgument("nodes", nodes, "must be between 2 and 8")
    _check_prerequisites()

    report = ClusterReport()
    source = Path(plugin_source) if plugin_source else None
    with SimCluster(plugin=plugin, plugin_source=source, progress=progress) as c:
        progress(f"starting {nodes} nodes (a network namespace np{c.tag}n<i> and a netplugin daemon each)...")
        members = [c.add_node() for _ in range(nodes)]
        report.routes_after_start_ms = _converge(c, members, 10.0)
        _show_nodes(c, members, report, progress, max(report.routes_after_start_ms.values()) / 1000)
        pods = [c.create_pod(n, f"web-{n.index}", namespace="demo") for n in members]
        _show_pods(pods, report, progress)
        _mesh(c, pods, report, progress)
        _egress(c, pods, report, progress)
        _remove_last(c, members, report, progress)
        _teardown(c, report, progress)
        tag = c.tag

    stray = [ns for ns in (c.underlay, *(f"np{tag}n{i}" for i in range(1, nodes + 1))) if netns_exists(ns)]
    if stray:
        report.leftovers.append(f"network namespaces still present: {', '.join(stray)}")
    if report.leftovers:
        progress("left behind: " + "; ".join(report.leftovers))
    else:
        progress("nothing left behind: no route, nft table, veth, address, record or namespace")
    return report


def _converge(c: SimCluster, nodes: list[SimNode], timeout: float, start: float | None = None) -> dict[str, float]:
    """Each node's milliseconds from ``start`` (default: now) until its routes are as expected.

    SystemFailure after ``timeout`` s, naming the nodes whose routes are still wrong."""
    start = time.monotonic() if start is None else start
    done: dict[str, float] = {}
    while True:
        for n in nodes:
            if n.name not in done and c.routes(n) == c.expected_routes(n):
                done[n.name] = round((time.monotonic() - start) * 1000, 1)
        if len(done) == len(nodes):
            return {n.name: done[n.name] for n in nodes}
        if time.monotonic() - start > timeout:
            wrong = "; ".join(f"{n.name}: have {c.routes(n)}, want {c.expected_routes(n)}"
                              for n in nodes if n.name not in done)
            raise SystemFailure(f"routes did not converge within {timeout:g}s", None, wrong)
        time.sleep(0.02)


def _check_prerequisites() -> None:
    if os.geteuid() != 0:
        raise SystemFailure("netplugin demo --nodes", None, "must run as root (it creates network namespaces)")
    for tool in ("ip", "nft", "flock"):
        if shutil.which(tool) is None:
            raise SystemFailure("netplugin demo --nodes", None, f"{tool} is not installed (run scripts/demo.sh once)")


def _show_nodes(
    c: SimCluster, members: list[SimNode], report: ClusterReport, say: Callable[[str], None], took: float
) -> None:
    say("")
    say(f"{'NODE':<8} {'INTERNAL IPS':<34} POD CIDRS")
    for n in members:
        say(f"{n.name:<8} {', '.join(n.internal_ips):<34} {', '.join(n.pod_cidrs)}")
        report.nodes.append({"name": n.name, "internal_ips": list(n.internal_ips), "pod_cidrs": list(n.pod_cidrs)})
    first = members[0]
    say("")
    say(f"routes on {first.name}, made by its daemon from the Node watch")
    say(f"(every node's in place {took * 1000:.0f} ms after the last node started):")
    for dst, via in sorted(c.routes(first).items()):
        say(f"  {dst:<28} via {via}")


def _show_pods(pods: list[SimPod], report: ClusterReport, say: Callable[[str], None]) -> None:
    say("")
    say(f"{'POD':<12} {'NODE':<8} ADDRESSES")
    for p in pods:
        say(f"{p.namespace + '/' + p.name:<12} {p.node.name:<8} {', '.join(p.ips)}")
        report.pods.append({"name": p.name, "node": p.node.name, "ips": list(p.ips)})


def _mesh(c: SimCluster, pods: list[SimPod], report: ClusterReport, say: Callable[[str], None]) -> None:
    say("")
    say("every pod to every other pod (the server answers with the source address it saw):")
    with c.listeners([p.infra_id for p in pods], PORT, lambda ns: ns):
        for src in pods:
            for dst in pods:
                if src is dst:
                    continue
                for version in (4, 6):
                    address, mine = dst.ip(version), src.ip(version)
                    if address is None or mine is None:
                        continue
                    answer = c.connect(src.infra_id, address, PORT)
                    ok = answer == f"{dst.infra_id} {mine}"
                    report.checks.append((src.name, f"{dst.name} IPv{version}", ok))
                    seen = answer.split(" ")[-1] if answer else "-"
                    path = f"{src.name}@{src.node.name} -> {dst.name}@{dst.node.name}"
                    say(f"  {path} {address:<24} {'ok' if ok else 'FAILED'} (saw {seen})")


def _egress(c: SimCluster, pods: list[SimPod], report: ClusterReport, say: Callable[[str], None]) -> None:
    say("")
    say(f"pods to an address outside the cluster ({OUTSIDE_V4}, {OUTSIDE_V6}): masqueraded to their node's address")
    with c.listeners([c.underlay], PORT + 1, lambda ns: "outside"):
        for pod in pods:
            for outside, node_ip in ((OUTSIDE_V4, pod.node.ipv4), (OUTSIDE_V6, pod.node.ipv6)):
                answer = c.connect(pod.infra_id, outside, PORT + 1)
                ok = answer == f"outside {node_ip}"
                report.checks.append((pod.name, outside, ok))
                seen = answer.split(" ")[-1] if answer else "-"
                say(f"  {pod.name}@{pod.node.name} -> {outside:<20} {'ok' if ok else 'FAILED'} (seen from {seen})")


def _remove_last(c: SimCluster, members: list[SimNode], report: ClusterReport, say: Callable[[str], None]) -> None:
    gone = members[-1]
    say("")
    say(f"removing {gone.name}: its pods torn down, its daemon stopped, its Node deleted from the API")
    assert c.api is not None
    for pod in [p for p in c.pods.values() if p.node is gone]:
        c.delete_pod(pod)
    c.stop_daemon(gone)
    start = time.monotonic()
    c.api.delete("Node", gone.name)
    rest = [n for n in members if n is not gone]
    try:
        report.routes_after_removal_ms = _converge(c, rest, 5.0, start)
    except SystemFailure as e:
        report.checks.append(("routes", f"to {gone.name} removed", False))
        say(f"  FAILED: {e}")
        return
    took = max(report.routes_after_removal_ms.values()) / 1000
    report.removed_node = gone.name
    report.route_convergence_ms = round(took * 1000, 1)
    left = [dst for n in rest for dst in c.routes(n) if dst in gone.pod_cidrs]
    report.checks.append(("routes", f"to {gone.name} removed", not left))
    say(f"  routes to {', '.join(gone.pod_cidrs)} gone from {', '.join(n.name for n in rest)} in {took * 1000:.0f} ms")
    c.remove_node(gone, delete_object=False)


def _teardown(c: SimCluster, report: ClusterReport, say: Callable[[str], None]) -> None:
    say("")
    assert c.api is not None
    for pod in list(c.pods.values()):
        c.delete_pod(pod)
    members = list(c.nodes.values())
    for n in members:
        c.api.delete("Node", n.name)  # the cluster goes away: each daemon removes its routes and egress
    deadline = time.monotonic() + 5
    for n in members:
        while (c.routes(n) or _nft(c, n)) and time.monotonic() < deadline:
            time.sleep(0.05)
        if c.routes(n):
            report.leftovers.append(f"routes on {n.name}: {', '.join(c.routes(n))}")
        if _nft(c, n):
            report.leftovers.append(f"nft table on {n.name}")
        try:
            listing = c.netplugin(n, "pods")
        except NetpluginError as e:
            report.leftovers.append(f"cannot list pods on {n.name}: {e.message}")
        else:
            if listing["pods"]:
                report.leftovers.append(f"pod records on {n.name}: {len(listing['pods'])}")
        ipam = n.root / "state" / "bridge"
        held = [p.name for p in ipam.rglob("*") if p.is_file() and p.parent.name in ("ips", "pods")]
        if held:
            report.leftovers.append(f"addresses still allocated on {n.name}: {', '.join(sorted(held))}")
        say(f"  {n.name}: left the cluster; routes and egress table removed")


def _nft(c: SimCluster, n: SimNode) -> bool:
    done = c.exec_in(n.netns, ["nft", "list", "tables"])
    return b"netplugin" in done.stdout
