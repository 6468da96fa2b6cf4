"""A hand-packed NETLINK_ROUTE client: links, veths, addresses and routes, in one sendmsg.

Generic kernel plumbing that any layer may use; the native bridge is its user per pod. Every
per-pod request is packed by hand with struct: pyroute2 0.9 spends far more Python time per
request (message classes, an asyncio loop) than the kernel needs, and it cannot send
several requests in one sendmsg. pyroute2 is still used where speed does not matter (init).
Each thread keeps one root-netns socket (:func:`root_netlink`).
"""

from __future__ import annotations

import errno
import os
import socket
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from netplugin.core.netns import netns_socket
from netplugin.core.nlwire import (
    HAIRPIN,
    IFA_ADDRESS,
    IFA_F_NODAD,
    IFA_LOCAL,
    IFADDR,
    IFF_UP,
    IFINFO,
    IFLA_ADDRESS,
    IFLA_GROUP,
    IFLA_IFNAME,
    IFLA_INFO_DATA,
    IFLA_INFO_KIND,
    IFLA_LINK,
    IFLA_LINKINFO,
    IFLA_MASTER,
    IFLA_MTU,
    IFLA_NET_NS_FD,
    NLHDR,
    NLM_F_ACK,
    NLM_F_CREATE,
    NLM_F_DUMP,
    NLM_F_EXCL,
    NLM_F_REPLACE,
    NLM_F_REQUEST,
    NLMSG_DONE,
    NLMSG_ERROR,
    NO_LINK_LOCAL,
    RT_SCOPE_UNIVERSE,
    RT_TABLE_MAIN,
    RTA_GATEWAY,
    RTA_OIF,
    RTA_TABLE,
    RTM_DELLINK,
    RTM_GETADDR,
    RTM_GETLINK,
    RTM_GETROUTE,
    RTM_NEWADDR,
    RTM_NEWLINK,
    RTM_NEWROUTE,
    RTMSG,
    RTN_UNICAST,
    RTPROT_BOOT,
    S32,
    U32,
    VETH_INFO_PEER,
    attr,
    find_attr,
    ifinfo,
    messages,
    str_attr,
    u32_attr,
)

__all__ = [
    "IFF_UP",
    "RETIRED_BASE",
    "KernelError",
    "RawNetlink",
    "Step",
    "drop_root_netlink",
    "netns_netlink",
    "pod_steps",
    "retired_by",
    "retired_group",
    "root_netlink",
    "veth_steps",
]

#: Requests per sendmsg: keeps the kernel's replies well inside the socket's receive buffer.
_CHUNK = 128
#: The link groups of links netplugin has taken off the network (down) and is deleting: a pod's
#: teardown answers before the kernel's deletion (its RCU grace periods) is over. Each process
#: retires into a group of its own, this base ORed with its pid, and deletes that group: processes
#: never delete each other's, and gc knows a crash left a link when its group's process is gone.
#: Bit 31 set: never one of :meth:`RawNetlink.delete_links`' batch groups.
RETIRED_BASE = 0x8E000000
_PID_MASK = 0x3FFFFF  # pid_max is at most 2**22


def retired_group(pid: int | None = None) -> int:
    """The link group that process ``pid`` (default: this one) retires links into."""
    return RETIRED_BASE | ((os.getpid() if pid is None else pid) & _PID_MASK)


def retired_by(group: int) -> int | None:
    """The pid of the process that retired links into ``group``, or None when it is no retired group."""
    return group & _PID_MASK if group & ~_PID_MASK == RETIRED_BASE else None


def _address_and_route(
    index: int, ip: str, prefixlen: int, gateway: str
) -> tuple[tuple[str, tuple[int, int, bytes]], tuple[str, tuple[int, int, bytes]]]:
    """The requests (each with what it does) that give link ``index`` the address ``ip/prefixlen``
    (IPv6: ``nodad``) and add the default route via ``gateway`` (never ``replace``)."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    raw = socket.inet_pton(family, ip)
    flags = IFA_F_NODAD if family == socket.AF_INET6 else 0
    address = (
        f"add address {ip}/{prefixlen}",
        (
            RTM_NEWADDR,
            NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE,
            IFADDR.pack(family, prefixlen, flags, 0, index) + attr(IFA_LOCAL, raw) + attr(IFA_ADDRESS, raw),
        ),
    )
    route = (
        f"add default route via {gateway}",
        (
            RTM_NEWROUTE,
            NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
            RTMSG.pack(family, 0, 0, 0, RT_TABLE_MAIN, RTPROT_BOOT, 0, RTN_UNICAST, 0)
            + attr(RTA_GATEWAY, socket.inet_pton(family, gateway))
            + u32_attr(RTA_OIF, index),
        ),
    )
    return address, route


Step = tuple[str, tuple[int, int, bytes]]


def veth_steps(name: str, peer: str, netns_fd: int, mtu: int, master: int, *, peer_index: int = 0) -> list[Step]:
    """The requests of :meth:`RawNetlink.add_veth`, each with what it does (a caller may pipeline
    several pods' in one sendmsg: the kernel floor of the benchmark does). ``peer_index``: the
    ifindex the peer gets in its namespace (0: the kernel's choice)."""
    peer_msg = (
        ifinfo(peer_index) + str_attr(IFLA_IFNAME, peer) + u32_attr(IFLA_NET_NS_FD, netns_fd) + u32_attr(IFLA_MTU, mtu)
    )
    linkinfo = str_attr(IFLA_INFO_KIND, "veth") + attr(IFLA_INFO_DATA, attr(VETH_INFO_PEER, peer_msg))
    create = (
        ifinfo()
        + str_attr(IFLA_IFNAME, name)
        + u32_attr(IFLA_MTU, mtu)
        + u32_attr(IFLA_MASTER, master)
        + attr(IFLA_LINKINFO, linkinfo)
    )
    by_name = ifinfo() + str_attr(IFLA_IFNAME, name)
    return [
        (f"add veth {name}", (RTM_NEWLINK, NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, create)),
        (f"set addr_gen_mode none on {name}", (RTM_NEWLINK, NLM_F_ACK, by_name + NO_LINK_LOCAL)),
        (f"set hairpin on {name}", (RTM_NEWLINK, NLM_F_ACK, by_name + attr(IFLA_LINKINFO, HAIRPIN))),
        (f"set {name} up", (RTM_NEWLINK, NLM_F_ACK, ifinfo(0, IFF_UP, IFF_UP) + str_attr(IFLA_IFNAME, name))),
    ]


def pod_steps(index: int, addrs: Sequence[tuple[str, int, str]], *, link_local: bool) -> list[Step]:
    """The requests of :meth:`RawNetlink.configure_pod`, in its order: lo up, the addresses, (without
    ``link_local``) ``addr_gen_mode none``, link up, then one default route per address, last."""
    steps: list[Step] = [("set lo up", (RTM_NEWLINK, NLM_F_ACK, ifinfo(1, IFF_UP, IFF_UP)))]  # lo is ifindex 1
    routes: list[Step] = []
    for ip, prefixlen, gateway in addrs:
        address, route = _address_and_route(index, ip, prefixlen, gateway)
        steps.append(address)
        routes.append(route)
    if not link_local:
        steps.append(("set addr_gen_mode none", (RTM_NEWLINK, NLM_F_ACK, ifinfo(index) + NO_LINK_LOCAL)))
    steps.append(("set link up", (RTM_NEWLINK, NLM_F_ACK, ifinfo(index, IFF_UP, IFF_UP))))
    return steps + routes


class KernelError(OSError):
    """The kernel refused a netlink request (the socket itself is fine)."""


class RawNetlink:
    """NETLINK_ROUTE requests without pyroute2: one socket, replies matched by sequence number."""

    def __init__(self, sock: socket.socket | None = None, *, timeout: float = 30.0) -> None:
        self.sock = sock or socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, 0)
        try:
            self.sock.settimeout(timeout)
            self.sock.bind((0, 0))
        except BaseException:
            self.sock.close()
            raise
        self._seq = int.from_bytes(os.urandom(4), "little") >> 2

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawNetlink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _next_seq(self) -> int:
        self._seq = (self._seq + 1) & 0xFFFFFFFF or 1
        return self._seq

    def transact(self, requests: Sequence[tuple[int, int, bytes]]) -> list[tuple[int, bytes]]:
        """Send ``(type, flags, body)`` requests, several per sendmsg; ``(errno, answer)`` for each.

        Each request must draw exactly one reply: an ack (NLM_F_ACK), an error, or the answer
        of a non-dump get (then errno is 0 and the answer is its payload).
        """
        out: list[tuple[int, bytes]] = []
        for start in range(0, len(requests), _CHUNK):
            chunk = requests[start : start + _CHUNK]
            seqs: list[int] = []
            parts: list[bytes] = []
            for kind, flags, body in chunk:
                seq = self._next_seq()
                seqs.append(seq)
                parts.append(NLHDR.pack(NLHDR.size + len(body), kind, flags | NLM_F_REQUEST, seq, 0) + body)
            self.sock.send(b"".join(parts))
            pending = {seq: i for i, seq in enumerate(seqs)}
            results: list[tuple[int, bytes]] = [(0, b"")] * len(chunk)
            while pending:
                for kind, _flags, seq, payload in self._receive():
                    i = pending.pop(seq, None)
                    if i is None:
                        continue  # a late reply to an abandoned request
                    if kind == NLMSG_ERROR:
                        results[i] = (-S32.unpack_from(payload)[0], b"")
                    else:
                        results[i] = (0, payload)
            out.extend(results)
        return out

    def request(self, kind: int, flags: int, body: bytes, what: str) -> bytes:
        """One request; raises KernelError naming ``what`` when the kernel refuses it."""
        err, answer = self.transact([(kind, flags, body)])[0]
        if err:
            raise KernelError(err, f"{what}: {os.strerror(err)}")
        return answer

    def dump(self, kind: int, body: bytes, what: str) -> Iterator[bytes]:
        """The payloads of a dump request's answers."""
        seq = self._next_seq()
        self.sock.send(NLHDR.pack(NLHDR.size + len(body), kind, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body)
        while True:
            for rkind, _flags, rseq, payload in self._receive():
                if rseq != seq:
                    continue
                if rkind == NLMSG_DONE:
                    return
                if rkind == NLMSG_ERROR:
                    err = -S32.unpack_from(payload)[0]
                    if err:
                        raise KernelError(err, f"{what}: {os.strerror(err)}")
                    return
                yield payload

    def _receive(self) -> list[tuple[int, int, int, bytes]]:
        return list(messages(self.sock.recv(1 << 16), strict=True))

    # --- the requests the plugin makes --------------------------------------------------------------

    def link(self, ifname: str) -> tuple[int, int | None] | None:
        """``(ifindex, IFLA_LINK)`` of ``ifname``, or None when there is no such link.

        For a veth, IFLA_LINK is the peer's ifindex (in the peer's namespace).
        """
        found = self.link_info(ifname)
        return found[:2] if found is not None else None

    def link_info(self, ifname: str) -> tuple[int, int | None, str | None] | None:
        """``(ifindex, IFLA_LINK, MAC address)`` of ``ifname`` (see :meth:`link`), or None when absent.

        The MAC is ``aa:bb:cc:dd:ee:ff`` (None for a link without a 6-byte address).
        """
        err, answer = self.transact([(RTM_GETLINK, 0, ifinfo() + str_attr(IFLA_IFNAME, ifname))])[0]
        if err == errno.ENODEV:
            return None
        if err:
            raise KernelError(err, f"get link {ifname}: {os.strerror(err)}")
        index = int(IFINFO.unpack_from(answer)[2])
        peer = find_attr(answer, IFINFO.size, IFLA_LINK)
        addr = find_attr(answer, IFINFO.size, IFLA_ADDRESS)
        mac = ":".join(f"{b:02x}" for b in addr) if addr is not None and len(addr) == 6 else None
        return index, (int(U32.unpack_from(peer)[0]) if peer is not None and len(peer) >= 4 else None), mac

    def up_bridge(self, ifname: str) -> int | None:
        """The ifindex of ``ifname`` when it is a bridge and up, else None (absent, down, another kind)."""
        err, answer = self.transact([(RTM_GETLINK, 0, ifinfo() + str_attr(IFLA_IFNAME, ifname))])[0]
        if err == errno.ENODEV:
            return None
        if err:
            raise KernelError(err, f"get link {ifname}: {os.strerror(err)}")
        _family, _type, index, flags, _change = IFINFO.unpack_from(answer)
        info = find_attr(answer, IFINFO.size, IFLA_LINKINFO)
        kind = find_attr(info, 0, IFLA_INFO_KIND) if info is not None else None
        return int(index) if flags & IFF_UP and kind is not None and kind.rstrip(b"\0") == b"bridge" else None

    def add_veth(self, name: str, peer: str, netns_fd: int, mtu: int, master: int) -> None:
        """A bridge port for a pod, in one sendmsg: ``ip link add NAME mtu MTU master M type veth peer
        name PEER mtu MTU netns FD``; ``addr_gen_mode none`` and ``hairpin on`` on NAME; NAME up.

        NAME is created down and gets no IPv6 link-local address (it is a bridge port: the bridge holds
        the node's addresses): otherwise its duplicate address detection, router solicitation and MLD
        reports are multicast frames the bridge floods to every port, a cost that grows with the pods
        present. Hairpin is set before the port is up, so no frame passes before it. When a step after
        the creation fails, NAME is deleted again before KernelError says which step failed.
        """
        steps = veth_steps(name, peer, netns_fd, mtu, master)
        by_name = ifinfo() + str_attr(IFLA_IFNAME, name)
        results = self.transact([r for _, r in steps])
        for n, ((what, _), (err, _answer)) in enumerate(zip(steps, results, strict=True)):
            if n == 1 and err == errno.EAFNOSUPPORT:
                continue  # IPv6 is disabled on this node (or for this link): no link-local address anyway
            if err:
                if n:
                    # The kernel carried on after the failed step (each request is separate): undo all.
                    self.transact([(RTM_DELLINK, NLM_F_ACK, by_name)])
                raise KernelError(err, f"{what}: {os.strerror(err)}")

    def attach(self, index: int, mtu: int, master: int) -> None:
        """``ip link set dev INDEX mtu MTU master M up``."""
        body = ifinfo(index, IFF_UP, IFF_UP) + u32_attr(IFLA_MTU, mtu) + u32_attr(IFLA_MASTER, master)
        self.request(RTM_NEWLINK, NLM_F_ACK, body, f"attach link {index}")

    def hairpin(self, index: int) -> None:
        """``ip link set dev INDEX type bridge_slave hairpin on``."""
        self.request(RTM_NEWLINK, NLM_F_ACK, ifinfo(index) + attr(IFLA_LINKINFO, HAIRPIN), "set hairpin")

    def configure_pod(self, index: int, addrs: Sequence[tuple[str, int, str]], *, link_local: bool = True) -> None:
        """lo up; per ``(ip, prefixlen, gateway)``: ``ip addr replace IP/PREFIXLEN`` (IPv6: ``nodad``);
        without ``link_local``, ``addr_gen_mode none`` (see below); link up; per family
        ``ip route add default via GATEWAY``: never ``replace``, so a default
        route netplugin did not make (the node's own, another pod's) is never taken over. One
        that exists already is accepted only when it is this very route (a repeated setup);
        otherwise KernelError EEXIST says whose it is.

        One sendmsg: the kernel runs the requests in order and acks each one. IPv6 addresses skip
        duplicate address detection, so they are usable as soon as this returns (the IPAM made
        them unique); otherwise they would be "tentative" for a second or two.

        ``link_local=False`` (a pod without IPv6) sets ``addr_gen_mode none`` before the link goes up:
        no IPv6 link-local address, so none of the multicast that comes with one (MLD reports,
        duplicate address detection, router solicitations), which a bridge without a multicast
        querier floods to every port. Tolerated where IPv6 is off (EAFNOSUPPORT: nothing to stop).
        """
        steps = pod_steps(index, addrs, link_local=link_local)
        no_ll = -1 if link_local else len(steps) - len(addrs) - 2
        gateways = {len(steps) - len(addrs) + i: gw for i, (_ip, _plen, gw) in enumerate(addrs)}
        for n, ((what, _), (err, _answer)) in enumerate(zip(steps, self.transact([r for _, r in steps]), strict=True)):
            if n == no_ll and err == errno.EAFNOSUPPORT:
                continue  # IPv6 is disabled on this node (or for this link): no link-local address anyway
            if err == errno.EEXIST and n in gateways:
                found = self.default_route(socket.AF_INET6 if ":" in gateways[n] else socket.AF_INET)
                if found == (gateways[n], index):
                    continue  # ours, from an earlier setup of this pod
                theirs = f"via {found[0]} dev {found[1]}" if found else "(unreadable)"
                why = f"the namespace already has a default route {theirs} not made by netplugin"
                raise KernelError(err, f"{what}: {why}")
            if err:
                raise KernelError(err, f"{what}: {os.strerror(err)}")

    def default_route(self, family: int) -> tuple[str, int] | None:
        """(gateway, output ifindex) of the main table's default route of ``family``, or None."""
        found: tuple[str, int] | None = None
        body = RTMSG.pack(family, 0, 0, 0, 0, 0, 0, 0, 0)
        for answer in self.dump(RTM_GETROUTE, body, "list routes"):
            fam, dst_len, _src, _tos, table, _proto, _scope, _type, _flags = RTMSG.unpack_from(answer)
            raw_table = find_attr(answer, RTMSG.size, RTA_TABLE)
            if raw_table is not None and len(raw_table) >= 4:
                table = U32.unpack_from(raw_table)[0]
            if found is not None or fam != family or dst_len != 0 or table != RT_TABLE_MAIN:
                continue  # keep reading: the dump must be drained
            gw = find_attr(answer, RTMSG.size, RTA_GATEWAY)
            oif = find_attr(answer, RTMSG.size, RTA_OIF)
            gateway = socket.inet_ntop(family, gw) if gw is not None else ""
            found = (gateway, U32.unpack_from(oif)[0] if oif is not None and len(oif) >= 4 else 0)
        return found

    def addresses(self, index: int) -> dict[int, str]:
        """``{4: first IPv4 address, 6: first global IPv6 address}`` of link ``index`` (those it has)."""
        found: dict[int, str] = {}
        for answer in self.dump(RTM_GETADDR, IFADDR.pack(socket.AF_UNSPEC, 0, 0, 0, 0), "list addresses"):
            family, _plen, _flags, scope, ifindex = IFADDR.unpack_from(answer)
            version = 4 if family == socket.AF_INET else 6 if family == socket.AF_INET6 else 0
            # Keep reading even when done: the dump must be drained. Link-local IPv6 is not the pod's.
            if ifindex != index or not version or version in found or scope != RT_SCOPE_UNIVERSE:
                continue
            raw = find_attr(answer, IFADDR.size, IFA_LOCAL) or find_attr(answer, IFADDR.size, IFA_ADDRESS)
            if raw is not None and len(raw) == (4 if version == 4 else 16):
                found[version] = socket.inet_ntop(family, raw)
        return found

    def retire(self, index: int) -> bool:
        """Take link ``index`` off the network now, for a deletion later: down (a veth's peer loses its
        carrier; a bridge port stops forwarding and forgets its addresses) and into this process's
        :func:`retired_group`. False when the link is gone already. Costs no RCU grace period, unlike
        the deletion."""
        body = ifinfo(index, 0, IFF_UP) + u32_attr(IFLA_GROUP, retired_group())
        err, _ = self.transact([(RTM_NEWLINK, NLM_F_ACK, body)])[0]
        if err == errno.ENODEV:
            return False
        if err:
            raise KernelError(err, f"retire link {index}: {os.strerror(err)}")
        return True

    def group_of(self, index: int) -> int | None:
        """The link group of link ``index``, or None when there is no such link."""
        err, answer = self.transact([(RTM_GETLINK, 0, ifinfo(index))])[0]
        if err == errno.ENODEV:
            return None
        if err:
            raise KernelError(err, f"get link {index}: {os.strerror(err)}")
        raw = find_attr(answer, IFINFO.size, IFLA_GROUP)
        return int(U32.unpack_from(raw)[0]) if raw is not None and len(raw) >= 4 else 0

    def retired(self) -> dict[int, tuple[str, int]]:
        """``{ifindex: (name, pid of the process that retired it)}`` of the retired links not deleted yet."""
        found: dict[int, tuple[str, int]] = {}
        for answer in self.dump(RTM_GETLINK, ifinfo(), "list links"):
            raw = find_attr(answer, IFINFO.size, IFLA_GROUP)
            pid = retired_by(U32.unpack_from(raw)[0]) if raw is not None and len(raw) >= 4 else None
            if pid is None:
                continue  # keep reading: the dump must be drained
            name = find_attr(answer, IFINFO.size, IFLA_IFNAME)
            found[int(IFINFO.unpack_from(answer)[2])] = (name.rstrip(b"\0").decode() if name else "?", pid)
        return found

    def delete_retired(self) -> None:
        """Delete every link this process retired, in one request (none left is no error)."""
        err, _ = self.transact([(RTM_DELLINK, NLM_F_ACK, ifinfo(0) + u32_attr(IFLA_GROUP, retired_group()))])[0]
        if err and err != errno.ENODEV:
            raise KernelError(err, f"delete the retired links: {os.strerror(err)}")

    def delete_links(self, indexes: Sequence[int]) -> dict[int, int]:
        """Delete links, all in one kernel request when there are several. ``{index: errno}`` of failures.

        A link that is already gone is not a failure. Several links are moved into a fresh random
        link group, and the group is deleted: the kernel then waits for one set of RCU grace
        periods instead of one per link.
        """
        if not indexes:
            return {}
        failed: dict[int, int] = {}
        todo = list(indexes)
        if len(todo) > 1:
            # Fresh per batch: a crash between the moves and the delete leaves links in a group no
            # later batch deletes; the group is never 0 (the default group cannot be deleted).
            group = 0x10000000 | int.from_bytes(os.urandom(4), "little") & 0x6FFFFFFF
            moved = []
            results = self.transact(
                [(RTM_NEWLINK, NLM_F_ACK, ifinfo(i) + u32_attr(IFLA_GROUP, group)) for i in todo]
            )
            for i, (err, _) in zip(todo, results, strict=True):
                if not err:
                    moved.append(i)
                elif err != errno.ENODEV:
                    failed[i] = err
            if not moved:
                return failed
            err, _ = self.transact([(RTM_DELLINK, NLM_F_ACK, ifinfo(0) + u32_attr(IFLA_GROUP, group))])[0]
            if err in (0, errno.ENODEV):  # ENODEV: another process deleted them meanwhile
                return failed
            todo = moved  # for example EOPNOTSUPP: fall back to one request per link
        for i, (err, _) in zip(
            todo, self.transact([(RTM_DELLINK, NLM_F_ACK, ifinfo(i)) for i in todo]), strict=True
        ):
            if err and err != errno.ENODEV:
                failed[i] = err
        return failed


class _ThreadSocket(threading.local):
    raw: RawNetlink | None = None


_tls = _ThreadSocket()


def root_netlink() -> RawNetlink:
    """This thread's long-lived root-netns netlink socket."""
    raw = _tls.raw
    if raw is None:
        raw = _tls.raw = RawNetlink()
    return raw


def drop_root_netlink() -> None:
    raw, _tls.raw = _tls.raw, None
    if raw is not None:
        raw.close()


@contextmanager
def netns_netlink(path: str) -> Iterator[RawNetlink]:
    """A netlink socket in the netns at ``path`` for the block (FileNotFoundError if there is none)."""
    with RawNetlink(netns_socket(path)) as nl:
        yield nl
