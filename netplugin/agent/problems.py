"""What this node cannot act on, as the node keeper reports it: one :class:`NodeProblem` each.

The keeper builds them; the daemon's ``health`` answer carries them (:meth:`NodeProblem.to_dict`),
and ``netplugin nodes`` and ``doctor`` read them back (:meth:`NodeProblem.from_dict`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from netplugin.nodenet.routes import PROBLEM_KINDS, RouteProblem

__all__ = ["BAD_NODE", "BROKEN_POD", "NODE_PROBLEM_KINDS", "POD_KINDS", "REPAIR_LOOP", "WATCH", "NodeProblem"]

#: a Node that cannot be read
BAD_NODE = "bad_node"
#: a list+watch of the cluster that is failing
WATCH = "watch"
#: a ready pod whose host interface is gone (the pod repairer's)
BROKEN_POD = "broken_pod"
#: a pod whose repair keeps being undone (the pod repairer's loop guard cut it off)
REPAIR_LOOP = "repair_loop"
#: the pod repairer's kinds (doctor's repairs check shows them, not its node check)
POD_KINDS = frozenset({BROKEN_POD, REPAIR_LOOP})
#: the kinds ``netplugin_node_problems{kind}`` lists: the route problems', then the keeper's own
NODE_PROBLEM_KINDS = (*PROBLEM_KINDS, BAD_NODE, WATCH, BROKEN_POD)


@dataclass(frozen=True)
class NodeProblem:
    """One thing about the cluster this node cannot act on; ``node`` and ``cidr`` are "" when they do not apply."""

    kind: str
    node: str = ""
    cidr: str = ""
    reason: str = ""

    @classmethod
    def of_route(cls, p: RouteProblem) -> NodeProblem:
        return cls(p.kind, p.node, p.cidr, p.reason)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NodeProblem:
        """A problem as ``health`` answered it."""
        return cls(*(str(data.get(k) or "") for k in ("kind", "node", "cidr", "reason")))

    def to_dict(self) -> dict[str, str]:
        """As ``health`` answers it: ``{kind, node, cidr, reason}``."""
        return {"kind": self.kind, "node": self.node, "cidr": self.cidr, "reason": self.reason}

    def text(self) -> str:
        """One line for ``netplugin nodes``."""
        if self.cidr:
            return f"node {self.node} pod CIDR {self.cidr}: {self.reason}"
        if self.node:
            return f"node {self.node}: {self.reason}"
        return self.reason
