"""The record listing behind ``netplugin pods``: every record with its condition.

A record that is not ``ready`` is either in progress (someone holds the pod's lock) or was
interrupted (nobody does); the listing tells the two apart without taking the lock.
"""

from __future__ import annotations

import fcntl
import os
from typing import Any

from netplugin.core.names import PodRef
from netplugin.core.plaindata import dataclass
from netplugin.store.locks import pod_lock_path
from netplugin.store.records import READY, SETTING_UP, PodRecord
from netplugin.store.state import StateStore

__all__ = ["PodListing", "chain_text", "condition_of", "list_pods", "pod_busy"]


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

    def to_dict(self) -> dict[str, Any]:
        pods = []
        for rec, condition in self.rows:
            d = rec.to_dict()
            d["condition"] = condition
            d["path"] = rec.path
            pods.append(d)
        return {"pods": pods, "corrupt": [c.to_dict() for c in self.corrupt]}

    def table(self) -> str:
        header = ("NAMESPACE", "NAME", "INFRA-ID", "STATE", "IP", "PLUGIN", "UPDATED")
        rows = [
            (r.ref.namespace, r.ref.name, r.ref.infra_id, cond, r.ip or "-", chain_text(r), r.updated)
            for r, cond in self.rows
        ]
        widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
        return "\n".join(
            "  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=True)).rstrip() for row in [header, *rows]
        )


def chain_text(rec: PodRecord) -> str:
    """The PLUGIN column: the plugin; for a longer chain each member with its own state."""
    if len(rec.members) <= 1:
        return rec.plugin
    return ",".join(f"{m.plugin}:{m.state}" for m in rec.members)


def condition_of(rec: PodRecord, run_dir: str) -> str:
    """The record's state, telling an action in progress from an interrupted one."""
    if rec.state == READY:
        return READY
    if pod_busy(run_dir, rec.ref):
        return rec.state
    if rec.state == SETTING_UP and rec.rollback_error is not None:
        return "rollback-failed"
    return "setup-interrupted" if rec.state == SETTING_UP else "teardown-interrupted"


def list_pods(state_dir: str, run_dir: str) -> PodListing:
    scan = StateStore(state_dir).scan()
    return PodListing([(r, condition_of(r, run_dir)) for r in scan.records], list(scan.corrupt))
