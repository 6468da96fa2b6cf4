"""Repairing one ready pod: its recorded chain's ``repair`` action (contract: :mod:`netplugin.core.plugin`).

The daemon's pod repairer (:mod:`netplugin.agent.podrepair`) decides when; this module
runs it under the pod's lock, with the chain the pod was set up with and the environment rebuilt
from its record (as teardown does). A pod that is not ready (in setup, in teardown, interrupted)
is not touched: its own action, or gc, owns it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from netplugin.core.errors import NetpluginError
from netplugin.core.names import PodRef
from netplugin.core.plaindata import dataclass, field
from netplugin.core.plugin import REPAIR_KINDS
from netplugin.store.records import READY

if TYPE_CHECKING:
    from netplugin.manager.manager import Manager

__all__ = ["PodRepair", "repair_kind", "repair_pod"]


@dataclass
class PodRepair:
    """What one pod's repair did."""

    pod: PodRef
    #: (member, ``KIND: what``) for each thing put back
    changes: list[tuple[str, str]] = field(default_factory=list)
    #: each member's failure, as text
    errors: list[str] = field(default_factory=list)
    #: members that ran for the pod but declare no repair
    unrepairable: list[str] = field(default_factory=list)
    #: False when the pod was not ready (nothing was run)
    ran: bool = False


def repair_kind(line: str) -> str:
    """The kind a repair line counts under: its ``KIND:`` prefix when it is a known kind, else ``other``."""
    head, sep, _ = line.partition(":")
    return head.strip() if sep and head.strip() in REPAIR_KINDS else "other"


def repair_pod(manager: Manager, pod: PodRef) -> PodRepair:
    """Run the pod's chain's ``repair`` (each member that ran and declares it), under the pod's lock."""
    out = PodRepair(pod)
    store = manager.state
    if store is None:
        return out
    with manager.pod_lock(pod, live=True):
        rec = store.get(pod)
        if rec is None or rec.state != READY:
            return out
        run = manager.recorded_run(rec, node=manager.node(strict=False))
        failures, out.unrepairable = run.repair()
        out.ran = True
    out.errors = [e.message for e in failures if isinstance(e, NetpluginError)]
    out.changes = [(run.members[i].name, line) for i, lines in sorted(run.repaired.items()) for line in lines]
    return out
