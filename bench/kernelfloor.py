"""The kernel floor (K): the native bridge's per-pod kernel requests, as fast as one process can send them.

Per pod, exactly the requests ``netplugin.io/bridge`` makes (:func:`netplugin.core.netlink.veth_steps`
and :func:`~netplugin.core.netlink.pod_steps`, the same packers): the veth created with its peer
already in the pod netns (``eth0``), a port of the bridge, without an IPv6 link-local address,
hairpin on, up; then inside the pod netns lo up, the address, ``addr_gen_mode none``, eth0 up and
the default route. The native bridge sets no per-pod sysctl (hairpin is a netlink attribute; the
forwarding sysctls are init's), so neither does the floor.

What the floor leaves out is everything that is not the kernel's: no exec, no IPAM (the address
is the pod's index), no lock, no record, no lookup (the peer's ifindex in the fresh pod netns is
chosen in the request: 2, after lo), no answer to write.

* back to back (:meth:`KernelFloor.setup`): one pod after the other, each pod's root-netns requests
  in one sendmsg, then its netns socket and its pod-side requests in a second;
* burst (:meth:`KernelFloor.burst`): one thread, pipelined: every pod's root-netns requests in as
  few sendmsgs as fit (128 requests each), then per pod its netns socket and its pod-side requests.
  One thread: the kernel runs each request in the sender's context under RTNL, so a second sender
  adds no kernel throughput, only contention (the GIL's, RTNL's); measured, two threads on two
  CPUs were slower than one.

Everything runs inside the figure's node netns (the root socket is opened there); the pod netns
are the figure's, as for every contender.
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
import time
from collections.abc import Sequence

from netplugin.core.netlink import RawNetlink, pod_steps, veth_steps
from netplugin.core.netns import netns_socket, open_netns

from .contenders import Contender
from .context import Network
from .util import BenchError, Pod

__all__ = ["KERNEL_FLOOR_LABEL", "KernelFloor"]

KERNEL_FLOOR_LABEL = "kernel floor: the native bridge's netlink requests from one process, pipelined (no exec, no IPAM)"
#: the pod end's ifindex in a fresh pod netns (lo is 1): set in the request, so no lookup is needed
_PEER_INDEX = 2
_MTU = 1500


def _check(results: Sequence[tuple[int, bytes]], steps: Sequence[tuple[str, object]], pod: Pod) -> None:
    for (what, _), (err, _answer) in zip(steps, results, strict=True):
        if err:
            raise BenchError(f"K {pod.infra_id}: {what}: {os.strerror(err)}")


class KernelFloor(Contender):
    """K: the per-pod kernel work of the native bridge, back to back or pipelined."""

    key = "K"

    def __init__(self, net: Network, node: str) -> None:
        super().__init__(net)
        self.node = node  #: the node netns path: the bridge and the host ends live there
        self._bridge = 0
        self._hosts: dict[str, str] = {}
        self._prefixlen = net.subnet.prefixlen

    @property
    def label(self) -> str:
        return KERNEL_FLOOR_LABEL

    def start(self) -> None:
        n = self.net
        for argv in (["link", "add", n.bridge, "type", "bridge"],
                     ["addr", "add", f"{n.gateway}/{self._prefixlen}", "dev", n.bridge],
                     ["link", "set", n.bridge, "up"]):  # fmt: skip
            done = subprocess.run(["ip", "-n", os.path.basename(self.node), *argv], capture_output=True, text=True)
            if done.returncode != 0:
                raise BenchError(f"K: ip {' '.join(argv)}: {done.stderr.strip()}")
        with RawNetlink(netns_socket(self.node)) as root:
            found = root.link(n.bridge)
        if found is None:
            raise BenchError(f"K: bridge {n.bridge} not found in {self.node}")
        self._bridge = found[0]

    def _address(self, pod: Pod) -> str:
        # no IPAM: the pod's index picks its address (.2 upwards; the gateway is .1)
        hosts = self.net.subnet.num_addresses - 2
        return str(ipaddress.ip_address(int(self.net.subnet.network_address) + 2 + pod.index % (hosts - 1)))

    def _host(self, pod: Pod) -> str:
        name = f"{self.ctx.tag}k{self.ctx.next_id():05x}"
        self._hosts[pod.infra_id] = name
        return name

    def _pod_side(self, pod: Pod) -> None:
        steps = pod_steps(_PEER_INDEX, [(self._address(pod), self._prefixlen, self.net.gateway)], link_local=False)
        with RawNetlink(netns_socket(pod.netns)) as ns:
            _check(ns.transact([r for _, r in steps]), steps, pod)

    def setup(self, pod: Pod) -> None:
        fd = open_netns(pod.netns)
        try:
            steps = veth_steps(self._host(pod), "eth0", fd, _MTU, self._bridge, peer_index=_PEER_INDEX)
            with RawNetlink(netns_socket(self.node)) as root:
                _check(root.transact([r for _, r in steps]), steps, pod)
        finally:
            os.close(fd)
        self._pod_side(pod)

    def burst(self, pods: Sequence[Pod]) -> float:
        """Every pod's root-netns requests pipelined, then each pod's netns side; seconds."""
        t0 = time.perf_counter()
        fds: list[int] = []
        try:
            steps = []
            for p in pods:
                fds.append(open_netns(p.netns))
                steps.append(veth_steps(self._host(p), "eth0", fds[-1], _MTU, self._bridge, peer_index=_PEER_INDEX))
            with RawNetlink(netns_socket(self.node)) as root:
                results = root.transact([r for s in steps for _, r in s])
        finally:
            for fd in fds:
                os.close(fd)
        for i, (p, s) in enumerate(zip(pods, steps, strict=True)):
            _check(results[i * len(s) : (i + 1) * len(s)], s, p)
        for p in pods:
            self._pod_side(p)
        return time.perf_counter() - t0

    def back_to_back(self, pods: Sequence[Pod]) -> float:
        """Every pod set up in turn by one thread; seconds."""
        t0 = time.perf_counter()
        for p in pods:
            self.setup(p)
        return time.perf_counter() - t0

    def teardown(self, pod: Pod) -> None:
        self.drain([pod])

    def drain(self, pods: Sequence[Pod]) -> float:
        """The pods' host ends deleted in one request (a link group), as the native bridge's reaper does."""
        t0 = time.perf_counter()
        with RawNetlink(netns_socket(self.node)) as root:
            indexes = []
            for p in pods:
                name = self._hosts.pop(p.infra_id, None)
                found = root.link(name) if name else None
                if found is not None:
                    indexes.append(found[0])
            failed = root.delete_links(indexes)
        if failed:
            raise BenchError(f"K: deleting {len(failed)} link(s) failed: {sorted(set(failed.values()))}")
        return time.perf_counter() - t0
