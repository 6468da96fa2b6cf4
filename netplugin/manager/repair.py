"""Repair: one ready pod's recorded chain's ``repair``, and the chain's ``node`` actions (contract:
``docs/plugin-contract.md``).

The daemon's keepers (:mod:`netplugin.agent`) decide when; :func:`repair_pod` runs a pod's under
the pod's lock, with the chain the pod was set up with and the environment rebuilt from its record
(as teardown does). A pod that is not ready (in setup, in teardown, interrupted) is not touched:
its own action, or gc, owns it. :func:`keep_node` runs the ``node`` action of each configured member that declares it
(its node-level state made what must exist; the member serialises it with its own pod actions).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from netplugin.core.errors import NetpluginError
from netplugin.core.names import PodRef
from netplugin.core.plugin import REPAIR_KINDS, RepairKind
from netplugin.store.records import READY

if TYPE_CHECKING:
    from netplugin.manager.manager import Manager

__all__ = ["NodeKept", "PodRepair", "keep_node", "repair_kind", "repair_pod"]


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


def repair_kind(line: str) -> RepairKind:
    """The kind a repair line counts under: its ``KIND:`` prefix when it is a known kind, else ``other``."""
    head, sep, _ = line.partition(":")
    return RepairKind(head.strip()) if sep and head.strip() in REPAIR_KINDS else RepairKind.OTHER


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


@dataclass
class NodeKept:
    """What one round of the chain's ``node`` actions did."""

    #: (member, ``KIND: what``) for each thing put back or removed
    changes: list[tuple[str, str]] = field(default_factory=list)
    #: each member's failure, as text
    errors: list[str] = field(default_factory=list)
    #: why the chain's init could not run (the masks known before it still served), or no chain is valid
    init_error: str | None = None


def keep_node(manager: Manager, *, init: bool = True) -> NodeKept:
    """Run the ``node`` action of each configured member whose mask declares it, in chain order.

    With ``init``, the chain's init runs first when it has not (the masks come from it); without,
    only the masks already known serve. A failure of one member does not stop the others."""
    out = NodeKept()
    try:
        if init:
            manager.init()
    except NetpluginError as e:  # the masks known so far still serve
        out.init_error = e.message
    except OSError as e:  # a member's file went away since it was selected
        out.init_error = f"{e.filename}: {e.strerror}"
    node = manager.node(strict=False)
    try:
        members = manager.members()
    except NetpluginError as e:  # no valid chain configured: no member's state to keep
        out.init_error = out.init_error or e.message
        return out
    for m in members:
        if "node" not in m.handles:
            continue
        try:
            lines = m.plugin.node(manager.node_context(node))
        except NetpluginError as e:
            out.errors.append(e.message)
            continue
        out.changes += [(m.name, line) for line in lines]
    return out
