"""Routes between nodes (host-gw): each other node's pod CIDRs via its InternalIP.

In detail: ``ARCHITECTURE.md``, "Module notes".

As flannel's host-gw backend does, a node reaches the pods of another node by a plain
kernel route, ``<their pod CIDR> via <their InternalIP>``, one per family, which works when
the nodes share an L2 segment (the next hop must be directly reachable). :class:`RouteTable`
computes the routes a list of :class:`~netplugin.core.nodes.NodeInfo` asks for and makes the
kernel's main table match them, with pyroute2 (the daemon calls it; nothing on a per-pod path).
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from netplugin.core.nlwire import RT_TABLE_MAIN, RTN_NAMES, RTN_UNICAST
from netplugin.core.node import NodeInfo

__all__ = ["PROBLEM_KINDS", "RTPROT_NETPLUGIN", "Route", "RouteProblem", "RouteReport", "RouteTable"]

#: why a pod CIDR is not routed, as a metric label
PROBLEM_KINDS = (
    "no_internal_ip",
    "outside_cluster_cidrs",
    "own_pod_cidr",
    "own_address",
    "connected_route",
    "foreign_route",
    "node_overlap",
    "next_hop",
    "kernel",
)

#: The routing protocol number marking netplugin's routes (unassigned in iproute2's rt_protos).
RTPROT_NETPLUGIN = 78
_FAMILIES = {4: socket.AF_INET, 6: socket.AF_INET6}

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass
class _View:
    """The kernel's routes as one reconciliation sees them."""

    ours: dict[str, tuple[str | None, int | None]] = field(default_factory=dict)
    others: list[tuple[Network, int, str | None, int | None]] = field(default_factory=list)
    local: set[str] = field(default_factory=set)


@dataclass(frozen=True, order=True)
class Route:
    """One route this node should have: ``dst via gateway dev oif``."""

    dst: str
    gateway: str
    oif: int
    node: str


@dataclass(frozen=True, order=True)
class RouteProblem:
    """Why the pod CIDR ``cidr`` of ``node`` has no route; ``kind`` is one of :data:`PROBLEM_KINDS`."""

    node: str
    cidr: str
    reason: str
    kind: str = "next_hop"

    def __str__(self) -> str:
        return f"node {self.node} pod CIDR {self.cidr}: {self.reason}"


@dataclass
class RouteReport:
    """What one reconciliation did, and what it could not do."""

    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    routes: list[Route] = field(default_factory=list)  # every route of ours now in place
    problems: list[RouteProblem] = field(default_factory=list)

    @property
    def touched(self) -> bool:
        return bool(self.added or self.changed or self.removed)

    def to_dict(self) -> dict[str, Any]:
        return {
            "routes": [{"dst": r.dst, "via": r.gateway, "node": r.node} for r in self.routes],
            "problems": [{"node": p.node, "cidr": p.cidr, "reason": p.reason, "kind": p.kind} for p in self.problems],
        }


class RouteTable:
    """This node's routes to the other nodes' pod CIDRs. Thread-safe (one netlink socket, locked)."""

    def __init__(
        self,
        self_name: str,
        *,
        cluster_cidrs: Iterable[str] = (),
        proto: int = RTPROT_NETPLUGIN,
        table: int = RT_TABLE_MAIN,
        netns: str | None = None,
    ) -> None:
        self.self_name = self_name
        #: only pod CIDRs inside these are routed (none: nothing is)
        self.cluster_cidrs: list[Network] = [ipaddress.ip_network(c) for c in cluster_cidrs]
        self.proto = proto
        self.table = table
        #: a named network namespace to work in (tests); None: the daemon's own
        self.netns = netns
        self._ipr: Any = None
        self._lock = threading.Lock()
        self._view: _View | None = None  # the kernel's routes as the last pass left them

    def _nl(self) -> Any:
        if self._ipr is None:
            from pyroute2 import IPRoute

            # strict_check: the kernel filters dumps by table (a node's other tables, kube-proxy's
            # or a CNI's policy routing, may hold many routes that are none of our business).
            kwargs: dict[str, Any] = {"strict_check": True}
            if self.netns:
                kwargs["netns"] = self.netns
            self._ipr = IPRoute(**kwargs)
        return self._ipr

    def close(self) -> None:
        with self._lock:
            self._view = None
            if self._ipr is not None:
                self._ipr.close()
                self._ipr = None

    # --- the kernel's view ------------------------------------------------------------------------

    def _dump(self) -> _View:
        """One dump per family: our routes, the others of our table, and this node's own addresses."""
        view = _View()
        for addr in self._nl().get_addr():
            for key in ("IFA_LOCAL", "IFA_ADDRESS"):
                if addr.get_attr(key):
                    view.local.add(str(ipaddress.ip_address(addr.get_attr(key))))
        for family in _FAMILIES.values():
            for r in self._nl().route("dump", family=family, table=self.table):
                table = r.get_attr("RTA_TABLE") or r["table"]
                dst_addr = r.get_attr("RTA_DST")
                if table != self.table:
                    continue
                zero = "0.0.0.0" if family == socket.AF_INET else "::"
                net = ipaddress.ip_network(f"{dst_addr or zero}/{r['dst_len']}", strict=False)
                gateway = r.get_attr("RTA_GATEWAY") or ("multipath" if r.get_attr("RTA_MULTIPATH") else None)
                if r["proto"] == self.proto and r["type"] == RTN_UNICAST:
                    view.ours[str(net)] = (gateway, r.get_attr("RTA_OIF"))
                else:
                    view.others.append((net, r["type"], gateway, r.get_attr("RTA_OIF")))
        # Longest prefix first, as the kernel looks up the main table.
        view.others.sort(key=lambda o: o[0].prefixlen, reverse=True)
        return view

    @staticmethod
    def _next_hop(view: _View, gateway: str) -> tuple[int | None, str]:
        """(the interface to reach ``gateway`` directly, "") or (None, why it cannot be a next hop).

        The kernel's answer for the main table, computed from one dump (a ``route get`` per node
        through pyroute2 would add up with hundreds of nodes); our own routes do not
        count, and policy routing rules are not consulted.
        """
        if gateway in view.local:
            return None, f"InternalIP {gateway} is an address of this node"
        addr = ipaddress.ip_address(gateway)
        for net, rtype, via, oif in view.others:
            if net.version != addr.version or addr not in net:
                continue
            if rtype != RTN_UNICAST:
                return None, f"InternalIP {gateway} is unreachable (a {RTN_NAMES.get(rtype, rtype)} route covers it)"
            if via:
                return (
                    None,
                    f"InternalIP {gateway} is not on a directly connected network (the kernel reaches it via {via})",
                )
            return oif, ""
        return None, f"InternalIP {gateway} is unreachable (no route covers it)"

    # --- what the nodes ask for ------------------------------------------------------------------

    def desired(self, nodes: Iterable[NodeInfo], view: _View | None = None) -> tuple[list[Route], list[RouteProblem]]:
        """The routes ``nodes`` ask for (sorted by destination), and the CIDRs that cannot be routed."""
        if view is None:
            with self._lock:
                view = self._dump()
        nodes = sorted(nodes, key=lambda n: n.name)
        own: list[Network] = [ipaddress.ip_network(c) for n in nodes if n.name == self.self_name for c in n.pod_cidrs]
        claims = [(n, ipaddress.ip_network(c)) for n in nodes if n.name != self.self_name for c in n.pod_cidrs]
        refused = node_overlaps(claims)
        local = [ipaddress.ip_address(a) for a in view.local]
        routes: list[Route] = []
        problems: list[RouteProblem] = []
        for node, net in claims:
            gateway = node.internal_ip(net.version)
            if gateway is None:
                kind, reason = "no_internal_ip", f"the node has no IPv{net.version} InternalIP"
            else:
                kind, reason = self._refusal(net, own, local, view) or refused.get((node.name, str(net)), ("", ""))
            if reason:
                problems.append(RouteProblem(node.name, str(net), reason, kind))
                continue
            assert gateway is not None
            oif, why = self._next_hop(view, gateway)
            if oif is None:
                problems.append(RouteProblem(node.name, str(net), why, "next_hop"))
                continue
            routes.append(Route(str(net), gateway, oif, node.name))
        return sorted(routes), problems

    def _refusal(self, net: Network, own: list[Network], local: list[Any], view: _View) -> tuple[str, str] | None:
        """(kind, why) when ``net`` may not be routed whoever claims it, else None."""
        if not self.cluster_cidrs:
            return "outside_cluster_cidrs", "cluster_cidrs is not set: netplugin routes only pod CIDRs inside it"
        if not any(net.version == c.version and net.subnet_of(c) for c in self.cluster_cidrs):  # type: ignore[arg-type]
            inside = ", ".join(str(c) for c in self.cluster_cidrs)
            return "outside_cluster_cidrs", f"not inside cluster_cidrs ({inside})"
        mine = next((m for m in own if m.version == net.version and net.overlaps(m)), None)
        if mine is not None:
            return "own_pod_cidr", "overlaps this node's own pod CIDR"
        addr = next((a for a in local if a.version == net.version and a in net), None)
        if addr is not None:
            return "own_address", f"contains {addr}, an address of this node"
        for other, rtype, via, _ in view.others:
            if other.version != net.version or not other.overlaps(net):
                continue
            if rtype == RTN_UNICAST and via is None and other.prefixlen > 0:
                return "connected_route", f"overlaps {other}, a directly connected network of this node"
            if other == net:
                return "foreign_route", "a route to it that netplugin did not make exists"
            if other.prefixlen > net.prefixlen:
                return "foreign_route", f"contains {other}, a route netplugin did not make"
        return None

    def reconcile(self, nodes: Iterable[NodeInfo], *, fresh: bool = True) -> RouteReport:
        """Make our routes exactly those ``nodes`` ask for; other routes are left alone.

        ``fresh=False`` works from the kernel's routes as the previous pass left them (no dump,
        whose cost through pyroute2 grows with the routes): for a Node event, where only the nodes
        changed. A fresh pass (the periodic re-check) sees what others did to the table.
        """
        from pyroute2.netlink.exceptions import NetlinkError

        report = RouteReport()
        with self._lock:
            view = self._view if (not fresh and self._view is not None) else self._dump()
            self._view = None  # until this pass is through: a failure below means "dump next time"
            want, report.problems = self.desired(nodes, view)
            ours = view.ours
            wanted = {r.dst for r in want}
            for dst, (gateway, oif) in sorted(ours.items()):
                if dst in wanted:
                    continue
                try:
                    self._nl().route("del", dst=dst, gateway=gateway, oif=oif, table=self.table, proto=self.proto)
                except NetlinkError as e:
                    if e.code != 3:  # ESRCH: gone already
                        raise
                del ours[dst]
                report.removed.append(dst)
            for r in want:
                current = ours.get(r.dst)
                if current == (r.gateway, r.oif):
                    report.routes.append(r)
                    continue
                try:
                    self._nl().route(
                        "replace", dst=r.dst, gateway=r.gateway, oif=r.oif, table=self.table, proto=self.proto
                    )
                except NetlinkError as e:
                    report.problems.append(RouteProblem(r.node, r.dst, f"the kernel refused the route: {e}", "kernel"))
                    ours.pop(r.dst, None)
                    continue
                ours[r.dst] = (r.gateway, r.oif)
                (report.changed if current else report.added).append(r.dst)
                report.routes.append(r)
            self._view = view
        report.problems.sort()
        return report

    def flush(self) -> list[str]:
        """Remove every route of ours (a node leaving netplugin's care); returns their destinations."""
        return self.reconcile([]).removed


def node_overlaps(claims: list[tuple[NodeInfo, Network]]) -> dict[tuple[str, str], tuple[str, str]]:
    """(node, cidr) -> ("node_overlap", why) for each claim refused because another node's overlaps it.

    CIDRs overlap only by containment, so one sweep in address order with a stack of the open
    (containing) CIDRs finds every overlapping pair in O(n log n + pairs). Of a pair, the newer
    Node is refused; both are when neither is known to be older.
    """
    refused: dict[tuple[str, str], tuple[str, str]] = {}

    def refuse(loser: tuple[NodeInfo, Network], other: tuple[NodeInfo, Network], why: str) -> None:
        refused.setdefault(
            (loser[0].name, str(loser[1])),
            ("node_overlap", f"overlaps pod CIDR {other[1]} of node {other[0].name} ({why})"),
        )

    for version in (4, 6):
        fam = sorted(
            (c for c in claims if c[1].version == version),
            key=lambda c: (int(c[1].network_address), c[1].prefixlen, c[0].name),
        )
        stack: list[tuple[NodeInfo, Network]] = []
        for claim in fam:
            start = int(claim[1].network_address)
            while stack and int(stack[-1][1].broadcast_address) < start:
                stack.pop()
            for open_ in stack:
                if open_[0].name == claim[0].name:
                    continue
                a, b = open_[0].created, claim[0].created
                if a and b and a != b:
                    old, new = (open_, claim) if a < b else (claim, open_)
                    refuse(new, old, "an older Node")
                else:
                    refuse(claim, open_, "neither Node is known to be older: both refused")
                    refuse(open_, claim, "neither Node is known to be older: both refused")
            stack.append(claim)
    return refused
