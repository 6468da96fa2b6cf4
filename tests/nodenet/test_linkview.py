"""Which interfaces lost something, from crafted rtnetlink messages (no kernel): losses, never gains.

Each case feeds a sequence of messages to a fresh :class:`LinkView` and compares what the last one
lost. The kernel tests (``test_chaos.py``) show the same against real notifications.
"""

from __future__ import annotations

import socket

import pytest

from netplugin.core.nlwire import (
    IFA_ADDRESS,
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
    NLA_F_NESTED,
    NLHDR,
    RTM_DELADDR,
    RTM_DELLINK,
    RTM_DELQDISC,
    RTM_NEWLINK,
    TCMSG,
    attr,
    str_attr,
    u32_attr,
)
from netplugin.nodenet.linkview import LinkView


def _msg(kind: int, body: bytes) -> bytes:
    return NLHDR.pack(NLHDR.size + len(body), kind, 0, 0, 0) + body


def link(index: int, name: str, *, master: int = 0, mtu: int = 1500, up: bool = True, hairpin: bool | None = None,
         kind: int = RTM_NEWLINK) -> bytes:  # fmt: skip
    attrs = str_attr(IFLA_IFNAME, name) + u32_attr(IFLA_MTU, mtu)
    if master:
        attrs += u32_attr(IFLA_MASTER, master)
    if hairpin is not None:
        attrs += attr(IFLA_LINKINFO, attr(IFLA_INFO_SLAVE_DATA, attr(IFLA_BRPORT_MODE, bytes([hairpin]))))
    return _msg(kind, IFINFO.pack(0, 0, index, IFF_UP if up else 0, 0) + attrs)


def brport(index: int, hairpin: bool) -> bytes:
    """An AF_BRIDGE RTM_NEWLINK (what sysfs's hairpin_mode or `bridge link set` sends)."""
    protinfo = attr(IFLA_PROTINFO | NLA_F_NESTED, attr(IFLA_BRPORT_MODE, bytes([hairpin])))
    return _msg(RTM_NEWLINK, IFINFO.pack(socket.AF_BRIDGE, 0, index, 0, 0) + protinfo)


def deladdr(index: int, address: str) -> bytes:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    raw = socket.inet_pton(family, address)
    return _msg(RTM_DELADDR, IFADDR.pack(family, 24, 0, 0, index) + attr(IFA_ADDRESS, raw))


def delqdisc(index: int, handle: int = 0x80010000) -> bytes:
    """RTM_DELQDISC of a root qdisc; handle 0 is the kernel's default one (noqueue, pfifo_fast)."""
    return _msg(RTM_DELQDISC, TCMSG.pack(0, index, handle, 0xFFFFFFFF, 0))


BRIDGE = link(1, "cbr0")
PORT = link(2, "veth-a", master=1, hairpin=True)
OTHER = link(3, "veth-b", master=1, hairpin=True)

CASES = {
    # gains: what every setup does
    "a link created": ([BRIDGE], set(), set()),
    "a port attached with hairpin": ([BRIDGE, link(2, "veth-a"), PORT], set(), set()),
    "hairpin turned on": ([BRIDGE, link(2, "veth-a", master=1, hairpin=False), PORT], set(), set()),
    "an address added elsewhere, a link-local one deleted": ([BRIDGE, PORT, deladdr(2, "fe80::1")], set(), set()),
    # losses
    "a port deleted": ([BRIDGE, PORT, link(2, "veth-a", kind=RTM_DELLINK)], {"veth-a"}, set()),
    "a port lost its master": ([BRIDGE, PORT, link(2, "veth-a")], set(), {"veth-a"}),
    "hairpin off (netlink)": ([BRIDGE, PORT, link(2, "veth-a", master=1, hairpin=False)], set(), {"veth-a"}),
    "hairpin off (sysfs)": ([BRIDGE, PORT, brport(2, False)], set(), {"veth-a"}),
    "the bridge deleted": ([BRIDGE, PORT, OTHER, link(1, "cbr0", kind=RTM_DELLINK)], {"cbr0"}, {"veth-a", "veth-b"}),
    # its ports detached in an earlier batch (a repair may have raced with the deletion): again
    "the bridge deleted after its ports left": (
        [BRIDGE, PORT, link(2, "veth-a"), link(1, "cbr0", kind=RTM_DELLINK)],
        {"cbr0"},
        {"veth-a"},
    ),
    "the bridge downed": ([BRIDGE, PORT, OTHER, link(1, "cbr0", up=False)], set(), {"veth-a", "veth-b"}),
    "the bridge's MTU changed": ([BRIDGE, PORT, link(1, "cbr0", mtu=1400)], set(), {"veth-a"}),
    "the bridge's gateway deleted": ([BRIDGE, PORT, deladdr(1, "10.1.0.1")], set(), {"veth-a"}),
    "the bridge's IPv6 gateway deleted": ([BRIDGE, PORT, deladdr(1, "fd00::1")], set(), {"veth-a"}),
    # the node resolves what it forwards to pods from it, and the kernel does not make it again
    "the bridge's link-local address deleted": ([BRIDGE, PORT, deladdr(1, "fe80::1")], set(), {"veth-a"}),
    "a port's qdisc deleted": ([BRIDGE, PORT, delqdisc(2)], set(), {"veth-a"}),
    "a port's ingress qdisc deleted": ([BRIDGE, PORT, delqdisc(2, 0xFFFF0000)], set(), {"veth-a"}),
    # a shaping setup's "tc qdisc replace ... root": the kernel deletes the default it replaces
    "a port's default qdisc replaced": ([BRIDGE, PORT, delqdisc(2, 0)], set(), set()),
    "an unknown link's qdisc deleted": ([BRIDGE, delqdisc(9)], set(), set()),
}


@pytest.mark.parametrize("case", CASES)
def test_what_a_message_lost(case: str) -> None:
    messages, gone, damaged = CASES[case]
    view = LinkView()
    for m in messages[:-1]:
        view.feed(m)
    lost = view.feed(messages[-1])
    assert (lost.gone, lost.damaged) == (gone, damaged)


def test_a_batch_of_messages_and_a_torn_one() -> None:
    view = LinkView()
    view.feed(BRIDGE + PORT + OTHER)  # one recv, several messages
    lost = view.feed(link(2, "veth-a") + link(3, "veth-b")[:20])  # the second cut short: ignored
    assert (lost.gone, lost.damaged) == (set(), {"veth-a"})
