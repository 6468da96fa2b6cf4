"""The floor (E): the netlink requests every contender needs, from the benchmark's own process."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from netplugin.core.netns import netns_socket

from .contenders import Contender
from .context import Network
from .util import Pod

__all__ = ["FloorContender"]


#: IFLA_AF_SPEC of an interface without an IPv6 link-local address (IN6_ADDR_GEN_MODE_NONE = 1): no
#: MLD, DAD or router solicitation from it, which a bridge without a querier floods to every port
_NO_LINK_LOCAL = {"attrs": [("AF_INET6", {"attrs": [("IFLA_INET6_ADDR_GEN_MODE", 1)]})]}


class FloorContender(Contender):
    """E: the netlink requests every contender needs, sent with pyroute2 from this process.

    Per pod: one RTM_NEWLINK creating the veth with its peer already in the pod netns, the host
    end enslaved, then without an IPv6 link-local address (``addr_gen_mode none``, as
    netplugin.io/bridge does on an IPv4 bridge) and up; hairpin through sysfs; a netlink socket
    opened inside the pod netns (the calling thread switches there for the ``socket()`` call
    only); lo up, eth0 without a link-local address, the address, eth0 up and the default route.
    Teardown is one RTM_DELLINK. The address is the pod's index: no IPAM, no lock, no state, no
    exec.
    """

    key = "E"
    concurrent = False

    def __init__(self, net: Network) -> None:
        super().__init__(net)
        self._ipr: Any = None
        self._bridge_index = 0
        self._hosts: dict[str, tuple[str, int, str]] = {}
        # every host address but the gateway's, handed out lowest first and reused after teardown
        self._free = [str(a) for a in net.subnet.hosts()][:0:-1]

    def start(self) -> None:
        from pyroute2 import IPRoute

        self._ipr = IPRoute(groups=0)
        ipr = self._ipr
        ipr.link("add", ifname=self.net.bridge, kind="bridge")
        self._bridge_index = ipr.link_lookup(ifname=self.net.bridge)[0]
        ipr.addr("add", index=self._bridge_index, address=self.net.gateway, prefixlen=self.net.subnet.prefixlen)
        ipr.link("set", index=self._bridge_index, state="up")

    @contextmanager
    def _in_netns(self, path: str) -> Iterator[Any]:
        from pyroute2 import IPRoute

        sock = netns_socket(path)
        ipr = IPRoute(fileno=sock.detach(), groups=0)
        try:
            yield ipr
        finally:
            ipr.close()

    def setup(self, pod: Pod) -> None:
        host = f"{self.ctx.tag}e{self.ctx.next_id():05x}"
        addr = self._free.pop()
        fd = os.open(pod.netns, os.O_RDONLY | os.O_CLOEXEC)
        try:
            self._ipr.link(
                "add", ifname=host, kind="veth", mtu=1500, master=self._bridge_index,
                peer={"ifname": "eth0", "net_ns_fd": fd, "mtu": 1500},
            )
        finally:
            os.close(fd)
        index = self._ipr.link_lookup(ifname=host)[0]
        self._ipr.link("set", index=index, IFLA_AF_SPEC=_NO_LINK_LOCAL)
        self._ipr.link("set", index=index, state="up")
        with open(f"/sys/class/net/{host}/brport/hairpin_mode", "w") as f:
            f.write("1")
        self._hosts[pod.infra_id] = (host, index, addr)
        with self._in_netns(pod.netns) as ns:
            ns.link("set", index=1, state="up")
            eth0 = ns.link_lookup(ifname="eth0")[0]
            ns.link("set", index=eth0, IFLA_AF_SPEC=_NO_LINK_LOCAL)
            ns.addr("add", index=eth0, address=addr, prefixlen=self.net.subnet.prefixlen)
            ns.link("set", index=eth0, state="up")
            ns.route("add", dst="default", gateway=self.net.gateway)

    def teardown(self, pod: Pod) -> None:
        _host, index, addr = self._hosts.pop(pod.infra_id)
        self._ipr.link("del", index=index)
        self._free.append(addr)

    def burst(self, pods: Sequence[Pod]) -> float:
        # One process, one thread: the floor has no concurrency to offer; this is back to back.
        t0 = time.perf_counter()
        for p in pods:
            self.setup(p)
        return time.perf_counter() - t0

    def drain_group(self, pods: Sequence[Pod]) -> float:
        """Every host veth into one link group, then one RTM_DELLINK for the group."""
        group = 0x4E500000 + (self.ctx.next_id() & 0xFFFFF)
        t0 = time.perf_counter()
        for p in pods:
            _host, index, addr = self._hosts.pop(p.infra_id)
            self._ipr.link("set", index=index, group=group)
            self._free.append(addr)
        self._ipr.link("del", group=group)
        return time.perf_counter() - t0

    def stop(self) -> None:
        if self._ipr is not None:
            self._ipr.close()
            self._ipr = None

