"""The daemon's node-level work: watch the cluster's nodes, keep the routes to them.

In detail: ``ARCHITECTURE.md``, "Module notes".
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from netplugin.agent.podrepair import PodRepairer
from netplugin.agent.problems import BAD_NODE, BROKEN_POD, REPAIR_LOOP, WATCH, NodeProblem
from netplugin.agent.repairlog import RepairLog
from netplugin.agent.worker import Worker
from netplugin.core.errors import HostError, NetpluginError
from netplugin.core.node import NodeInfo
from netplugin.core.plugin import RepairKind
from netplugin.hosts.base import ClusterHost
from netplugin.manager.repair import keep_node, repair_kind
from netplugin.nodenet.egress import Egress, parse_cidrs
from netplugin.nodenet.forward import Forward
from netplugin.nodenet.kernelwatch import NODE_STATE, KernelWatch
from netplugin.nodenet.routes import RTPROT_NETPLUGIN, RouteTable

if TYPE_CHECKING:
    from netplugin.core.config import Config
    from netplugin.hosts import Host
    from netplugin.manager.manager import Manager
    from netplugin.nodenet.egress import Egress, EgressRules
    from netplugin.nodenet.routes import RouteReport, RouteTable

__all__ = ["STATIC_POLL", "NodeCounts", "NodeKeeper"]

log = logging.getLogger("netplugin.nodes")
repair_log = logging.getLogger("netplugin.repair")

#: how often nodes are re-read from a host that cannot watch (files are cheap to read)
STATIC_POLL = 2.0
#: how long the daemon's start waits for the first pass of a host without watches (a bound: the
#: pass reads files and the kernel; its nft call has its own time limit)
FIRST_PASS_WAIT = 30.0
#: repairs closer together than this count as one incident (what doctor calls recurring counts these)
INCIDENT_GAP = 2.0


@dataclass(frozen=True)
class NodeCounts:
    """What the keeper counts and knows, read at each scrape of the daemon's metrics (a copy)."""

    #: the destinations of the routes to other nodes in place
    routes: list[str]
    #: pod CIDRs of other nodes that cannot be routed
    route_problems: int
    problems: list[NodeProblem]
    #: nodes in the cluster, as last read
    nodes: int
    syncs: int
    #: what was put back, by kind (every kind, zero or more)
    repairs: dict[RepairKind, int]
    #: with a host that watches the cluster: its requests by (verb, resource), and each list+watch's status
    kube_requests: dict[tuple[str, str], int] | None = None
    watches: dict[str, dict[str, Any]] | None = None


class NodeKeeper:
    """Watches the nodes and keeps the routes; thread-safe status for health and metrics."""

    def __init__(
        self,
        config: Config,
        host: Host,
        *,
        routes: RouteTable | None = None,
        egress: Egress | None = None,
        forward: Forward | None = None,
        on_pod_deleted: Callable[[str, str], None] | None = None,
        manager: Callable[[], Manager] | None = None,
    ) -> None:
        self.config = config
        self.host = host
        self.on_pod_deleted = on_pod_deleted  #: told (namespace, name) of each Pod of this node deleted
        self.routes = routes
        if routes is None and config.node_routes:
            self.routes = RouteTable(host.node_name, cluster_cidrs=config.cluster_cidrs)
        self.egress = egress
        if egress is None and config.cluster_cidrs:
            self.egress = Egress()
        self.egress_rules: EgressRules | None = None
        self.forward = forward
        if forward is None and config.cluster_cidrs:
            self.forward = Forward()
        self._forward_error: str | None = None
        self._egress_error: str | None = None
        self._cidrs_warned = False
        #: this node was in the cluster (its Node seen) / has left it (its Node deleted since)
        self.member = False
        self.departed = False
        #: the host, when it watches the cluster (else it is polled)
        self.cluster: ClusterHost | None = host if isinstance(host, ClusterHost) else None
        self.watching = self.cluster is not None
        self.nodes: list[NodeInfo] | None = None
        self.report: RouteReport | None = None
        self.error: str | None = None
        self.syncs = 0
        self.last_sync: float | None = None
        self.sync_seconds = 0.0
        #: kernel changes that may have hit what is netplugin's (see nodenet.kernelwatch), and the repairs made
        self._repair: set[str] = set()
        self.repairs: Counter[str] = Counter()
        #: breakages repaired: repairs less than INCIDENT_GAP apart are one (a flush, however many objects)
        self.incidents = 0
        self._last_incident = -INCIDENT_GAP
        #: the incident going on (or last): rounds of repair in it, and when it began (monotonic)
        self._rounds = 0
        self._began = 0.0
        #: the incident with the most rounds since the daemon started: {rounds, seconds}
        self.longest_fight: dict[str, float] = {"rounds": 0, "seconds": 0.0}
        self.repair_log = RepairLog(repair_log)
        self._manager = manager
        self._watch: KernelWatch | None = None
        self._lock = threading.Lock()
        #: pod-level self-repair (its chains' ``repair``), with the daemon's manager
        self.repairer: PodRepairer | None = None
        if manager is not None:
            limit = 4 * config.timeout_for("setup")  # a pass repairs pods in parallel, each within its limit
            self.repairer = PodRepairer(
                manager, self.repairs, self._lock, self._incident, self.repair_log, lambda: limit
            )
        self._worker = Worker("netplugin-nodes", self._loop, lambda: self.config.node_resync)
        self._first = threading.Event()  #: the first pass is over (whatever it found)

    # --- life cycle ------------------------------------------------------------------------------

    def start(self) -> None:
        """Start watching; a host without watches answers at once, so its first pass (routes and
        egress) is waited for: done before the socket opens. Every pass runs on the keeper's own
        thread, never the caller's: pyroute2 runs an event loop of its own, which cannot run
        inside the daemon's."""
        if self.cluster is not None:
            self.cluster.start_watching(self.kick, on_pod_deleted=self.on_pod_deleted)
        if self.routes is not None or self.egress is not None or self.repairer is not None:
            on_lost = self.repairer.lost if self.repairer is not None else None
            watch = KernelWatch(self.repair, route_protocol=RTPROT_NETPLUGIN, on_lost=on_lost)
            try:
                watch.start()
                self._watch = watch
            except OSError as e:  # routes and egress are still kept, by the periodic pass only
                watch.stop()
                log.warning("cannot watch the kernel's route changes (%s): no self-repair", e)
        if self.repairer is not None:
            self.repairer.start()
        self._worker.start()
        if not self.watching:
            self._first.wait(FIRST_PASS_WAIT)

    def stop(self) -> None:
        if self._watch is not None:
            self._watch.stop()
        if self.repairer is not None:
            self.repairer.stop()
        self._worker.stop()
        if self.cluster is not None:
            self.cluster.stop_watching()
        if self.routes is not None:
            self.routes.close()
        if self.egress is not None:
            # Unlike routes (pod traffic between nodes must survive a restart), the masquerade
            # table goes with the daemon: connections already masqueraded keep their conntrack
            # mapping, and nothing of netplugin's stays in the firewall of a node it left.
            try:
                self.egress.remove()
            except NetpluginError as e:
                log.error("egress masquerade not removed: %s", e.message)

    def kick(self) -> None:
        """Something changed: look again now (called on watch threads)."""
        self._worker.wake()

    def workers(self) -> list[Worker]:
        """The keeper threads it runs (its own, the pod repairer's)."""
        return [self._worker, *([self.repairer.worker] if self.repairer is not None else [])]

    def broken(self) -> dict[str, str]:
        """Pods (``NS/NAME/INFRA_ID``) known broken -> why (host interface gone, a repair that keeps failing)."""
        with self._lock:
            return dict(self.repairer.broken) if self.repairer is not None else {}

    def keeper_problems(self) -> list[str]:
        """Each keeper thread (its own, the pod repairer's, the kernel watch) not running or stuck."""
        out = [p for w in self.workers() if (p := w.problem()) is not None]
        if self._watch is not None and not self._watch.alive():
            out.append("the kernel watch (netplugin-repair) is not running: nothing the kernel loses is put back")
        return out

    def repair(self, kinds: set[str]) -> None:
        """The kernel changed where netplugin's ``kinds`` ("route", "egress", "node") live: check them now."""
        with self._lock:
            self._repair |= kinds
        self._worker.wake()

    def _repair_now(self, kinds: set[str]) -> None:
        """Put back what a kernel change removed (on the keeper's thread, which owns the routes)."""
        start = time.monotonic()
        fixed = []
        if NODE_STATE in kinds:
            fixed += self._keep_node()
        egress_gone = False
        if "egress" in kinds and self.egress is not None and self.egress_rules is not None and not self.departed:
            try:
                egress_gone = not self.egress.present()
            except NetpluginError as e:
                log.error("repair: cannot check the egress table: %s", e.message)
        if self.nodes is not None and (egress_gone or "route" in kinds):
            self._resync(kinds, egress_gone, fixed)
        for kind, what in fixed:
            self._repaired(kind, what, start)
        if fixed:
            self._incident()

    def _incident(self) -> None:
        """Something was put back (node- or pod-level): an incident unless one was counted just now."""
        with self._lock:
            now = time.monotonic()
            if now - self._last_incident >= INCIDENT_GAP:
                self.incidents += 1
                self._rounds, self._began = 0, now
            self._rounds += 1
            self._last_incident = now
            if self._rounds >= self.longest_fight["rounds"]:
                self.longest_fight = {"rounds": self._rounds, "seconds": round(now - self._began, 1)}

    def _resync(self, kinds: set[str], egress_gone: bool, fixed: list[tuple[str, str]]) -> None:
        self.sync(force=True)
        if egress_gone and self.egress_rules is not None:
            fixed.append(("egress", f"nftables table inet {self.egress.table if self.egress else ''} reinstalled"))
        added = self.report.added if self.report is not None else ()
        if "route" in kinds and added:
            fixed.append(("route", f"routes re-added: {', '.join(added)}"))

    def _repaired(self, kind: str, what: str, start: float) -> None:
        with self._lock:
            self.repairs[kind] += 1
        self.repair_log.line(kind, "repair (%s) in %.3fs: %s", kind, time.monotonic() - start, what)

    def _keep_node(self) -> list[tuple[str, str]]:
        """The members' node-level state made what must exist (their ``node`` action): (kind, what) done."""
        if self._manager is None:
            return []
        kept = keep_node(self._manager(), init=False)  # the masks of the daemon's init; it runs no init
        for err in kept.errors:
            self.repair_log.line("failed", "repair: node state: %s", err, level=logging.ERROR)
        return [(repair_kind(line), f"{member}: {line}") for member, line in kept.changes]

    def _synced(self) -> bool:
        cache = self.cluster.cache if self.cluster is not None else None
        return cache is not None and bool(cache.nodes.synced.is_set())

    def _loop(self) -> None:
        poll = self.config.node_resync if self.watching else min(self.config.node_resync, STATIC_POLL)
        last_full = 0.0
        while not self._worker.stopping:
            with self._lock:
                repair, self._repair = self._repair, set()
            if repair:
                self._repair_now(repair)
            if self.watching and not self._synced():
                self._worker.sleep(0.2)  # until the first LIST is in: never act on an empty view
                continue
            due = time.monotonic() - last_full >= self.config.node_resync
            # A kick (any Node event, status heartbeats included) acts only when a node's name, pod
            # CIDRs or InternalIPs changed; the periodic pass re-checks the kernel regardless.
            try:
                if self.sync(force=due) and due:
                    last_full = time.monotonic()
                    self._repair_now({NODE_STATE})  # node-level state even when no notification came
            finally:
                self._first.set()
            self._worker.sleep(1.0 if self.repair_log.flush() else poll)

    # --- one pass ----------------------------------------------------------------------------------

    def sync(self, *, force: bool = True) -> bool:
        """Read the nodes, reconcile routes and egress (unless nothing changed and not ``force``). True if it ran."""
        start = time.monotonic()
        try:
            nodes = self.host.list_nodes()
        except HostError as e:
            if self.error != e.message:
                log.error("cannot read the cluster's nodes (routes left as they are): %s", e.message)
            self.error = e.message
            return False
        if not force and nodes == self.nodes:
            return False
        me = next((n for n in nodes if n.name == self.host.node_name), None)
        if me is not None:
            self.departed = False
        elif self.member:
            log.warning(
                "node %s left the cluster (its Node is gone): removing its routes and egress rules", self.host.node_name
            )
            self.departed = True
        self.member = me is not None
        errors: list[str] = []
        report = self._routes(nodes, errors, fresh=force)
        self._egress(me, errors)
        self._forward(me, errors)
        with self._lock:
            previous = self.report
            self.nodes, self.report = nodes, report or previous
            self.error = "; ".join(errors) or None
            self.syncs += 1
            self.last_sync = time.time()
            self.sync_seconds = time.monotonic() - start
        if report is not None:
            self._log_changes(report, previous)
        return True

    def _routes(self, nodes: list[NodeInfo], errors: list[str], *, fresh: bool) -> RouteReport | None:
        if self.routes is None or (not nodes and not self.nodes):
            # No cluster at all (a static host without node files): nothing to route, and no
            # reason to touch the routing table.
            return None
        if not self.config.cluster_cidrs and any(n.pod_cidrs for n in nodes if n.name != self.host.node_name):
            errors.append("node_routes is on but cluster_cidrs is not set: no route to another node is made")
            if not self._cidrs_warned:
                log.error("%s (set cluster_cidrs to the cluster's pod CIDRs)", errors[-1])
            self._cidrs_warned = True
        try:
            return self.routes.reconcile([] if self.departed else nodes, fresh=fresh)
        except Exception as e:  # netlink errors: report them, keep the daemon serving pods
            errors.append(f"cannot reconcile routes: {type(e).__name__}: {e}")
            log.error("%s", errors[-1])
            return None

    def _egress(self, me: NodeInfo | None, errors: list[str]) -> None:
        if self.egress is None:
            return
        try:
            if self.departed:
                self.egress.remove()
                self.egress_rules = None
                return
            pod_cidrs = me.pod_cidrs if me is not None else ()
            rules = self.egress.ensure(self.config.cluster_cidrs, pod_cidrs)
        except NetpluginError as e:
            errors.append(e.message)
            if e.message != self._egress_error:
                log.error("egress masquerade not installed: %s", e.message)
            self._egress_error = e.message
            return
        self._egress_error = None
        if rules != self.egress_rules:
            log.info("egress: masquerading pod traffic leaving %s", ", ".join(self.config.cluster_cidrs))
        self.egress_rules = rules

    def _forward(self, me: NodeInfo | None, errors: list[str]) -> None:
        if self.forward is None:
            return

        try:
            if self.departed:  # a node that left the cluster forwards no pod traffic, as it masquerades none
                self.forward.remove()
                return
            cidrs = parse_cidrs("cluster_cidrs", self.config.cluster_cidrs)
            self.forward.apply([*cidrs, *parse_cidrs("pod_cidrs", me.pod_cidrs if me is not None else ())])
        except NetpluginError as e:
            errors.append(f"pod forwarding not accepted: {e.message}")
            if errors[-1] != self._forward_error:
                log.error("%s", errors[-1])
            self._forward_error = errors[-1]
            return
        self._forward_error = None

    def _log_changes(self, report: RouteReport, previous: RouteReport | None) -> None:
        for verb, dsts in (("added", report.added), ("changed", report.changed), ("removed", report.removed)):
            if dsts:
                log.info("routes %s: %s", verb, ", ".join(dsts))
        before = set(previous.problems) if previous is not None else set()
        for p in sorted(set(report.problems) - before):
            log.warning("no route to %s", p)
        for p in sorted(before - set(report.problems)):
            log.info("resolved: %s", p)

    # --- reporting ---------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The node block of the daemon's health answer."""
        with self._lock:
            me = next((n for n in self.nodes or [] if n.name == self.host.node_name), None)
            out: dict[str, Any] = {
                **(me or NodeInfo(self.host.node_name)).to_dict(),
                "nodes": None if self.nodes is None else len(self.nodes),
                "routes_enabled": self.routes is not None,
                "egress": None
                if self.egress is None
                else {"table": self.egress.table, "applied": self.egress_rules is not None},
                "departed": self.departed,
                "syncs": self.syncs,
                "last_sync": self.last_sync,
                "last_sync_seconds": round(self.sync_seconds, 4),
                "error": self.error,
                "repairs": dict(self.repairs),
                "broken": dict(self.repairer.broken) if self.repairer is not None else {},
                "repair_incidents": self.incidents,
                "longest_fight": dict(self.longest_fight),
                "repair_lines_not_logged": self.repair_log.dropped_total,
                "repair_loops": dict(self.repairer.looping) if self.repairer is not None else {},
                "kernel_wakeups": self._watch.wakeups if self._watch is not None else None,
                "pod_repair_calls": self.repairer.calls if self.repairer is not None else None,
            }
            if self.report is not None:
                out.update(self.report.to_dict())
        cache = self.cluster.cache if self.cluster is not None else None
        if cache is not None:
            out["watch"] = cache.status()
        out["problems"] = [p.to_dict() for p in self.problems(out.get("watch"))]
        return out

    def problems(self, watch: dict[str, Any] | None = None) -> list[NodeProblem]:
        """Everything about the cluster this node cannot act on: what ``health`` and ``doctor`` show.

        A route problem (:data:`netplugin.nodenet.routes.PROBLEM_KINDS`), a Node that cannot be
        read, a list+watch that is failing, a ready pod whose host interface is gone or whose repair
        loops (:mod:`.podrepair`).
        """
        with self._lock:
            report = self.report
        out = [NodeProblem.of_route(p) for p in (report.problems if report else [])]
        cache = None
        if self.cluster is not None:
            out += [NodeProblem(BAD_NODE, n, reason=why) for n, why in self.cluster.node_problems()]
            cache = self.cluster.cache
        if self.repairer is not None:
            with self._lock:
                broken = sorted(self.repairer.broken.items())
            out += [NodeProblem(BROKEN_POD, reason=f"pod {p}: {why}") for p, why in broken]
            with self._lock:
                loops = sorted(self.repairer.looping.items())
            out += [NodeProblem(REPAIR_LOOP, reason=f"pod {p}: {why}") for p, why in loops]
        if watch is None:
            watch = cache.status() if cache is not None else {}
        for resource, st in (watch or {}).items():
            if st.get("failing") or not st.get("alive", True):
                why = st.get("last_error") or "the watch thread is not running"
                out.append(NodeProblem(WATCH, reason=f"watch of {resource}: {why}"))
        return out

    def counts(self) -> NodeCounts:
        """What the metrics read at a scrape."""
        with self._lock:
            report, nodes, syncs = self.report, self.nodes, self.syncs
            repairs = {kind: self.repairs[kind] for kind in RepairKind}
        cluster = self.cluster
        cache = cluster.cache if cluster is not None else None
        return NodeCounts(
            routes=[r.dst for r in report.routes] if report else [],
            route_problems=len(report.problems) if report else 0,
            problems=self.problems(),
            nodes=len(nodes or []),
            syncs=syncs,
            repairs=repairs,
            kube_requests=dict(cluster.requests) if cluster is not None else None,
            watches=cache.status() if cache is not None else None,
        )
