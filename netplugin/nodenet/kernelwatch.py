"""Self-repair of what the daemon keeps on the node, driven by the kernel's own notifications.

A thread blocks on three netlink sockets: NETLINK_ROUTE subscribed to route changes (IPv4 and
IPv6), NETLINK_ROUTE subscribed to link, address and qdisc changes, and NETLINK_NETFILTER
subscribed to nftables changes. It wakes only when the kernel says something changed (no
polling: an idle daemon spends no CPU here), waits a moment for a burst to end, and then reports:

* a deleted ``proto 78`` route (``ip route flush proto 78``, an admin's mistake): kind "route";
* an nftables change (``nft flush ruleset``, what a firewalld reload does): kinds "egress" and
  "node" (the chain members' node-level state, a hostPort table: their ``node`` action makes it
  what it must be; our own reinstall is a change too, but then the state is right);
* interfaces that lost something a pod's plugin made (:mod:`.linkview`: a deleted bridge, a port
  that lost its master or hairpin, a deleted qdisc), for the pod repairer (:mod:`netplugin.agent.podrepair`).

The node keeper (:class:`~netplugin.agent.nodekeeper.NodeKeeper`) acts on the kinds, the
pod repairer on the interfaces; each repair is logged and counted in ``netplugin_repairs_total{kind}``.
"""

from __future__ import annotations

import logging
import select
import socket
import threading
import time
from collections.abc import Callable, Sequence

from netplugin.core.nlwire import (
    IFINFO,
    NETLINK_ADD_MEMBERSHIP,
    NETLINK_NETFILTER,
    NFNLGRP_NFTABLES,
    NLHDR,
    NLM_F_DUMP,
    NLM_F_REQUEST,
    NLMSG_DONE,
    RTM_DELROUTE,
    RTM_GETLINK,
    RTMSG,
    RTNLGRP_IPV4_IFADDR,
    RTNLGRP_IPV4_ROUTE,
    RTNLGRP_IPV6_IFADDR,
    RTNLGRP_IPV6_ROUTE,
    RTNLGRP_LINK,
    RTNLGRP_TC,
    SOL_NETLINK,
    messages,
)
from netplugin.nodenet.linkview import LinkView, LostInterfaces

__all__ = ["NODE_STATE", "KernelWatch"]

log = logging.getLogger("netplugin.repair")

_LINK_GROUPS = (RTNLGRP_LINK, RTNLGRP_TC, RTNLGRP_IPV4_IFADDR, RTNLGRP_IPV6_IFADDR)
#: a burst of changes (a flush removes routes one message at a time) is acted on once
SETTLE = 0.05
#: the kind of the chain members' node-level state (their ``node`` action keeps it)
NODE_STATE = "node"
#: what an nftables change may have flushed
NFT_KINDS = frozenset({"egress", NODE_STATE})


def _subscribe(proto: int, groups: tuple[int, ...]) -> socket.socket:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    sock.bind((0, 0))
    for group in groups:
        sock.setsockopt(SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, group)
    return sock


def _deleted_routes(data: bytes, protocol: int) -> bool:
    """Whether the messages in ``data`` delete a route of ``protocol``."""
    return any(
        kind == RTM_DELROUTE and len(body) >= RTMSG.size and RTMSG.unpack_from(body)[5] == protocol
        for kind, _, _, body in messages(data)
    )


def _done(data: bytes) -> bool:
    """Whether ``data`` holds the NLMSG_DONE that ends a dump."""
    return any(kind == NLMSG_DONE for kind, _, _, _ in messages(data))


class KernelWatch:
    """Tells ``on_change(kinds)`` which node objects, and ``on_lost(lost)`` which interfaces, a change hit."""

    def __init__(
        self,
        on_change: Callable[[set[str]], None],
        *,
        route_protocol: int,
        on_lost: Callable[[LostInterfaces], None] | None = None,
    ) -> None:
        self.on_change = on_change
        self.on_lost = on_lost
        self.route_protocol = route_protocol
        self.view = LinkView()
        #: how often the thread woke: only for kernel notifications (an idle node: never)
        self.wakeups = 0
        #: batches that raised (logged with their traceback; the thread goes on)
        self.errors = 0
        self._stop_r, self._stop_w = socket.socketpair()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        routes = _subscribe(socket.NETLINK_ROUTE, (RTNLGRP_IPV4_ROUTE, RTNLGRP_IPV6_ROUTE))
        links = None
        if self.on_lost is not None:
            links = _subscribe(socket.NETLINK_ROUTE, _LINK_GROUPS)
            # One dump seeds the view (each link's master, MTU, hairpin); its answers arrive as
            # RTM_NEWLINK messages like the notifications, and are read by the same loop.
            flags = NLM_F_REQUEST | NLM_F_DUMP
            links.send(NLHDR.pack(NLHDR.size + IFINFO.size, RTM_GETLINK, flags, 1, 0) + IFINFO.pack(0, 0, 0, 0, 0))
            self._seed(links)
        try:
            nft = _subscribe(NETLINK_NETFILTER, (NFNLGRP_NFTABLES,))
        except OSError as e:  # no nf_tables here: routes are still watched
            log.warning("cannot watch nftables changes (%s): the egress and hostPort tables are not repaired", e)
            nft = None
        self._thread = threading.Thread(
            target=self._loop, args=(routes, links, nft), name="netplugin-repair", daemon=True
        )
        self._thread.start()

    def _seed(self, links: socket.socket) -> None:
        """Read the dump's answers (until NLMSG_DONE) into the view; what they "lose" is no loss."""
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            if not select.select([links], [], [], max(0.0, deadline - time.monotonic()))[0]:
                break
            data = links.recv(1 << 16)
            self.view.feed(data)
            if _done(data):
                break

    def stop(self) -> None:
        self._stop_w.send(b"x")
        if self._thread is not None:
            self._thread.join(10)
        self._stop_r.close()
        self._stop_w.close()

    def alive(self) -> bool:
        """Whether its thread runs (it survives any exception of one batch: logged, then everything checked)."""
        return self._thread is not None and self._thread.is_alive()

    def _loop(self, routes: socket.socket, links: socket.socket | None, nft: socket.socket | None) -> None:
        socks = [s for s in (routes, links, nft) if s is not None]
        try:
            while True:
                ready, _, _ = select.select([self._stop_r, *socks], [], [])  # blocks: no wakeup while idle
                if self._stop_r in ready:
                    return
                self.wakeups += 1
                try:
                    self._batch(ready, routes, links, nft)
                except Exception as e:
                    self.errors += 1
                    log.error("kernel watch: %s: %s; checking everything", type(e).__name__, e, exc_info=True)
                    time.sleep(SETTLE * 10)  # a bound on a batch that keeps failing
                    self.on_change({"route", *NFT_KINDS})
                    if self.on_lost is not None:
                        self.on_lost(LostInterfaces(every=True))
        finally:
            for s in socks:
                s.close()

    def _batch(
        self, ready: Sequence[object], routes: socket.socket, links: socket.socket | None, nft: socket.socket | None
    ) -> None:
        socks = [s for s in (routes, links, nft) if s is not None]
        lost = LostInterfaces()
        kinds = self._read(ready, routes, links, nft, lost)
        time.sleep(SETTLE)
        kinds |= self._read(select.select(socks, [], [], 0)[0], routes, links, nft, lost)  # the burst's rest
        if kinds:
            self.on_change(kinds)
        if lost and self.on_lost is not None:
            self.on_lost(lost)

    def _read(
        self,
        ready: Sequence[object],
        routes: socket.socket,
        links: socket.socket | None,
        nft: socket.socket | None,
        lost: LostInterfaces,
    ) -> set[str]:
        kinds: set[str] = set()
        for sock in (routes, links, nft):
            while sock is not None and sock in ready:
                try:
                    data = sock.recv(1 << 16, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    break
                except OSError as e:  # ENOBUFS: messages were lost; look at everything
                    log.warning("kernel notifications overflowed (%s): checking everything", e)
                    kinds |= {"route", *NFT_KINDS}
                    lost.every = True
                    break
                if sock is nft:
                    kinds |= NFT_KINDS
                elif sock is links:
                    found = self.view.feed(data)
                    lost.gone |= found.gone
                    lost.damaged |= found.damaged
                elif _deleted_routes(data, self.route_protocol):
                    kinds.add("route")
        return kinds
