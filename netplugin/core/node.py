"""What a plugin may know about the node it runs on: name, pod CIDRs, internal addresses.

Hosts produce :class:`NodeInfo` (from Kubernetes Node objects: :meth:`NodeInfo.from_node`); the
manager passes this node's to every plugin call (as the documented ``NETPLUGIN_NODE_*``
variables, see :meth:`NodeInfo.env`, and as ``CallContext.node``); the daemon's node-level
networking consumes lists of them (one per node of the cluster).
"""

from __future__ import annotations

# Imports inside this module's functions are kept for the per-call import set
# (tests/frontends/fastpath.py): each keeps a module off the calls that do not need it
# (BENCHMARKS.md rows B-i and B: the CLI's cold start and per-pod run without a daemon).
import os
from collections.abc import Mapping
from typing import Any

from netplugin.core.errors import HostError
from netplugin.core.plaindata import dataclass, field

__all__ = ["NODE_ENV_VARS", "NodeInfo", "node_name"]

#: The variables every plugin call gets (each an empty string when the host does not know it).
NODE_ENV_VARS = ("NETPLUGIN_NODE_NAME", "NETPLUGIN_NODE_POD_CIDRS", "NETPLUGIN_NODE_INTERNAL_IPS")


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """One node: its name, ``spec.podCIDRs`` (at most one per family) and InternalIP addresses.

    Both tuples are normalised (``10.1.2.0/24``, ``fd00:1::/64``, ``fd00::1``) and keep the
    order of the Node object: ``spec.podCIDRs`` order, ``status.addresses`` order. ``created``
    is ``metadata.creationTimestamp`` as the API writes it (RFC 3339, UTC, so text order is time
    order), or "" when unknown: of two nodes claiming overlapping pod CIDRs the older one is routed.
    """

    name: str
    pod_cidrs: tuple[str, ...] = ()
    internal_ips: tuple[str, ...] = ()
    created: str = field(default="", compare=False)

    def env(self) -> dict[str, str]:
        """The ``NETPLUGIN_NODE_*`` variables for a plugin call."""
        return {
            "NETPLUGIN_NODE_NAME": self.name,
            "NETPLUGIN_NODE_POD_CIDRS": ",".join(self.pod_cidrs),
            "NETPLUGIN_NODE_INTERNAL_IPS": ",".join(self.internal_ips),
        }

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "pod_cidrs": list(self.pod_cidrs), "internal_ips": list(self.internal_ips)}

    def internal_ip(self, version: int) -> str | None:
        """The first InternalIP of IP ``version`` (4 or 6), or None."""
        import ipaddress  # here: a static host's CLI call never parses an address

        return next((ip for ip in self.internal_ips if ipaddress.ip_address(ip).version == version), None)

    @classmethod
    def from_node(cls, obj: Mapping[str, Any], *, where: str = "Node") -> NodeInfo:
        """Parse a Kubernetes Node object. Raises HostError naming the field and the reason.

        ``spec.podCIDRs`` wins over the older single ``spec.podCIDR``; a second CIDR of one
        family is ignored (the API server refuses such nodes; we do not trust one that slipped
        through). Addresses other than ``InternalIP`` are ignored.
        """
        import ipaddress

        meta = obj.get("metadata")
        if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str) or not meta["name"]:
            raise HostError(f"{where}: metadata.name is missing or not a string")
        where = f"{where} {meta['name']}"
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        if not isinstance(spec, Mapping) or not isinstance(status, Mapping):
            raise HostError(f"{where}: spec and status must be objects")
        raw = spec.get("podCIDRs")
        if raw is None:
            raw = [spec["podCIDR"]] if spec.get("podCIDR") else []
        if not isinstance(raw, list):
            raise HostError(f"{where}: spec.podCIDRs must be a list")
        cidrs: list[str] = []
        for i, text in enumerate(raw):
            try:
                net = ipaddress.ip_network(text) if isinstance(text, str) else None
            except ValueError as e:
                raise HostError(f"{where}: spec.podCIDRs[{i}] {text!r} is not a network: {e}") from None
            if net is None:
                raise HostError(f"{where}: spec.podCIDRs[{i}] must be a string")
            if all(ipaddress.ip_network(c).version != net.version for c in cidrs):
                cidrs.append(str(net))
        addresses = status.get("addresses") or []
        if not isinstance(addresses, list):
            raise HostError(f"{where}: status.addresses must be a list")
        ips: list[str] = []
        for i, entry in enumerate(addresses):
            if not isinstance(entry, Mapping) or entry.get("type") != "InternalIP":
                continue
            try:
                ip = str(ipaddress.ip_address(str(entry.get("address"))))
            except ValueError:
                raise HostError(
                    f"{where}: status.addresses[{i}] {entry.get('address')!r} is not an IP address"
                ) from None
            if ip not in ips:
                ips.append(ip)
        created = meta.get("creationTimestamp")
        return cls(meta["name"], tuple(cidrs), tuple(ips), created if isinstance(created, str) else "")


def node_name(configured: str | None, environ: Mapping[str, str] | None = None) -> str:
    """This node's name: the config's ``node_name``, else ``$NODE_NAME``, else the hostname.

    ``NODE_NAME`` is what a DaemonSet usually sets from the Downward API (``spec.nodeName``).
    The hostname is lower-cased, as the kubelet does when it registers the node.
    """
    env = os.environ if environ is None else environ
    if configured:
        return configured
    if env.get("NODE_NAME", "").strip():
        return env["NODE_NAME"].strip()
    return os.uname().nodename.strip().lower()  # gethostname(2) is uname's nodename; no socket import
