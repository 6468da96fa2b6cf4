"""What a plugin may know about the node it runs on: name, pod CIDRs, internal addresses.

Hosts produce :class:`NodeInfo`; the manager passes it to every plugin call (as the documented
``NETPLUGIN_NODE_*`` variables, see :meth:`NodeInfo.env`); the daemon's node-level networking
consumes lists of them (one per node of the cluster).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["NodeInfo"]


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """One node: its name, ``spec.podCIDRs`` (at most one per family) and InternalIP addresses."""

    name: str
    pod_cidrs: tuple[str, ...] = ()
    internal_ips: tuple[str, ...] = ()

    def env(self) -> dict[str, str]:
        """The ``NETPLUGIN_NODE_*`` variables for a plugin call."""
        return {
            "NETPLUGIN_NODE_NAME": self.name,
            "NETPLUGIN_NODE_POD_CIDRS": ",".join(self.pod_cidrs),
            "NETPLUGIN_NODE_INTERNAL_IPS": ",".join(self.internal_ips),
        }
