"""Which interfaces lost something, read from the kernel's link, address and qdisc notifications.

:class:`LinkView` keeps, from the notifications themselves (seeded by one link dump at start), each
link's name, master, MTU, up flag and hairpin. From each message it tells the interfaces that
*lost* something a plugin may have made: a link deleted, a port that lost its master or its
hairpin, a master (a bridge) deleted, downed, re-sized or stripped of an address (its IPv6
link-local one too; then each of its ports), a qdisc deleted (not a kernel default that a setup
replaces). Gains (a link created, a port attached, hairpin turned on, a default qdisc replaced:
what every setup does) are not losses, so pod setups do not wake the
pod repairer. The kernel state is never read here: only messages are parsed, so an idle node costs
nothing.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

from netplugin.core.nlwire import (
    IFADDR,
    IFF_UP,
    IFINFO,
    IFLA_BRPORT_MODE,
    IFLA_IFNAME,
    IFLA_INFO_SLAVE_DATA,
    IFLA_LINKINFO,
    IFLA_MASTER,
    IFLA_MTU,
    IFLA_PROTINFO,
    RTM_DELADDR,
    RTM_DELLINK,
    RTM_DELQDISC,
    RTM_NEWLINK,
    TCMSG,
    U32,
    find_attr,
    messages,
)

__all__ = ["LinkView", "LostInterfaces"]

#: the other messages that can tell a loss, with the size of their header
_OTHER_HEADER = {RTM_DELADDR: IFADDR.size, RTM_DELQDISC: TCMSG.size}


@dataclass
class _Link:
    name: str
    master: int = 0
    mtu: int = 0
    up: bool = False
    hairpin: bool | None = None  #: None: not a bridge port, or not known yet
    #: the master it had last (kept when it is detached): a bridge's deletion detaches its ports
    #: before the bridge goes, and a repair racing with that deletion must be followed by another
    last_master: int = 0


@dataclass
class LostInterfaces:
    """What one batch of messages took away, by interface name; or, with ``every``, what cannot be
    told (notifications lost, the watch failing): every pod's interfaces are to be checked."""

    #: links deleted
    gone: set[str] = field(default_factory=set)
    #: links still there that lost something (a master, hairpin, a qdisc, their master's state)
    damaged: set[str] = field(default_factory=set)
    #: every pod's host interfaces, whatever their names
    every: bool = False

    def __bool__(self) -> bool:
        return bool(self.gone or self.damaged or self.every)

    def add(self, other: LostInterfaces) -> None:
        self.gone |= other.gone
        self.damaged |= other.damaged
        self.every = self.every or other.every


def _u32(data: bytes | None) -> int:
    return U32.unpack(data[:4])[0] if data is not None and len(data) >= 4 else 0


def _name(data: bytes | None) -> str:
    return data.split(b"\0", 1)[0].decode("utf-8", "replace") if data is not None else ""


class LinkView:
    """The links as the notifications describe them; :meth:`feed` returns what a batch lost."""

    def __init__(self) -> None:
        self.links: dict[int, _Link] = {}

    def ports_of(self, index: int) -> set[str]:
        return {link.name for link in self.links.values() if link.master == index}

    def former_ports_of(self, index: int) -> set[str]:
        return {link.name for link in self.links.values() if index in (link.master, link.last_master)}

    def feed(self, data: bytes) -> LostInterfaces:
        lost = LostInterfaces()
        for kind, _, _, body in messages(data):
            if kind in (RTM_NEWLINK, RTM_DELLINK) and len(body) >= IFINFO.size:
                self._link(kind, body, lost)
            elif kind in _OTHER_HEADER and len(body) >= _OTHER_HEADER[kind]:
                self._other(kind, body, lost)
        return lost

    def _link(self, kind: int, body: bytes, lost: LostInterfaces) -> None:
        family, _, index, flags, _ = IFINFO.unpack_from(body)
        old = self.links.get(index)
        if kind == RTM_DELLINK:
            if family == socket.AF_BRIDGE:  # a port leaving its bridge: its AF_UNSPEC message says the rest
                return
            self.links.pop(index, None)
            if old is not None:
                lost.gone.add(old.name)
                lost.damaged |= self.former_ports_of(index)
            return
        attrs = IFINFO.size
        if family == socket.AF_BRIDGE:  # a bridge port's flags (sysfs or `bridge link set` changed them)
            mode = find_attr(find_attr(body, attrs, IFLA_PROTINFO) or b"", 0, IFLA_BRPORT_MODE)
            if old is not None and mode is not None:
                self._hairpin(old, bool(mode[0]), lost)
            return
        name = _name(find_attr(body, attrs, IFLA_IFNAME)) or (old.name if old else "")
        new = _Link(name, _u32(find_attr(body, attrs, IFLA_MASTER)), _u32(find_attr(body, attrs, IFLA_MTU)))
        new.up = bool(flags & IFF_UP)
        slave = find_attr(find_attr(body, attrs, IFLA_LINKINFO) or b"", 0, IFLA_INFO_SLAVE_DATA)
        mode = find_attr(slave, 0, IFLA_BRPORT_MODE) if slave is not None else None
        new.hairpin = old.hairpin if old is not None and new.master == old.master else None
        new.last_master = new.master or (old.master or old.last_master if old is not None else 0)
        self.links[index] = new
        if mode is not None:
            self._hairpin(new, bool(mode[0]), lost)
        if old is None:
            return
        if old.master and new.master != old.master:
            lost.damaged.add(name)
        if (old.mtu != new.mtu or (old.up and not new.up)) and self.ports_of(index):
            lost.damaged |= self.ports_of(index)

    @staticmethod
    def _hairpin(link: _Link, on: bool, lost: LostInterfaces) -> None:
        if link.hairpin and not on:
            lost.damaged.add(link.name)
        link.hairpin = on

    def _other(self, kind: int, body: bytes, lost: LostInterfaces) -> None:
        if kind == RTM_DELQDISC:
            _, index, handle, _, _ = TCMSG.unpack_from(body)
            # Handle 0 is a qdisc the kernel attached by default (noqueue, pfifo_fast...), which
            # no plugin made: a shaping setup replacing it is a gain. Every qdisc tc adds gets a
            # handle, so deleting or replacing a plugin's own is still a loss.
            if handle != 0 and index in self.links:
                lost.damaged.add(self.links[index].name)
            return
        # Any address of a master, its IPv6 link-local one too: the node needs it to resolve the pods
        # it forwards to, and the kernel makes none again while the bridge stays up.
        index = IFADDR.unpack_from(body)[4]
        lost.damaged |= self.ports_of(index)
