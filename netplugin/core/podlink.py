"""Whether a host interface a chain member reports is the pod's: a veth whose peer is in the pod's netns.

A member's setup document may name a ``hostInterface``; later members (``bandwidth``) shape it
and remove qdiscs from it, so a name that is the node's own (``eth0``, ``lo``) would have root
shape the node. netplugin passes a name on only when the kernel says it is a veth in this
namespace whose peer lives in the pod's network namespace: the veth's ``IFLA_LINK_NETNSID`` is
the id this namespace gives the pod's (``RTM_GETNSID`` of the netns file).
"""

from __future__ import annotations

import errno
import os

from netplugin.core.netlink import root_netlink
from netplugin.core.nlwire import (
    IFINFO,
    IFLA_IFNAME,
    IFLA_INFO_KIND,
    IFLA_LINK_NETNSID,
    IFLA_LINKINFO,
    NETNSA_FD,
    NETNSA_NSID,
    RTGENMSG,
    RTM_GETLINK,
    RTM_GETNSID,
    S32,
    find_attr,
    ifinfo,
    str_attr,
    u32_attr,
)

__all__ = ["pod_veth_problem"]



def _peer_nsid(ifname: str) -> tuple[str | None, int | None]:
    """(link kind, the peer's namespace id) of ``ifname`` in this namespace; KeyError when absent."""
    err, answer = root_netlink().transact([(RTM_GETLINK, 0, ifinfo() + str_attr(IFLA_IFNAME, ifname))])[0]
    if err in (errno.ENODEV, errno.EINVAL):
        raise KeyError(ifname)
    if err:
        raise OSError(err, f"get link {ifname}: {os.strerror(err)}")
    info = find_attr(answer, IFINFO.size, IFLA_LINKINFO)
    raw_kind = find_attr(info, 0, IFLA_INFO_KIND) if info is not None else None
    kind = raw_kind.rstrip(b"\0").decode("ascii", "replace") if raw_kind is not None else None
    nsid = find_attr(answer, IFINFO.size, IFLA_LINK_NETNSID)
    return kind, (S32.unpack_from(nsid)[0] if nsid is not None and len(nsid) >= 4 else None)


def _nsid_of(netns: str) -> int | None:
    """The id this namespace gives the network namespace at ``netns`` (None: none assigned, or no netns)."""
    fd = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
    try:
        err, answer = root_netlink().transact([(RTM_GETNSID, 0, RTGENMSG + u32_attr(NETNSA_FD, fd))])[0]
    finally:
        os.close(fd)
    if err:
        return None
    nsid = find_attr(answer, len(RTGENMSG), NETNSA_NSID)
    got = S32.unpack_from(nsid)[0] if nsid is not None and len(nsid) >= 4 else -1
    return got if got >= 0 else None


def pod_veth_problem(ifname: str, netns: str) -> str | None:
    """Why ``ifname`` is not a veth of this namespace whose peer is in the netns at ``netns`` (None: it is)."""
    try:
        kind, peer = _peer_nsid(ifname)
    except KeyError:
        return "no such interface on the node"
    if kind != "veth":
        return f"not a veth (a {kind} device)" if kind else "not a veth"
    if peer is None:
        return "a veth whose peer is not in another network namespace"
    try:
        pod = _nsid_of(netns)
    except OSError as e:
        return f"the pod's network namespace {netns} cannot be opened: {e.strerror or e}"
    if pod != peer:
        return f"a veth whose peer is not in the pod's network namespace {netns}"
    return None
