"""The bridge plugin's ``repair``: what the kernel lost of the bridge and of one pod's port, put back.

Read first, then fix only what differs, so that the report (``KIND: what`` lines, the contract's
:data:`~netplugin.core.plugin.REPAIR_KINDS`) says exactly what changed and a pod whose objects are
intact costs two netlink reads. pyroute2 is fine here: repairs are rare, readability wins.
"""

from __future__ import annotations

import errno
import ipaddress
import os
from collections.abc import Callable
from dataclasses import dataclass

from netplugin.core.netlink import KernelError, root_netlink
from netplugin.core.nlwire import IFA_F_NODAD
from netplugin.plugins.bridge.settings import BridgeError, BridgeSettings

__all__ = ["repair_bridge", "repair_port"]


@dataclass(frozen=True)
class _Link:
    index: int
    mtu: int
    up: bool
    #: operationally up (carrier): the kernel has made its IPv6 link-local address by then
    running: bool
    mac: str
    master: int | None
    hairpin: bool
    is_bridge: bool


def _read(name: str) -> tuple[_Link | None, set[str]]:
    """The link ``name`` (None when absent) and its addresses (``ADDRESS/PREFIXLEN``)."""
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
        running=msg.get("IFLA_OPERSTATE") == "UP",
        mac=str(msg.get("IFLA_ADDRESS") or ""),
        master=msg.get("IFLA_MASTER"),
        hairpin=bool(msg.get(("IFLA_LINKINFO", "IFLA_INFO_SLAVE_DATA", "IFLA_BRPORT_MODE"))),
        is_bridge=msg.get(("IFLA_LINKINFO", "IFLA_INFO_KIND")) == "bridge",
    )
    return link, addrs


def repair_bridge(s: BridgeSettings, mtu: int, configure: Callable[[], int]) -> tuple[int, list[str]]:
    """The bridge is there, up, with its gateway addresses and ``mtu``; ``configure`` (init's
    bridge step, idempotent) runs only when something differs. With IPv6 it also has a link-local
    address. Returns (its ifindex, what changed)."""
    link, addrs = _read(s.name)
    want = {f"{g}/{n.prefixlen}" for g, n in zip(s.gateways, s.subnets, strict=True)}
    if link is not None and not link.is_bridge:
        raise BridgeError(f"{s.name} exists but is not a bridge")
    lines: list[str] = []
    index = link.index if link is not None else 0
    if link is None or not link.up or link.mtu != mtu or not want <= addrs:
        index = configure()
        if link is None:  # a new bridge gets its link-local address from the kernel, with carrier
            return index, [f"bridge: {s.name} recreated with {', '.join(sorted(want))}, mtu {mtu}"]
        lines += [f"bridge: {s.name} address {a} re-added" for a in sorted(want - addrs)]
        if link.mtu != mtu:
            lines.append(f"bridge: {s.name} mtu {link.mtu} -> {mtu}")
        if not link.up:
            lines.append(f"bridge: {s.name} set up")
    if s.subnet_of(6) is not None and link.running and not any(_link_local(a) for a in addrs):
        lines.append(f"bridge: {s.name} address {_add_link_local(link)} re-added")
    return index, lines


def _link_local(cidr: str) -> bool:
    return ipaddress.ip_interface(cidr).is_link_local


def _add_link_local(bridge: _Link) -> str:
    """Give ``bridge`` back the link-local address the kernel gave it (EUI-64 of its MAC) and return
    it. The kernel makes one only when a link comes up or gets carrier, so after an address flush on
    a running bridge nobody would: and without one the node sends no neighbour solicitation for
    what it forwards to a pod (their source address must be the bridge's own)."""
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError

    mac = bytes.fromhex(bridge.mac.replace(":", ""))
    iid = bytes([mac[0] ^ 2]) + mac[1:3] + b"\xff\xfe" + mac[3:]
    address = ipaddress.IPv6Address(b"\xfe\x80" + bytes(6) + iid)
    try:
        with IPRoute(groups=0) as ipr:
            ipr.addr("replace", index=bridge.index, address=str(address), prefixlen=64, flags=IFA_F_NODAD)
    except NetlinkError as e:
        raise KernelError(e.code, os.strerror(e.code) if e.code else str(e)) from e
    return f"{address}/64"


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
