"""The bridge plugin's ``repair``: what the kernel lost of the bridge and of one pod's port, put back.

Read first, then fix only what differs, so that the report (``KIND: what`` lines, the contract's
:data:`~netplugin.core.plugin.REPAIR_KINDS`) says exactly what changed and a pod whose objects are
intact costs two netlink reads. pyroute2 is fine here: repairs are rare, readability wins.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable

from netplugin.core.netlink import KernelError, root_netlink
from netplugin.core.plaindata import dataclass
from netplugin.plugins.bridge.settings import BridgeError, BridgeSettings

__all__ = ["repair_bridge", "repair_port"]


@dataclass(frozen=True)
class _Link:
    index: int
    mtu: int
    up: bool
    master: int | None
    hairpin: bool
    is_bridge: bool


def _read(name: str) -> tuple[_Link | None, set[str]]:
    """The link ``name`` (None when absent) and its global addresses."""
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError

    try:
        with IPRoute(groups=0) as ipr:
            try:
                msg = ipr.link("get", ifname=name)[0]
            except NetlinkError as e:
                if e.code == errno.ENODEV:
                    return None, set()
                raise
            index = int(msg["index"])
            addrs = {f"{a.get('IFA_ADDRESS')}/{a['prefixlen']}" for a in ipr.addr("dump", index=index)}
    except NetlinkError as e:
        raise KernelError(e.code, os.strerror(e.code) if e.code else str(e)) from e
    link = _Link(
        index=index,
        mtu=int(msg.get("IFLA_MTU") or 0),
        up=bool(int(msg["flags"]) & 1),
        master=msg.get("IFLA_MASTER"),
        hairpin=bool(msg.get(("IFLA_LINKINFO", "IFLA_INFO_SLAVE_DATA", "IFLA_BRPORT_MODE"))),
        is_bridge=msg.get(("IFLA_LINKINFO", "IFLA_INFO_KIND")) == "bridge",
    )
    return link, addrs


def repair_bridge(s: BridgeSettings, mtu: int, configure: Callable[[], int]) -> tuple[int, list[str]]:
    """The bridge is there, up, with its gateway addresses and ``mtu``; ``configure`` (init's
    bridge step, idempotent) runs only when something differs. Returns (its ifindex, what changed)."""
    link, addrs = _read(s.name)
    want = {f"{g}/{n.prefixlen}" for g, n in zip(s.gateways, s.subnets, strict=True)}
    if link is not None and not link.is_bridge:
        raise BridgeError(f"{s.name} exists but is not a bridge")
    if link is not None and link.up and link.mtu == mtu and want <= addrs:
        return link.index, []
    index = configure()
    if link is None:
        return index, [f"bridge: {s.name} recreated with {', '.join(sorted(want))}, mtu {mtu}"]
    lines = [f"bridge: {s.name} address {a} re-added" for a in sorted(want - addrs)]
    if link.mtu != mtu:
        lines.append(f"bridge: {s.name} mtu {link.mtu} -> {mtu}")
    if not link.up:
        lines.append(f"bridge: {s.name} set up")
    return index, lines


def repair_port(host: str, bridge: int, bridge_name: str, mtu: int) -> list[str]:
    """The pod's host veth ``host`` is a port of ``bridge``, up, with hairpin on."""
    link, _ = _read(host)
    if link is None:
        raise BridgeError(f"host veth {host} is gone: the pod needs a new setup")
    lines = []
    root = root_netlink()
    if link.master != bridge or not link.up:
        root.attach(link.index, mtu, bridge)
        lines.append(f"port: {host} re-attached to {bridge_name}")
    if link.master != bridge or not link.hairpin:  # a port that left the bridge lost its flags too
        root.hairpin(link.index)
        lines.append(f"port: {host} hairpin on")
    return lines
