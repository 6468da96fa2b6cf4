"""The netlink wire format netplugin speaks: constants, structs, attribute packing, the message walk.

What :mod:`netplugin.core.netlink` sends and reads (links, veths, addresses, routes), and what the
kernel watch (:mod:`netplugin.nodenet.kernelwatch`) subscribes to and parses, under the kernel's own
names. Packing is plain :mod:`struct`; nothing here touches a socket.
"""

from __future__ import annotations

import errno
import socket
import struct
from collections.abc import Iterator

__all__ = [
    "HAIRPIN",
    "IFADDR",
    "IFA_ADDRESS",
    "IFA_F_NODAD",
    "IFA_LOCAL",
    "IFF_UP",
    "IFINFO",
    "IFLA_ADDRESS",
    "IFLA_AF_SPEC",
    "IFLA_BRPORT_MODE",
    "IFLA_GROUP",
    "IFLA_IFNAME",
    "IFLA_INET6_ADDR_GEN_MODE",
    "IFLA_INFO_DATA",
    "IFLA_INFO_KIND",
    "IFLA_INFO_SLAVE_DATA",
    "IFLA_INFO_SLAVE_KIND",
    "IFLA_LINK",
    "IFLA_LINKINFO",
    "IFLA_LINK_NETNSID",
    "IFLA_MASTER",
    "IFLA_MTU",
    "IFLA_NET_NS_FD",
    "IFLA_PROTINFO",
    "NETLINK_ADD_MEMBERSHIP",
    "NETLINK_NETFILTER",
    "NETNSA_FD",
    "NETNSA_NSID",
    "NFNLGRP_NFTABLES",
    "NLA_F_NESTED",
    "NLHDR",
    "NLMSG_DONE",
    "NLMSG_ERROR",
    "NLM_F_ACK",
    "NLM_F_CREATE",
    "NLM_F_DUMP",
    "NLM_F_EXCL",
    "NLM_F_REPLACE",
    "NLM_F_REQUEST",
    "NO_LINK_LOCAL",
    "RTA_GATEWAY",
    "RTA_OIF",
    "RTA_TABLE",
    "RTGENMSG",
    "RTMSG",
    "RTM_DELADDR",
    "RTM_DELLINK",
    "RTM_DELQDISC",
    "RTM_DELROUTE",
    "RTM_GETADDR",
    "RTM_GETLINK",
    "RTM_GETNSID",
    "RTM_GETROUTE",
    "RTM_NEWADDR",
    "RTM_NEWLINK",
    "RTM_NEWROUTE",
    "RTNLGRP_IPV4_IFADDR",
    "RTNLGRP_IPV4_ROUTE",
    "RTNLGRP_IPV6_IFADDR",
    "RTNLGRP_IPV6_ROUTE",
    "RTNLGRP_LINK",
    "RTNLGRP_TC",
    "RTN_NAMES",
    "RTN_UNICAST",
    "RTPROT_BOOT",
    "RT_SCOPE_UNIVERSE",
    "RT_TABLE_MAIN",
    "S32",
    "SOL_NETLINK",
    "TCMSG",
    "U32",
    "VETH_INFO_PEER",
    "attr",
    "find_attr",
    "ifinfo",
    "messages",
    "str_attr",
    "u32_attr",
]

U32 = struct.Struct("=I")
S32 = struct.Struct("=i")  # an nlmsgerr's error, a namespace id

# message types and flags (linux/netlink.h, linux/rtnetlink.h)
NLMSG_ERROR = 2
NLMSG_DONE = 3
RTM_NEWLINK = 16
RTM_DELLINK = 17
RTM_GETLINK = 18
RTM_NEWADDR = 20
RTM_DELADDR = 21
RTM_GETADDR = 22
RTM_NEWROUTE = 24
RTM_DELROUTE = 25
RTM_GETROUTE = 26
RTM_DELQDISC = 37
RTM_GETNSID = 90
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLM_F_DUMP = 0x300
NLM_F_REPLACE = 0x100
NLM_F_EXCL = 0x200
NLM_F_CREATE = 0x400
NLA_F_NESTED = 0x8000

# subscriptions (linux/netlink.h, linux/rtnetlink.h, linux/netfilter/nfnetlink.h)
NETLINK_NETFILTER = 12
SOL_NETLINK = 270
NETLINK_ADD_MEMBERSHIP = 1
RTNLGRP_LINK = 1
RTNLGRP_TC = 4
RTNLGRP_IPV4_IFADDR = 5
RTNLGRP_IPV4_ROUTE = 7
RTNLGRP_IPV6_IFADDR = 9
RTNLGRP_IPV6_ROUTE = 11
NFNLGRP_NFTABLES = 7

# links (linux/if.h, linux/if_link.h, linux/veth.h)
IFF_UP = 1
IFLA_ADDRESS = 1
IFLA_IFNAME = 3
IFLA_MTU = 4
IFLA_LINK = 5
IFLA_MASTER = 10
IFLA_PROTINFO = 12  # an AF_BRIDGE message's port flags (IFLA_BRPORT_*)
IFLA_LINKINFO = 18
IFLA_AF_SPEC = 26
IFLA_GROUP = 27
IFLA_NET_NS_FD = 28
IFLA_LINK_NETNSID = 37  # the namespace id of a veth's peer, as this namespace numbers it
NETNSA_NSID = 1
NETNSA_FD = 3
IFLA_INFO_KIND = 1
IFLA_INFO_DATA = 2
IFLA_INFO_SLAVE_KIND = 4
IFLA_INFO_SLAVE_DATA = 5
IFLA_BRPORT_MODE = 4  # hairpin
IFLA_INET6_ADDR_GEN_MODE = 8  # IN6_ADDR_GEN_MODE_NONE = 1: no link-local address
VETH_INFO_PEER = 1

# addresses and routes (linux/if_addr.h, linux/rtnetlink.h)
IFA_ADDRESS = 1
IFA_LOCAL = 2
IFA_F_NODAD = 0x02
RTA_OIF = 4
RTA_GATEWAY = 5
RTA_TABLE = 15
RT_TABLE_MAIN = 254
RT_SCOPE_UNIVERSE = 0
RTPROT_BOOT = 3  # what `ip route` uses: routes look the same whichever bridge plugin made them
RTN_UNICAST = 1
#: the other route types a route lookup may answer with, by name (linux/rtnetlink.h)
RTN_NAMES = {3: "broadcast", 6: "blackhole", 7: "unreachable", 8: "prohibit", 9: "throw"}

# headers: nlmsghdr, ifinfomsg, ifaddrmsg, rtmsg, tcmsg
NLHDR = struct.Struct("=IHHII")
IFINFO = struct.Struct("=BxHiII")
IFADDR = struct.Struct("=BBBBI")
RTMSG = struct.Struct("=BBBBBBBBI")  # family, dst_len, src_len, tos, table, protocol, scope, type, flags
TCMSG = struct.Struct("=BxxxiIII")  # family, ifindex, handle, parent, info
RTGENMSG = b"\x00\x00\x00\x00"  # struct rtgenmsg (AF_UNSPEC), padded to 4 bytes


def messages(data: bytes, *, strict: bool = False) -> Iterator[tuple[int, int, int, bytes]]:
    """``(type, flags, seq, payload)`` of each netlink message in ``data`` (what one recv read), in order.

    A header that claims less than itself or runs past ``data`` ends the walk: quietly for the
    kernel's notifications (the messages before it are still read), as ``OSError(EPROTO)`` with
    ``strict`` (an answer to a request of ours, which must be whole).
    """
    offset = 0
    while offset + NLHDR.size <= len(data):
        length, kind, flags, seq, _pid = NLHDR.unpack_from(data, offset)
        if length < NLHDR.size or offset + length > len(data):
            if strict:
                raise OSError(errno.EPROTO, "malformed netlink reply")
            return
        yield kind, flags, seq, data[offset + NLHDR.size : offset + length]
        offset += (length + 3) & ~3


def attr(kind: int, payload: bytes) -> bytes:
    n = 4 + len(payload)
    return struct.pack("=HH", n, kind) + payload + b"\0" * (-n & 3)


def str_attr(kind: int, value: str) -> bytes:
    return attr(kind, value.encode() + b"\0")


def u32_attr(kind: int, value: int) -> bytes:
    return attr(kind, U32.pack(value))


def find_attr(payload: bytes, offset: int, kind: int) -> bytes | None:
    while offset + 4 <= len(payload):
        length, akind = struct.unpack_from("=HH", payload, offset)
        if length < 4:
            return None
        if akind & 0x3FFF == kind:
            return payload[offset + 4 : offset + length]
        offset += (length + 3) & ~3
    return None


def ifinfo(index: int = 0, flags: int = 0, change: int = 0) -> bytes:
    return IFINFO.pack(0, 0, index, flags, change)


#: IFLA_LINKINFO of "bridge_slave hairpin on"
HAIRPIN = str_attr(IFLA_INFO_SLAVE_KIND, "bridge") + attr(IFLA_INFO_SLAVE_DATA, attr(IFLA_BRPORT_MODE, b"\x01"))

#: IFLA_AF_SPEC of "addrgenmode none": the link gets no IPv6 link-local address
NO_LINK_LOCAL = attr(IFLA_AF_SPEC, attr(socket.AF_INET6, attr(IFLA_INET6_ADDR_GEN_MODE, b"\x01")))
