"""The record listing behind ``netplugin pods``: every record with its condition.

A record that is not ``ready`` is either in progress (someone holds the pod's lock) or was
interrupted (nobody does); the listing tells the two apart without taking the lock. A pod set up by
another chain than the configured one is torn down by its recorded chain: the listing says so.
"""

from __future__ import annotations

import datetime
import fcntl
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from netplugin.core.names import PodRef
from netplugin.core.netlink import RawNetlink
from netplugin.core.plugin import NOOP_NAME
from netplugin.core.texttable import text_table
from netplugin.store.locks import pod_lock_path
from netplugin.store.records import READY, SETTING_UP, PodRecord
from netplugin.store.state import StateStore

__all__ = [
    "PodListing",
    "age",
    "chain_differs",
    "chain_text",
    "condition_of",
    "link_gone",
    "list_pods",
    "pod_busy",
    "retired_links",
    "still_needed",
]


def pod_busy(run_dir: str, ref: PodRef) -> bool:
    """Whether some process holds the pod's lock right now (an action is in progress)."""
    path = pod_lock_path(run_dir, ref)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        # never locked, removed by its last holder, or unreadable (then we cannot tell: idle)
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


@dataclass
class PodListing:
    """What ``netplugin pods`` shows: every record with its condition, and corrupt files."""

    rows: list[tuple[PodRecord, str]]
    corrupt: list[Any]
    #: the configured chain (None: not compared)
    chain: tuple[str, ...] | None = None
    #: host veths of torn-down pods that the kernel has not deleted yet (a teardown answers before
    #: that; gc deletes any a crash left)
    deleting: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        pods = []
        for rec, condition in self.rows:
            d = rec.to_dict()
            d["condition"] = condition
            d["path"] = rec.path
            if self.chain is not None:
                d["chain_differs"] = chain_differs(rec, self.chain)
            pods.append(d)
        return {"pods": pods, "corrupt": [c.to_dict() for c in self.corrupt], "deleting": list(self.deleting)}

    def table(self) -> str:
        header = ("NAMESPACE", "NAME", "INFRA-ID", "STATE", "IP", "PLUGIN", "UPDATED")
        rows = [
            (r.ref.namespace, r.ref.name, r.ref.infra_id, cond, r.ip or "-", self._plugin_cell(r), r.updated)
            for r, cond in self.rows
        ]
        return text_table(header, rows)

    def wide_table(self, now: float | None = None) -> str:
        """``-o wide``: every chain member with its state, the host veth, the netns and the age
        (at ``now``, seconds since the epoch; default: now)."""
        now = time.time() if now is None else now
        header = ("NAMESPACE", "NAME", "INFRA-ID", "STATE", "IP", "CHAIN", "HOST-VETH", "NETNS", "AGE")
        rows = [
            (
                r.ref.namespace,
                r.ref.name,
                r.ref.infra_id,
                cond,
                r.ip or "-",
                ",".join(f"{m.plugin}:{m.state}" for m in r.chain),
                next((m.host_interface for m in r.chain if m.host_interface), "-"),
                r.netns,
                age(r.created, now),
            )
            for r, cond in self.rows
        ]
        return text_table(header, rows)

    def _plugin_cell(self, rec: PodRecord) -> str:
        if self.chain is None or not chain_differs(rec, self.chain):
            return chain_text(rec)
        return f"{chain_text(rec)} (configured now: {','.join(self.chain) or NOOP_NAME})"


def age(since: str, now: float) -> str:
    """How long before ``now`` (seconds since the epoch) ``since`` (a record's ISO 8601 time) was,
    as kubectl prints ages: 42s, 5m, 3h, 12d (a unit from twice its size)."""
    then = datetime.datetime.fromisoformat(since)
    if then.tzinfo is None:
        then = then.replace(tzinfo=datetime.UTC)
    seconds = max(0, int(now - then.timestamp()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= 2 * size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def chain_differs(rec: PodRecord, chain: tuple[str, ...]) -> bool:
    """Whether the pod was set up by another chain than ``chain`` (the configured one)."""
    return tuple(m.plugin for m in rec.chain) != (chain or (NOOP_NAME,))


def chain_text(rec: PodRecord) -> str:
    """The PLUGIN column: the plugin; for a longer chain each member with its own state."""
    if len(rec.members) <= 1:
        return rec.plugin
    return ",".join(f"{m.plugin}:{m.state}" for m in rec.members)


def link_gone(name: str) -> bool:
    """Whether no link of that name is in this network namespace (a pod's host veth that went with its pod)."""
    try:
        socket.if_nametoindex(name)
    except OSError:
        return True
    return False


def condition_of(rec: PodRecord, run_dir: str) -> str:
    """The record's state, telling an action in progress from an interrupted one, and a ready pod
    whose host interface is gone (``broken``: only a new sandbox mends it) from a healthy one."""
    if rec.state == READY:
        gone = [m.host_interface for m in rec.chain if m.ran and m.host_interface and link_gone(m.host_interface)]
        return "broken" if gone else READY
    if pod_busy(run_dir, rec.ref):
        return rec.state
    if rec.state == SETTING_UP and rec.rollback_error is not None:
        return "rollback-failed"
    return "setup-interrupted" if rec.state == SETTING_UP else "teardown-interrupted"


def list_pods(state_dir: str, run_dir: str, chain: tuple[str, ...] | None = None) -> PodListing:
    """Every record with its condition; ``chain`` (the configured one) marks pods set up by another."""
    scan = StateStore(state_dir).scan()
    rows = [(r, condition_of(r, run_dir)) for r in scan.records]
    return PodListing(rows, list(scan.corrupt), chain, deleting=retired_links())


def retired_links() -> list[str]:
    """The names of the links taken off the network by a teardown and not deleted yet, sorted."""
    with RawNetlink() as nl:
        return sorted(name for name, _pid in nl.retired().values())


def still_needed(state_dir: str, chain: tuple[str, ...]) -> dict[str, list[str]]:
    """Plugins outside ``chain`` that recorded pods still need for their teardown -> those pods."""
    out: dict[str, list[str]] = {}
    for rec in StateStore(state_dir).scan().records:
        for m in rec.chain:
            if m.ran and m.plugin not in (chain or (NOOP_NAME,)):
                out.setdefault(m.plugin, []).append(str(rec.ref))
    return out
