"""Garbage collection: reconcile pod records with reality, and the record listing.

In detail: ``ARCHITECTURE.md``, "Module notes".
"""

from __future__ import annotations

import enum
import functools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from netplugin.core.errors import HostError, NetpluginError, PluginFailed, StateError
from netplugin.core.fileio import stale_temps
from netplugin.core.names import PodRef
from netplugin.core.netlink import RawNetlink
from netplugin.core.netns import netns_gone
from netplugin.core.plugin import NOOP_NAME
from netplugin.core.procs import pid_alive
from netplugin.hosts.base import NullHost
from netplugin.hosts.static import StaticHost
from netplugin.manager.chain import recorded_members
from netplugin.manager.repair import keep_node
from netplugin.plugins.hostport import forget, recorded_pods
from netplugin.store.listing import pod_busy
from netplugin.store.orphans import POD_ACTIONS, plugin_processes, settle
from netplugin.store.records import READY, SETTING_UP, TEARING_DOWN, PodRecord
from netplugin.store.state import Scan, StateStore

if TYPE_CHECKING:
    from netplugin.core.plugin import Plugin
    from netplugin.hosts.base import Host
    from netplugin.manager.manager import Manager

__all__ = [
    "FREEING_KINDS",
    "GcAction",
    "GcIncomplete",
    "GcKind",
    "GcReport",
    "host_is_authoritative",
    "plugin_processes",
    "pod_busy",
    "run_gc",
    "settle",
]


class GcIncomplete(PluginFailed):
    """gc could not tear down every pod it should have; their records are kept for the next run."""

    def __init__(self, failed: list[GcAction]) -> None:
        what = "; ".join(f"{a.target}: {a.error}" for a in failed[:5])
        more = f" (and {len(failed) - 5} more)" if len(failed) > 5 else ""
        super().__init__(
            f"gc: {len(failed)} pod(s) could not be torn down; their records are kept: {what}{more}",
            plugin="",
            action="teardown",
        )
        self.failed = failed


# --- plugin processes left by a dead netplugin ---------------------------------------------------------


# --- deciding --------------------------------------------------------------------------------------------


def host_is_authoritative(host: Host) -> bool:
    """Whether "the host does not know this pod" means the pod is gone.

    NullHost knows no pods at all, and a StaticHost whose directory does not exist is not in use;
    every other host is trusted.
    """
    if isinstance(host, NullHost):
        return False
    if isinstance(host, StaticHost):
        return os.path.isdir(host.directory)
    return True


def _reason(rec: PodRecord, host: Host | None, notes: list[str]) -> str | None:
    """Why the record's pod should be torn down, or None to keep it."""
    if rec.state == SETTING_UP and rec.rollback_error is not None:
        return f"its setup failed and so did its rollback ({rec.rollback_error})"
    if rec.state == SETTING_UP:
        return "its setup was interrupted"
    if rec.state == TEARING_DOWN:
        return "its teardown was interrupted"
    if rec.netns_existed and netns_gone(rec.netns):
        return f"its network namespace {rec.netns} is gone"
    if host is not None and rec.host_known:
        try:
            obj = host.get_pod_by_name(rec.ref.namespace, rec.ref.name)
        except HostError as e:
            notes.append(f"host lookup of {rec.ref} failed, kept: {e.message}")
            return None
        if obj is None:
            return "the host says the pod no longer exists"
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        uid = meta.get("uid") if isinstance(meta, dict) else None
        if rec.uid and isinstance(uid, str) and uid and uid != rec.uid:
            return f"the pod was re-created (uid {rec.uid} is now {uid})"
    return None


# --- reporting -------------------------------------------------------------------------------------------


class GcKind(enum.StrEnum):
    """What one gc action is (its ``action`` in the report)."""
    TEARDOWN = "teardown"
    SET_ASIDE = "set-aside"
    SETTLE = "settle"
    REMOVE_TEMP = "remove-temp"
    SKIP = "skip"
    FORGET_HOSTPORTS = "forget-hostports"
    NODE_STATE = "node-state"
    DELETE_LINK = "delete-link"


#: the kinds that free something when done (what the daemon's metrics count as freed)
FREEING_KINDS = frozenset({GcKind.TEARDOWN, GcKind.SET_ASIDE, GcKind.SETTLE, GcKind.REMOVE_TEMP})


@dataclass
class GcAction:
    """One thing gc did (or, in a dry run, would do)."""

    kind: GcKind
    target: str
    reason: str
    outcome: str  # "done" | "planned" | "failed" | "skipped"
    error: str | None = None
    pod: PodRef | None = None
    pids: list[int] = field(default_factory=list)
    moved_to: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "action": self.kind.value,
            "target": self.target,
            "reason": self.reason,
            "outcome": self.outcome,
        }
        if self.pod is not None:
            out.update(namespace=self.pod.namespace, name=self.pod.name, infra_id=self.pod.infra_id)
        if self.error is not None:
            out["error"] = self.error
        if self.pids:
            out["pids"] = self.pids
        if self.moved_to:
            out["moved_to"] = self.moved_to
        return out

    def describe(self) -> str:
        planned = self.outcome == "planned"
        if self.kind is GcKind.TEARDOWN:
            if self.outcome == "failed":
                return f"FAILED to tear down {self.target} ({self.reason}): {self.error}; record kept"
            verb = "would tear down" if planned else "tore down"
            extra = f"; waited for {len(self.pids)} orphaned plugin process(es)" if self.pids else ""
            return f"{verb} {self.target}: {self.reason}{extra}"
        if self.kind is GcKind.SET_ASIDE:
            if planned:
                return f"would set aside corrupt record {self.target}: {self.reason}"
            return f"set aside corrupt record {self.target} as {self.moved_to}: {self.reason}"
        if self.kind is GcKind.SETTLE:
            pids = ", ".join(map(str, self.pids))
            verb = "would stop" if planned else "stopped"
            return f"{verb} orphaned plugin process(es) {pids} of {self.target}: {self.reason}"
        if self.kind is GcKind.REMOVE_TEMP:
            verb = "would remove" if planned else "removed"
            return f"{verb} {self.target}: {self.reason}"
        if self.outcome == "failed":
            return f"FAILED: {self.target}: {self.reason}: {self.error}"
        if self.kind is GcKind.DELETE_LINK:
            return f"{'would delete' if planned else 'deleted'} link {self.target}: {self.reason}"
        if self.kind is GcKind.NODE_STATE:
            return f"{self.target}'s node state: {self.reason}"
        if self.kind is GcKind.FORGET_HOSTPORTS:
            verb = "would remove" if planned else "removed"
            return f"{verb} the hostPort rules of {self.target}: {self.reason}"
        return f"skipped {self.target}: {self.reason}"


@dataclass
class GcReport:
    dry_run: bool
    checked: int = 0
    actions: list[GcAction] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> list[GcAction]:
        return [a for a in self.actions if a.outcome == "failed"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "checked": self.checked,
            "actions": [a.to_dict() for a in self.actions],
            "notes": self.notes,
            "failed": len(self.failed),
        }

    def text(self) -> str:
        lines = [a.describe() for a in self.actions]
        lines += [f"note: {n}" for n in self.notes]
        torn = sum(1 for a in self.actions if a.kind is GcKind.TEARDOWN and a.outcome in ("done", "planned"))
        if not self.actions:
            lines.append(f"gc: nothing to do ({self.checked} record(s) checked)")
        else:
            verb = "would tear down" if self.dry_run else "tore down"
            lines.append(
                f"gc: {self.checked} record(s) checked; {verb} {torn}; {len(self.failed)} failed"
                + ("; dry run, nothing changed" if self.dry_run else "")
            )
        return "\n".join(lines)


# --- locks ---------------------------------------------------------------------------------------------


# --- gc ------------------------------------------------------------------------------------------------


def _store(manager: Manager) -> StateStore:
    return manager.state if manager.state is not None else StateStore.from_config(manager.config)


def _describe(ref: PodRef) -> str:
    return f"{ref} (infra {ref.infra_id})"


class _Plugins:
    """Plugins by recorded name: the configured one (initialised once) or any other still installed."""

    def __init__(self, manager: Manager) -> None:
        self.manager = manager
        self._cache: dict[str, Plugin] = {}
        self._errors: dict[str, NetpluginError] = {}

    def get(self, name: str) -> Plugin:
        if name in self._errors:
            raise self._errors[name]
        if name not in self._cache:
            try:
                plugin = self.manager.recorded_plugin(name)
                if name in (self.manager.config.chain or (NOOP_NAME,)):
                    # as Manager.teardown does, before the pod lock
                    self.manager.init_member(plugin, node=self.manager.node(strict=False))
                self._cache[name] = plugin
            except NetpluginError as e:
                self._errors[name] = e
                raise
        return self._cache[name]


def _pod_object(manager: Manager, rec: PodRecord) -> dict[str, Any] | None:
    """The pod object for the plugin's stdin: only if it is still the pod that was set up."""
    try:
        obj = manager.host.get_pod_by_name(rec.ref.namespace, rec.ref.name)
    except HostError:
        return None
    if obj is None or not rec.host_known:
        return None
    meta = obj.get("metadata")
    uid = meta.get("uid") if isinstance(meta, dict) else None
    return obj if not rec.uid or uid == rec.uid else None


def _teardown(
    manager: Manager,
    store: StateStore,
    rec: PodRecord,
    host: Host | None,
    plugins: _Plugins,
    report: GcReport,
    progress: Callable[[str], None] | None = None,
) -> None:
    ref = rec.ref
    if progress is not None and pod_busy(manager.config.run_dir, ref):
        limit = max(manager.config.timeout_for(a) for a in ("setup", "teardown"))
        progress(f"waiting for {_describe(ref)}: an action on it is in progress (at most about {limit:.0f}s)")
    with manager.pod_lock(ref):
        try:
            current = store.get(ref)
        except StateError as e:
            moved = store.set_aside(e.path, e.reason)
            report.actions.append(GcAction(GcKind.SET_ASIDE, e.path, e.reason, "done", moved_to=moved))
            return
        if current is None:
            return  # torn down by someone else meanwhile
        reason = _reason(current, host, [])  # host trouble was noted by the pre-check
        if reason is None:
            return  # e.g. the setup we waited for completed
        action = GcAction(GcKind.TEARDOWN, _describe(ref), reason, "done", pod=ref)
        try:
            members = recorded_members(current.chain, plugins.get, manager.member)
            pod_obj = _pod_object(manager, current)
            action.pids = store.mark_teardown(ref)
            run = manager.recorded_run(
                current,
                node=manager.node(strict=False),
                pod_obj=pod_obj,
                members=members,
                record=functools.partial(store.progress, ref) if current.members else None,
                claims_in=store.state_dir,
            )
            run.teardown(only_ran=True)  # exactly the members that ran, last first
            store.remove(ref)
        except NetpluginError as e:
            action.outcome = "failed"
            action.error = e.message
        report.actions.append(action)


def _pending_orphans(manager: Manager, state_dir: str, handled: set[PodRef]) -> dict[PodRef, list[int]]:
    out: dict[PodRef, list[int]] = {}
    for p in plugin_processes(state_dir):
        ref = p.ref
        if p.action in POD_ACTIONS and ref is not None and ref not in handled:
            out.setdefault(ref, []).append(p.pid)
    return out


def _iter_records(records: list[PodRecord]) -> Iterator[PodRecord]:
    # Interrupted actions first: they are the likeliest to hold resources nobody else tracks.
    order = {SETTING_UP: 0, TEARING_DOWN: 1, READY: 2}
    yield from sorted(records, key=lambda r: (order.get(r.state, 3), r.path))


def run_gc(
    manager: Manager,
    *,
    dry_run: bool = False,
    check_host: bool = True,
    progress: Callable[[str], None] | None = None,
) -> GcReport:
    """Reconcile the records of ``manager``'s state dir with reality; see the module doc.

    ``progress`` is told, as it happens, of each pod gc waits for (an action on it in progress)."""
    store = _store(manager)
    scan = store.scan()
    report = GcReport(dry_run=dry_run, checked=len(scan.records))
    host = manager.host if check_host and host_is_authoritative(manager.host) else None

    _set_aside_corrupt(store, scan, report, dry_run)
    _remove_temps(store, scan, report, dry_run)

    plugins = _Plugins(manager)
    handled: set[PodRef] = set()
    for rec in _iter_records(scan.records):
        if dry_run:
            busy = rec.state != READY and pod_busy(manager.config.run_dir, rec.ref)
            why = None if busy else _reason(rec, host, report.notes)
            if busy:
                report.actions.append(
                    GcAction(GcKind.SKIP, _describe(rec.ref), "an action on it is in progress", "skipped", pod=rec.ref)
                )
            elif why is not None:
                report.actions.append(GcAction(GcKind.TEARDOWN, _describe(rec.ref), why, "planned", pod=rec.ref))
            continue
        if _reason(rec, host, report.notes) is None:
            continue  # cheap pre-check without the lock; re-checked under it
        handled.add(rec.ref)
        _teardown(manager, store, rec, host, plugins, report, progress)

    _hostport_leaks(manager, store, report, dry_run)
    if not dry_run:
        _node_state(manager, report)
    _settle_orphans(manager, store, handled, report, dry_run)
    _retired_links(report, dry_run)
    return report


def _set_aside_corrupt(store: StateStore, scan: Scan, report: GcReport, dry_run: bool) -> None:
    """Move each corrupt record aside (or plan to)."""
    for c in scan.corrupt:
        if dry_run:
            report.actions.append(GcAction(GcKind.SET_ASIDE, c.path, c.reason, "planned"))
            continue
        try:
            moved = store.set_aside(c.path, c.reason)
            report.actions.append(GcAction(GcKind.SET_ASIDE, c.path, c.reason, "done", moved_to=moved))
        except NetpluginError as e:
            report.actions.append(GcAction(GcKind.SET_ASIDE, c.path, c.reason, "failed", error=e.message))


def _remove_temps(store: StateStore, scan: Scan, report: GcReport, dry_run: bool) -> None:
    """Remove (or plan to remove) the temp files of interrupted writes anywhere in the state dir."""
    # Also the CNI attachment index's and the bridge plugins' IPAM temp files (state-dir subtrees).
    others = [p for p in stale_temps(store.state_dir) if os.path.dirname(p) != store.dir]
    for tmp in [*scan.stale_temps, *others]:
        reason = "temporary file of an interrupted write"
        if dry_run:
            report.actions.append(GcAction(GcKind.REMOVE_TEMP, tmp, reason, "planned"))
        else:
            try:
                if store.remove_temp(tmp):
                    report.actions.append(GcAction(GcKind.REMOVE_TEMP, tmp, reason, "done"))
            except NetpluginError as e:
                report.actions.append(GcAction(GcKind.REMOVE_TEMP, tmp, reason, "failed", error=e.message))


def _settle_orphans(manager: Manager, store: StateStore, handled: set[PodRef], report: GcReport, dry_run: bool) -> None:
    """Settle orphaned plugin processes of pods gc did not tear down (no record, or a ready one)."""
    orphans = _pending_orphans(manager, store.state_dir, handled)
    for ref, pids in sorted(orphans.items(), key=lambda kv: str(kv[0])):
        why = "their netplugin is gone"
        if dry_run:
            if not pod_busy(manager.config.run_dir, ref):
                report.actions.append(GcAction(GcKind.SETTLE, _describe(ref), why, "planned", pod=ref, pids=pids))
            continue
        with manager.pod_lock(ref):
            # Under the lock no live action runs for this pod: whatever is left is orphaned.
            procs = plugin_processes(store.state_dir, pod=ref)
            if procs:
                got = settle(procs, timeout_for=manager.config.timeout_for, kill_grace=manager.config.kill_grace)
                report.actions.append(GcAction(GcKind.SETTLE, _describe(ref), why, "done", pod=ref, pids=got))


def _node_state(manager: Manager, report: GcReport) -> None:
    """The members' node-level state compared with their records both ways, and made equal."""
    try:  # an init gc would run is a pod action's to run (and retry), not gc's
        ready = manager.init_done()
    except (NetpluginError, OSError):
        ready = False
    kept = keep_node(manager, init=ready)
    if kept.init_error is not None:
        report.notes.append(f"node state: the chain's init failed ({kept.init_error})")
    for member, line in kept.changes:
        report.actions.append(GcAction(GcKind.NODE_STATE, member, line, "done"))
    for err in kept.errors:
        report.actions.append(GcAction(GcKind.NODE_STATE, "chain", "node action", "failed", error=err))


def _retired_links(report: GcReport, dry_run: bool) -> None:
    """Delete the links a teardown retired (off the network, answered) whose process died before deleting them."""
    with RawNetlink() as nl:
        left = {i: (name, pid) for i, (name, pid) in nl.retired().items() if not pid_alive(pid)}
        failed = {} if dry_run or not left else nl.delete_links(list(left))
    for index, (name, pid) in sorted(left.items(), key=lambda kv: kv[1]):
        why = f"taken off the network by a teardown of process {pid}, which died before deleting it"
        if dry_run:
            report.actions.append(GcAction(GcKind.DELETE_LINK, name, why, "planned"))
        elif index in failed:
            report.actions.append(GcAction(GcKind.DELETE_LINK, name, why, "failed", error=os.strerror(failed[index])))
        else:
            report.actions.append(GcAction(GcKind.DELETE_LINK, name, why, "done"))


def _hostport_leaks(manager: Manager, store: StateStore, report: GcReport, dry_run: bool) -> None:
    """hostPort rules whose pod netplugin no longer records (a crash between its teardown's steps)."""
    # Keyed on the records, not the configured chain: rules of a chain that has since changed leak too.
    records = os.path.join(store.state_dir, "hostport")
    if not os.path.isdir(records):
        return
    for chain, (holder, infra) in recorded_pods(records).items():
        why = "hostPort rules of a pod netplugin no longer records"
        try:
            ref = PodRef(*holder.partition("/")[::2], infra)
        except NetpluginError as e:
            report.actions.append(GcAction(GcKind.FORGET_HOSTPORTS, chain, why, "failed", error=e.message))
            continue
        with manager.pod_lock(ref):  # a setup of the pod holds it: its record exists before its rules
            rec = store.get(ref)
            if rec is not None and rec.ref.infra_id == infra:
                continue
            if dry_run:
                report.actions.append(GcAction(GcKind.FORGET_HOSTPORTS, holder, why, "planned", pod=ref))
                continue
            try:
                forget(records, chain)
                report.actions.append(GcAction(GcKind.FORGET_HOSTPORTS, holder, why, "done", pod=ref))
            except NetpluginError as e:
                report.actions.append(GcAction(GcKind.FORGET_HOSTPORTS, holder, why, "failed", error=e.message))


# --- listing ---------------------------------------------------------------------------------------------
