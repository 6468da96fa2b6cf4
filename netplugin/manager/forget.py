"""``netplugin gc --forget POD``: drop the record of a pod that can never be torn down.

Some teardowns cannot succeed any more (the plugin that made the pod is gone for good, or its
teardown fails on something only a person can fix), and gc would retry them forever. Forgetting
the record ends that, after saying what the pod may still hold, so a person can remove it by hand:
its network namespace (if still there), its address, and each chain member whose setup ran and
was never torn down. It happens under the pod's lock, so never during an action on the pod.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from netplugin.core.errors import InvalidArgument
from netplugin.core.names import PodRef

if TYPE_CHECKING:
    from netplugin.manager.manager import Manager
    from netplugin.store.records import PodRecord

__all__ = ["Forgotten", "forget_pod", "leftovers"]


@dataclass(frozen=True)
class Forgotten:
    """A record gc forgot, and what its pod may have left behind."""

    pod: PodRef
    state: str
    left: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        ref = {"namespace": self.pod.namespace, "name": self.pod.name, "infra_id": self.pod.infra_id}
        return {**ref, "state": self.state, "left": list(self.left)}

    def text(self) -> str:
        pod = f"{self.pod.namespace}/{self.pod.name} ({self.pod.infra_id})"
        lines = [f"forgot {pod}, state {self.state}; it may have left:"]
        lines += [f"  {item}" for item in self.left] or ["  nothing netplugin knows of"]
        return "\n".join(lines)


def leftovers(rec: PodRecord) -> tuple[str, ...]:
    """What the pod may still hold in the kernel and in IPAM, as the record tells."""
    out: list[str] = []
    if os.path.lexists(rec.netns):
        out.append(f"network namespace {rec.netns} (still there: its interfaces and routes with it)")
    if rec.ip:
        out.append(f"address {rec.ip} (reserved by the plugin's IPAM until it is released)")
    for m in rec.chain:
        if m.ran:
            out.append(f"what {m.plugin} {m.version} set up (its state: {m.state}; never torn down)")
    return tuple(out)


def _parse(pod: str) -> tuple[str, str, str | None]:
    parts = pod.split("/")
    if len(parts) not in (2, 3) or not all(parts):
        raise InvalidArgument("pod", pod, "must be NAMESPACE/NAME or NAMESPACE/NAME/INFRA_ID (see netplugin pods)")
    return parts[0], parts[1], parts[2] if len(parts) == 3 else None


def forget_pod(manager: Manager, pod: str) -> Forgotten:
    """Forget the one record ``pod`` (NAMESPACE/NAME[/INFRA_ID]) names; InvalidArgument if none or several."""
    namespace, name, infra_id = _parse(pod)
    store = manager.state
    if store is None:
        raise InvalidArgument("pod", pod, "this netplugin keeps no pod records")
    matches = [
        r.ref
        for r in store.scan().records
        if (r.ref.namespace, r.ref.name) == (namespace, name) and infra_id in (None, r.ref.infra_id)
    ]
    if len(matches) != 1:
        found = ", ".join(sorted(m.infra_id for m in matches))
        why = "no record of it" if not matches else f"several records (infra ids {found}): name one"
        raise InvalidArgument("pod", pod, why)
    ref = matches[0]
    with manager.pod_lock(ref):
        rec = store.get(ref)
        if rec is None:
            raise InvalidArgument("pod", pod, "no record of it (torn down meanwhile)")
        forgotten = Forgotten(ref, rec.state, leftovers(rec))
        store.remove(ref)
    return forgotten
