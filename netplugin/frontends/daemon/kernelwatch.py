"""Self-repair of what the daemon keeps on the node, driven by the kernel's own notifications.

A thread blocks on two netlink sockets: NETLINK_ROUTE subscribed to route changes (IPv4 and
IPv6), and NETLINK_NETFILTER subscribed to nftables changes. It wakes only when the kernel says
something changed (no polling: an idle daemon spends no CPU here), waits a moment for a burst to
end, and then asks the node keeper to put back what is netplugin's:

* a deleted ``proto 78`` route (``ip route flush proto 78``, an admin's mistake): the routes are
  reconciled again from the Nodes;
* an nftables change (``nft flush ruleset``, what a firewalld reload does): the egress table is
  reinstalled if it is gone. Our own reinstall is a change too, but then the table is there.

Each repair is logged with what changed and counted in ``netplugin_repairs_total{kind}``
(:class:`~netplugin.frontends.daemon.nodekeeper.NodeKeeper`). Pods' own objects (bridge, ports,
hairpin, qdiscs) are their plugins': not repaired here.
"""

from __future__ import annotations

import logging
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence

__all__ = ["KernelWatch"]

log = logging.getLogger("netplugin.repair")

_NETLINK_NETFILTER = 12
_SOL_NETLINK = 270
_NETLINK_ADD_MEMBERSHIP = 1
_NFNLGRP_NFTABLES = 7
_RTNLGRP_IPV4_ROUTE = 7
_RTNLGRP_IPV6_ROUTE = 11
_RTM_DELROUTE = 25
_NLMSG_HDR = struct.Struct("=IHHII")
_RTMSG = struct.Struct("=BBBBBBBBI")  # family, dst_len, src_len, tos, table, protocol, scope, type, flags
#: a burst of changes (a flush removes routes one message at a time) is acted on once
SETTLE = 0.05


def _subscribe(proto: int, groups: tuple[int, ...]) -> socket.socket:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, proto)
    sock.bind((0, 0))
    for group in groups:
        sock.setsockopt(_SOL_NETLINK, _NETLINK_ADD_MEMBERSHIP, group)
    return sock


def _deleted_routes(data: bytes, protocol: int) -> bool:
    """Whether the messages in ``data`` delete a route of ``protocol``."""
    offset = 0
    while offset + _NLMSG_HDR.size <= len(data):
        length, kind, _, _, _ = _NLMSG_HDR.unpack_from(data, offset)
        if length < _NLMSG_HDR.size:
            break
        body = offset + _NLMSG_HDR.size
        if kind == _RTM_DELROUTE and body + _RTMSG.size <= len(data) and _RTMSG.unpack_from(data, body)[5] == protocol:
            return True
        offset += (length + 3) & ~3
    return False


class KernelWatch:
    """Tells ``on_change(kinds)`` which of netplugin's node objects a kernel change may have hit."""

    def __init__(self, on_change: Callable[[set[str]], None], *, route_protocol: int) -> None:
        self.on_change = on_change
        self.route_protocol = route_protocol
        self._stop_r, self._stop_w = socket.socketpair()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        routes = _subscribe(socket.NETLINK_ROUTE, (_RTNLGRP_IPV4_ROUTE, _RTNLGRP_IPV6_ROUTE))
        try:
            nft = _subscribe(_NETLINK_NETFILTER, (_NFNLGRP_NFTABLES,))
        except OSError as e:  # no nf_tables here: routes are still watched
            log.warning("cannot watch nftables changes (%s): the egress table is not repaired", e)
            nft = None
        self._thread = threading.Thread(target=self._loop, args=(routes, nft), name="netplugin-repair", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop_w.send(b"x")
        if self._thread is not None:
            self._thread.join(10)
        self._stop_r.close()
        self._stop_w.close()

    def _loop(self, routes: socket.socket, nft: socket.socket | None) -> None:
        socks = [s for s in (routes, nft) if s is not None]
        try:
            while True:
                ready, _, _ = select.select([self._stop_r, *socks], [], [])  # blocks: no wakeup while idle
                if self._stop_r in ready:
                    return
                kinds = self._read(ready, routes, nft)
                time.sleep(SETTLE)
                kinds |= self._read(select.select(socks, [], [], 0)[0], routes, nft)  # the rest of the burst
                if kinds:
                    self.on_change(kinds)
        finally:
            for s in socks:
                s.close()

    def _read(self, ready: Sequence[object], routes: socket.socket, nft: socket.socket | None) -> set[str]:
        kinds: set[str] = set()
        for sock in (routes, nft):
            while sock is not None and sock in ready:
                try:
                    data = sock.recv(1 << 16, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    break
                except OSError as e:  # ENOBUFS: messages were lost; look at everything
                    log.warning("kernel notifications overflowed (%s): checking everything", e)
                    kinds |= {"route", "egress"}
                    break
                if sock is nft:
                    kinds.add("egress")
                elif _deleted_routes(data, self.route_protocol):
                    kinds.add("route")
        return kinds
