"""The MTU of the bridge and the pods' interfaces when none is configured (``MTU=auto``): the underlay's.

kubenet's rule: the smallest MTU among the node's links that are up and not loopback; here also
not netplugin's own (the bridge, its ports, pod veths ``np<12 hex>``), whose MTU is the result, not
an input. A cloud NIC of 1460 or 1450 then gives pods 1460 or 1450 instead of 1500 packets that
are fragmented or black-holed. ``init`` computes it and records it in the IPAM directory
(:attr:`BridgeSettings.mtu_record`); ``setup`` uses the record. The bash plugin does the same.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from netplugin.core.fileio import atomic_write

__all__ = ["DEFAULT_MTU", "IPV6_MIN_MTU", "NodeLink", "node_links", "read_record", "underlay_mtu", "write_record"]

#: when the node has no link to go by
DEFAULT_MTU = 1500
IPV6_MIN_MTU = 1280
_IFF_UP, _IFF_LOOPBACK = 0x1, 0x8
_POD_VETH = re.compile(r"np[0-9a-f]+\Z")


@dataclass(frozen=True, slots=True)
class NodeLink:
    name: str
    index: int
    flags: int
    mtu: int
    master: int | None = None


def node_links() -> list[NodeLink]:
    """The links of the caller's network namespace (netlink: /sys may show another one's)."""
    from pyroute2 import IPRoute

    with IPRoute(groups=0) as ipr:
        return [
            NodeLink(str(m.get("ifname")), int(m["index"]), int(m["flags"]), int(m.get("mtu") or 0), m.get("master"))
            for m in ipr.get_links()
        ]


def underlay_mtu(links: Iterable[NodeLink], bridge: str) -> int:
    """The smallest MTU of the up, non-loopback links that are not netplugin's; DEFAULT_MTU if none."""
    links = list(links)
    ours = {link.index for link in links if link.name == bridge}
    mtus = [
        link.mtu
        for link in links
        if link.flags & _IFF_UP
        and not link.flags & _IFF_LOOPBACK
        and link.index not in ours
        and link.master not in ours
        and not _POD_VETH.match(link.name)
        and link.mtu > 0
    ]
    return min(mtus, default=DEFAULT_MTU)


def write_record(path: str, mtu: int) -> None:
    atomic_write(path, f"{mtu}\n".encode(), mode=0o644)


def read_record(path: str) -> int | None:
    """The recorded MTU, or None when there is none (init has not run) or it is not a number."""
    try:
        with open(path, "rb") as f:
            text = f.read(16)
    except FileNotFoundError:
        return None
    return int(text) if text.strip().isdigit() else None

