"""``netplugin.io/bridge``: the bridge plugin, in process.

The same network and the same files as the bash plugin ``exec_plugins/bridge/bridge``: one
Linux bridge with the gateway address; per pod a veth pair whose host end (named
:func:`host_veth_name` of the infra id) is a bridge port with hairpin on and whose pod end
(``eth0``) is created directly inside the pod's network namespace, with an address from
:mod:`netplugin.ipam` and a default route via the gateway. Settings, their validation and
messages, the state dir layout and the veth names are identical, so a node can switch
between the two plugins (or run both: they share the IPAM lock) without losing a pod.

Settings, rising precedence: built-in defaults < ``bridge.conf`` of the bash plugin when it
is installed as ``<plugin_dir>/bridge/`` < the file named by ``NETPLUGIN_BRIDGE_CONF`` <
``NETPLUGIN_BRIDGE_*`` in the call's environment (an empty value means unset). Keys: NAME
(cbr0), SUBNET (10.244.0.0/24), GATEWAY (first host), MTU (1500), STATE_DIR
(``$NETPLUGIN_STATE_DIR/bridge``), IFNAME (eth0), IP_FORWARD (true).

This module is imported only when the plugin is selected. Choices, from measurements
(``tests/kernel/test_native.py::test_measure_per_pod_costs`` prints the current numbers):

* **Per-pod requests are packed by hand** (:class:`RawNetlink`, ``struct``): pyroute2 0.9
  spends ~0.5 ms of Python per request (message classes, an asyncio loop per call) where the
  kernel needs 10-50 us, and cannot send several requests in one ``sendmsg``. A setup is one
  veth request in the root netns, one lookup and one 4-request batch in the pod netns, and a
  few sysfs reads: ~2.5-4 ms per pod, against ~8 ms with pyroute2's API and ~15-20 ms for the
  bash plugin. pyroute2 still does init (rare; readability wins there).
* **Namespaced sockets without a fork**: only the calling thread enters the pod netns with
  ``setns(2)``, for the one ``socket()`` call, and switches back at once; the socket stays in
  the netns it was made in. ``IPRoute(netns=...)`` forks a helper (6-8 ms, and unsafe with
  threads); pyroute2's ``pushns`` saves ``/proc/self`` (the main thread's netns, not the
  caller's), keeps one stack for all threads and creates a missing netns.
* **Teardown coalesces link deletions** (:class:`LinkReaper`). Deleting a link costs ~16 ms of
  kernel time (RCU grace periods), whichever way it is sent: several RTM_DELLINK in one
  ``sendmsg`` cost the same per link. Deleting a *link group* costs about as much as deleting
  one link, so concurrent teardowns queue their host veth and one of them moves every queued
  link into a fresh random group and deletes the group: 100 concurrent teardowns take ~0.1 s
  of deletion instead of ~1.6 s. ``teardown`` returns only once its link is gone and its
  address released.

Threads: every method may be called from many threads at once. Each thread keeps one
root-netns netlink socket; the pod's lock is the caller's business (netplugin's manager
serialises actions per pod), the IPAM has its own.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import re
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import NetpluginError, PluginError, PluginFailed, PluginTimeout
from .ipam import IPAM
from .names import PodRef
from .plugin import CallContext, PodNetworkStatus

if TYPE_CHECKING:
    from .config import Config

__all__ = [
    "PLUGIN_NAME",
    "BridgeError",
    "BridgeSettings",
    "KernelError",
    "LinkReaper",
    "NativeBridgePlugin",
    "RawNetlink",
    "SettingsError",
    "host_veth_name",
    "load_settings",
    "netns_netlink",
    "netns_socket",
    "root_netlink",
]

PLUGIN_NAME = "netplugin.io/bridge"
_KEYS = ("NAME", "SUBNET", "GATEWAY", "MTU", "STATE_DIR", "IFNAME", "IP_FORWARD")
_IFNAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,14}\Z")
_IFF_UP = 1
_CLONE_NEWNET = 0x40000000


# --- names and settings ---------------------------------------------------------------------------


def host_veth_name(infra_id: str) -> str:
    """``np`` + the first 12 hex digits of FNV-1a-64 of the infra id (the bash plugin's rule)."""
    h = 0xCBF29CE484222325
    for b in infra_id.encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"np{h:016x}"[:14]


class BridgeError(NetpluginError):
    """The bridge plugin cannot do what was asked; the message says why (as the bash plugin's would)."""


class SettingsError(BridgeError):
    """A bridge setting is invalid; the message names the variable (or file and line)."""


@dataclass(frozen=True, slots=True)
class BridgeSettings:
    """Validated settings; build with :func:`load_settings` (``load_settings({})`` are the defaults)."""

    name: str
    subnet: ipaddress.IPv4Network
    gateway: ipaddress.IPv4Address
    mtu: int
    state_dir: str
    ifname: str
    ip_forward: bool

    @property
    def ipam_dir(self) -> str:
        return os.path.join(self.state_dir, self.name)

    def to_env(self) -> dict[str, str]:
        """The settings as the bash plugin's ``config`` action prints them."""
        return {
            "NETPLUGIN_BRIDGE_NAME": self.name,
            "NETPLUGIN_BRIDGE_SUBNET": str(self.subnet),
            "NETPLUGIN_BRIDGE_GATEWAY": str(self.gateway),
            "NETPLUGIN_BRIDGE_MTU": str(self.mtu),
            "NETPLUGIN_BRIDGE_STATE_DIR": self.state_dir,
            "NETPLUGIN_BRIDGE_IFNAME": self.ifname,
            "NETPLUGIN_BRIDGE_IP_FORWARD": "true" if self.ip_forward else "false",
        }


def _read_conf_file(path: str, into: dict[str, str]) -> None:
    """KEY=VALUE lines, parsed exactly like the bash plugin does (never executed)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        raise SettingsError(f"settings file {path} does not exist or is not readable") from None
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip("\r").strip()
        if not line or line.startswith("#"):
            continue
        if "=" not in line:
            raise SettingsError(f"{path}:{n}: expected KEY=VALUE, got '{line}'")
        key, value = line.split("=", 1)
        key = key.rstrip()
        value = value.lstrip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        short = key.removeprefix("NETPLUGIN_BRIDGE_")
        if short not in _KEYS:
            raise SettingsError(
                f"{path}:{n}: unknown key '{key}' (known: {', '.join(_KEYS)}, optionally prefixed NETPLUGIN_BRIDGE_)"
            )
        into[short] = value


def _parse_ip(value: str) -> ipaddress.IPv4Address | None:
    try:
        return ipaddress.IPv4Address(value)
    except ValueError:
        return None


def load_settings(env: Mapping[str, str], conf_files: Sequence[str] = ()) -> BridgeSettings:
    """Settings from the defaults, ``conf_files`` (in rising precedence) and ``env``.

    Validation and messages follow the bash plugin's ``validate_settings``.
    """
    raw: dict[str, str] = {
        "NAME": "cbr0",
        "SUBNET": "10.244.0.0/24",
        "GATEWAY": "",
        "MTU": "1500",
        "STATE_DIR": (env.get("NETPLUGIN_STATE_DIR") or "/var/lib/netplugin") + "/bridge",
        "IFNAME": "eth0",
        "IP_FORWARD": "true",
    }
    for path in conf_files:
        _read_conf_file(path, raw)
    for key in _KEYS:
        value = env.get("NETPLUGIN_BRIDGE_" + key)
        if value:
            raw[key] = value

    def bad(key: str, reason: str) -> SettingsError:
        return SettingsError(f"invalid NETPLUGIN_BRIDGE_{key} '{raw[key]}': {reason}")

    for key in ("NAME", "IFNAME"):
        if not _IFNAME.match(raw[key]):
            raise bad(key, "1-15 characters of letters, digits, '_', '.', '-'")

    addr_text, sep, plen_text = raw["SUBNET"].partition("/")
    addr = _parse_ip(addr_text)
    if not sep or addr is None or not re.fullmatch(r"[0-9]{1,2}", plen_text):
        raise bad("SUBNET", "expected an IPv4 network like 10.244.0.0/24")
    prefix = int(plen_text, 10)
    if not 8 <= prefix <= 30:
        raise bad("SUBNET", "prefix length must be 8-30 (a gateway and at least one pod)")
    subnet = ipaddress.IPv4Network(f"{addr}/{prefix}", strict=False)
    if subnet.network_address != addr:
        raise bad("SUBNET", f"host bits are set (did you mean {subnet}?)")

    if raw["GATEWAY"]:
        gw = _parse_ip(raw["GATEWAY"])
        if gw is None:
            raise bad("GATEWAY", "expected an IPv4 address")
        if gw not in subnet or gw in (subnet.network_address, subnet.broadcast_address):
            raise bad("GATEWAY", f"not a host address of {raw['SUBNET']}")
    else:
        gw = subnet.network_address + 1

    if not re.fullmatch(r"[0-9]{1,5}", raw["MTU"]) or not 68 <= int(raw["MTU"], 10) <= 65535:
        raise bad("MTU", "expected an integer 68-65535")

    state_dir = raw["STATE_DIR"]
    if not state_dir.startswith("/"):
        raise bad("STATE_DIR", "must be an absolute path")
    state_dir = state_dir.rstrip("/")
    if not state_dir:
        raise SettingsError("invalid NETPLUGIN_BRIDGE_STATE_DIR '/': refusing the root directory")

    forward = raw["IP_FORWARD"].lower()
    if forward not in ("true", "yes", "1", "false", "no", "0"):
        raise bad("IP_FORWARD", "expected true or false")

    return BridgeSettings(
        name=raw["NAME"],
        subnet=subnet,
        gateway=gw,
        mtu=int(raw["MTU"], 10),
        state_dir=state_dir,
        ifname=raw["IFNAME"],
        ip_forward=forward in ("true", "yes", "1"),
    )


# --- network namespaces ----------------------------------------------------------------------------

_libc: Any = None


def _setns(fd: int) -> None:
    global _libc
    import ctypes  # here: ctypes costs ~5 ms to import, and only pod actions need it

    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    if _libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def netns_socket(path: str) -> socket.socket:
    """A NETLINK_ROUTE socket inside the network namespace at ``path`` (FileNotFoundError if none).

    Only the calling thread changes namespace, only around ``socket()``, and it switches back
    before anything else runs. Failing to switch back is fatal (``os.abort``): a thread silently
    left in a pod's netns would corrupt everything it did afterwards.
    """
    target = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        saved = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            try:
                _setns(target)
            except OSError as e:
                if e.errno == errno.EINVAL:
                    raise OSError(errno.EINVAL, f"{path} is not a network namespace") from None
                raise
            try:
                return socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, 0)
            finally:
                try:
                    _setns(saved)
                except OSError:
                    os.abort()
        finally:
            os.close(saved)
    finally:
        os.close(target)


# --- raw netlink --------------------------------------------------------------------------------------
#
# Every per-pod request is packed by hand with struct: pyroute2 0.9 spends ~0.5 ms of Python per
# request (message classes, an asyncio loop) where the kernel needs 10-50 us, and it cannot send
# several requests in one sendmsg. pyroute2 is still used where speed does not matter (init).

_NLMSG_ERROR = 2
_NLMSG_DONE = 3
_RTM_NEWLINK = 16
_RTM_DELLINK = 17
_RTM_GETLINK = 18
_RTM_NEWADDR = 20
_RTM_GETADDR = 22
_RTM_NEWROUTE = 24
_NLM_F_REQUEST = 0x1
_NLM_F_ACK = 0x4
_NLM_F_DUMP = 0x300
_NLM_F_REPLACE = 0x100
_NLM_F_EXCL = 0x200
_NLM_F_CREATE = 0x400
_IFLA_IFNAME = 3
_IFLA_MTU = 4
_IFLA_LINK = 5
_IFLA_MASTER = 10
_IFLA_LINKINFO = 18
_IFLA_GROUP = 27
_IFLA_NET_NS_FD = 28
_IFLA_INFO_KIND = 1
_IFLA_INFO_DATA = 2
_IFLA_INFO_SLAVE_KIND = 4
_IFLA_INFO_SLAVE_DATA = 5
_IFLA_BRPORT_MODE = 4  # hairpin
_VETH_INFO_PEER = 1
_IFA_ADDRESS = 1
_IFA_LOCAL = 2
_RTA_OIF = 4
_RTA_GATEWAY = 5
_RT_TABLE_MAIN = 254
_RTPROT_BOOT = 3  # what `ip route` uses: routes look the same whichever bridge plugin made them
_RTN_UNICAST = 1
_NLHDR = struct.Struct("=IHHII")
_IFINFO = struct.Struct("=BxHiII")
_IFADDR = struct.Struct("=BBBBI")
_RTMSG = struct.Struct("=BBBBBBBBI")
_U32 = struct.Struct("=I")
#: Requests per sendmsg: keeps the kernel's replies well inside the socket's receive buffer.
_CHUNK = 128


def _attr(kind: int, payload: bytes) -> bytes:
    n = 4 + len(payload)
    return struct.pack("=HH", n, kind) + payload + b"\0" * (-n & 3)


def _str_attr(kind: int, value: str) -> bytes:
    return _attr(kind, value.encode() + b"\0")


def _u32_attr(kind: int, value: int) -> bytes:
    return _attr(kind, _U32.pack(value))


def _find_attr(payload: bytes, offset: int, kind: int) -> bytes | None:
    while offset + 4 <= len(payload):
        length, akind = struct.unpack_from("=HH", payload, offset)
        if length < 4:
            return None
        if akind & 0x3FFF == kind:
            return payload[offset + 4 : offset + length]
        offset += (length + 3) & ~3
    return None


def _ifinfo(index: int = 0, flags: int = 0, change: int = 0) -> bytes:
    return _IFINFO.pack(0, 0, index, flags, change)


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
                parts.append(_NLHDR.pack(_NLHDR.size + len(body), kind, flags | _NLM_F_REQUEST, seq, 0) + body)
            self.sock.send(b"".join(parts))
            pending = {seq: i for i, seq in enumerate(seqs)}
            results: list[tuple[int, bytes]] = [(0, b"")] * len(chunk)
            while pending:
                for kind, _flags, seq, payload in self._receive():
                    i = pending.pop(seq, None)
                    if i is None:
                        continue  # a late reply to an abandoned request
                    if kind == _NLMSG_ERROR:
                        results[i] = (-struct.unpack_from("=i", payload)[0], b"")
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
        self.sock.send(_NLHDR.pack(_NLHDR.size + len(body), kind, _NLM_F_REQUEST | _NLM_F_DUMP, seq, 0) + body)
        while True:
            for rkind, _flags, rseq, payload in self._receive():
                if rseq != seq:
                    continue
                if rkind == _NLMSG_DONE:
                    return
                if rkind == _NLMSG_ERROR:
                    err = -struct.unpack_from("=i", payload)[0]
                    if err:
                        raise KernelError(err, f"{what}: {os.strerror(err)}")
                    return
                yield payload

    def _receive(self) -> list[tuple[int, int, int, bytes]]:
        data = self.sock.recv(1 << 16)
        out: list[tuple[int, int, int, bytes]] = []
        off = 0
        while off + _NLHDR.size <= len(data):
            length, kind, flags, seq, _pid = _NLHDR.unpack_from(data, off)
            if length < _NLHDR.size or off + length > len(data):
                raise OSError(errno.EPROTO, "malformed netlink reply")
            out.append((kind, flags, seq, data[off + _NLHDR.size : off + length]))
            off += (length + 3) & ~3
        return out

    # --- the requests the plugin makes --------------------------------------------------------------

    def link(self, ifname: str) -> tuple[int, int | None] | None:
        """``(ifindex, IFLA_LINK)`` of ``ifname``, or None when there is no such link.

        For a veth, IFLA_LINK is the peer's ifindex (in the peer's namespace).
        """
        err, answer = self.transact([(_RTM_GETLINK, 0, _ifinfo() + _str_attr(_IFLA_IFNAME, ifname))])[0]
        if err == errno.ENODEV:
            return None
        if err:
            raise KernelError(err, f"get link {ifname}: {os.strerror(err)}")
        index = int(_IFINFO.unpack_from(answer)[2])
        peer = _find_attr(answer, _IFINFO.size, _IFLA_LINK)
        return index, (int(_U32.unpack_from(peer)[0]) if peer is not None and len(peer) >= 4 else None)

    def add_veth(self, name: str, peer: str, netns_fd: int, mtu: int, master: int) -> None:
        """``ip link add NAME mtu MTU master M up type veth peer name PEER mtu MTU netns FD``."""
        peer_msg = (
            _ifinfo() + _str_attr(_IFLA_IFNAME, peer) + _u32_attr(_IFLA_NET_NS_FD, netns_fd) + _u32_attr(_IFLA_MTU, mtu)
        )
        linkinfo = _str_attr(_IFLA_INFO_KIND, "veth") + _attr(_IFLA_INFO_DATA, _attr(_VETH_INFO_PEER, peer_msg))
        body = (
            _ifinfo(0, _IFF_UP, _IFF_UP)
            + _str_attr(_IFLA_IFNAME, name)
            + _u32_attr(_IFLA_MTU, mtu)
            + _u32_attr(_IFLA_MASTER, master)
            + _attr(_IFLA_LINKINFO, linkinfo)
        )
        self.request(_RTM_NEWLINK, _NLM_F_ACK | _NLM_F_CREATE | _NLM_F_EXCL, body, f"add veth {name}")

    def attach(self, index: int, mtu: int, master: int) -> None:
        """``ip link set dev INDEX mtu MTU master M up``."""
        body = _ifinfo(index, _IFF_UP, _IFF_UP) + _u32_attr(_IFLA_MTU, mtu) + _u32_attr(_IFLA_MASTER, master)
        self.request(_RTM_NEWLINK, _NLM_F_ACK, body, f"attach link {index}")

    def hairpin(self, index: int) -> None:
        """``ip link set dev INDEX type bridge_slave hairpin on``."""
        slave = _str_attr(_IFLA_INFO_SLAVE_KIND, "bridge") + _attr(
            _IFLA_INFO_SLAVE_DATA, _attr(_IFLA_BRPORT_MODE, b"\x01")
        )
        self.request(_RTM_NEWLINK, _NLM_F_ACK, _ifinfo(index) + _attr(_IFLA_LINKINFO, slave), "set hairpin")

    def configure_pod(self, index: int, ip: str, prefixlen: int, gateway: str) -> None:
        """lo up; ``ip addr replace IP/PREFIXLEN``; link up; ``ip route replace default via GW``.

        One sendmsg: the kernel runs the requests in order and acks each one.
        """
        addr = socket.inet_aton(ip)
        replace = _NLM_F_ACK | _NLM_F_CREATE | _NLM_F_REPLACE
        steps = [
            ("set lo up", (_RTM_NEWLINK, _NLM_F_ACK, _ifinfo(1, _IFF_UP, _IFF_UP))),  # lo is ifindex 1
            (
                f"add address {ip}/{prefixlen}",
                (
                    _RTM_NEWADDR,
                    replace,
                    _IFADDR.pack(socket.AF_INET, prefixlen, 0, 0, index)
                    + _attr(_IFA_LOCAL, addr)
                    + _attr(_IFA_ADDRESS, addr),
                ),
            ),
            ("set link up", (_RTM_NEWLINK, _NLM_F_ACK, _ifinfo(index, _IFF_UP, _IFF_UP))),
            (
                f"add default route via {gateway}",
                (
                    _RTM_NEWROUTE,
                    replace,
                    _RTMSG.pack(socket.AF_INET, 0, 0, 0, _RT_TABLE_MAIN, _RTPROT_BOOT, 0, _RTN_UNICAST, 0)
                    + _attr(_RTA_GATEWAY, socket.inet_aton(gateway))
                    + _u32_attr(_RTA_OIF, index),
                ),
            ),
        ]
        for (what, _), (err, _answer) in zip(steps, self.transact([req for _, req in steps]), strict=True):
            if err:
                raise KernelError(err, f"{what}: {os.strerror(err)}")

    def ipv4_address(self, index: int) -> str | None:
        """The first IPv4 address of link ``index`` (like ``ip -4 addr show``), or None."""
        found: str | None = None
        for answer in self.dump(_RTM_GETADDR, _IFADDR.pack(socket.AF_INET, 0, 0, 0, 0), "list addresses"):
            family, _plen, _flags, _scope, ifindex = _IFADDR.unpack_from(answer)
            if found is not None or family != socket.AF_INET or ifindex != index:
                continue  # keep reading: the dump must be drained
            raw = _find_attr(answer, _IFADDR.size, _IFA_LOCAL) or _find_attr(answer, _IFADDR.size, _IFA_ADDRESS)
            if raw is not None and len(raw) == 4:
                found = socket.inet_ntoa(raw)
        return found

    def delete_links(self, indexes: Sequence[int]) -> dict[int, int]:
        """Delete links, all in one kernel request when there are several. ``{index: errno}`` of failures.

        A link that is already gone is not a failure. Several links are moved into a fresh random
        link group, and the group is deleted: the kernel then waits for one set of RCU grace
        periods instead of one per link (~16 ms each).
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
                [(_RTM_NEWLINK, _NLM_F_ACK, _ifinfo(i) + _u32_attr(_IFLA_GROUP, group)) for i in todo]
            )
            for i, (err, _) in zip(todo, results, strict=True):
                if not err:
                    moved.append(i)
                elif err != errno.ENODEV:
                    failed[i] = err
            if not moved:
                return failed
            err, _ = self.transact([(_RTM_DELLINK, _NLM_F_ACK, _ifinfo(0) + _u32_attr(_IFLA_GROUP, group))])[0]
            if err in (0, errno.ENODEV):  # ENODEV: another process deleted them meanwhile
                return failed
            todo = moved  # for example EOPNOTSUPP: fall back to one request per link
        for i, (err, _) in zip(
            todo, self.transact([(_RTM_DELLINK, _NLM_F_ACK, _ifinfo(i)) for i in todo]), strict=True
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


def _drop_root_netlink() -> None:
    raw, _tls.raw = _tls.raw, None
    if raw is not None:
        raw.close()


@contextmanager
def netns_netlink(path: str) -> Iterator[RawNetlink]:
    """A netlink socket in the netns at ``path`` for the block (FileNotFoundError if there is none)."""
    with RawNetlink(netns_socket(path)) as nl:
        yield nl


# sysfs shows the links of the netns it was mounted in: ours, unless netplugin runs in a container
# with a private /sys; then every lookup asks netlink.
_SYSFS = os.path.isdir("/sys/class/net/lo")


def _root_ifindex(name: str) -> int | None:
    """The root-netns ifindex of ``name`` (reading sysfs costs ~10 us, a netlink get ~40 us)."""
    if _SYSFS:
        try:
            with open(f"/sys/class/net/{name}/ifindex", "rb") as f:
                return int(f.read())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            pass  # raced with a deletion, or odd content: ask netlink
    found = root_netlink().link(name)
    return None if found is None else found[0]


def _bridge_up_index(name: str) -> int | None:
    """The ifindex of ``name`` if it is a bridge and up, else None."""
    if _SYSFS:
        try:
            with open(f"/sys/class/net/{name}/flags", "rb") as f:
                flags = int(f.read(), 16)
            with open(f"/sys/class/net/{name}/ifindex", "rb") as f:
                index = int(f.read())
        except (OSError, ValueError):
            return None
        return index if flags & _IFF_UP and os.path.isdir(f"/sys/class/net/{name}/bridge") else None
    return None  # without sysfs: let init check (and fix) the bridge


def _set_hairpin(name: str, index: int) -> None:
    if _SYSFS:
        try:
            with open(f"/sys/class/net/{name}/brport/hairpin_mode", "w") as f:
                f.write("1")
            return
        except OSError:
            pass
    root_netlink().hairpin(index)


def _in_event_loop() -> bool:
    aio = sys.modules.get("asyncio")  # not imported: no loop can be running (and asyncio costs 50 ms)
    if aio is None:
        return False
    try:
        aio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _configure_bridge(s: BridgeSettings, step: _Step) -> int:
    """The bridge exists, is a bridge, has the gateway address, the MTU, a pinned MAC, and is up."""
    # pyroute2 only here: init is rare and readability wins; the per-pod path packs its own requests.
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError

    try:
        with IPRoute(groups=0) as ipr:
            step.what = f"create bridge {s.name}"
            links = ipr.link("get", ifname=s.name) if _root_ifindex(s.name) is not None else []
            if not links:
                try:
                    ipr.link("add", ifname=s.name, kind="bridge")
                except NetlinkError as e:
                    if e.code != errno.EEXIST:  # EEXIST: a concurrent init won the race
                        raise
                links = ipr.link("get", ifname=s.name)
            link = links[0]
            if link.get(("IFLA_LINKINFO", "IFLA_INFO_KIND")) != "bridge":
                raise BridgeError(f"{s.name} exists but is not a bridge")
            index = int(link["index"])
            step.what = f"configure bridge {s.name} ({s.gateway}/{s.subnet.prefixlen}, mtu {s.mtu})"
            # Pinning the current MAC stops the kernel from taking the lowest port MAC as pods join,
            # which would invalidate the pods' ARP entries for the gateway.
            ipr.link("set", index=index, address=link.get("IFLA_ADDRESS"), mtu=s.mtu)
            ipr.addr("replace", index=index, address=str(s.gateway), prefixlen=s.subnet.prefixlen)
            ipr.link("set", index=index, state="up")
            return index
    except NetlinkError as e:
        raise KernelError(e.code, os.strerror(e.code) if e.code else str(e)) from e


# --- coalesced link deletion -------------------------------------------------------------------------


class _Deletion:
    __slots__ = ("done", "error", "index", "name")

    def __init__(self, name: str, index: int) -> None:
        self.name = name
        self.index = index
        self.done = False
        self.error: BaseException | None = None


class LinkReaper:
    """Deletes root-netns links, many per kernel request when callers overlap.

    There is no background thread: the first caller to find no batch in progress deletes
    everything queued so far (its own link included); callers arriving meanwhile queue and
    wait, and the first of them to wake takes the next batch. :meth:`delete` returns only when
    the link is gone.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queue: list[_Deletion] = []
        self._busy = False
        #: batches run and links deleted, for tests and measurements
        self.batches = 0
        self.links = 0

    def delete(self, name: str, index: int, timeout: float) -> None:
        job = _Deletion(name, index)
        deadline = time.monotonic() + timeout
        batch: list[_Deletion] = []
        with self._cond:
            self._queue.append(job)
            while not job.done:
                if not self._busy:
                    batch, self._queue = self._queue, []
                    self._busy = True
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    if job in self._queue:
                        self._queue.remove(job)
                        raise TimeoutError(f"timed out after {timeout:g}s waiting to delete {name}")
                    left = 0.05  # already taken by a running batch: its result is moments away
                self._cond.wait(left)
        if batch:
            try:
                failed = root_netlink().delete_links([j.index for j in batch])
                for j in batch:
                    if j.index in failed:
                        err = failed[j.index]
                        j.error = KernelError(err, f"delete {j.name}: {os.strerror(err)}")
            except BaseException as e:
                if not isinstance(e, KernelError):
                    _drop_root_netlink()
                for j in batch:
                    j.error = j.error or e
            finally:
                with self._cond:
                    for j in batch:
                        j.done = True
                    self._busy = False
                    self.batches += 1
                    self.links += len(batch)
                    self._cond.notify_all()
        if job.error is not None:
            raise job.error


# --- the plugin ----------------------------------------------------------------------------------------


def _code_version() -> str:
    import hashlib

    h = hashlib.sha256()
    here = os.path.dirname(os.path.abspath(__file__))
    for name in ("native.py", "ipam.py"):
        with open(os.path.join(here, name), "rb") as f:
            h.update(f.read())
    return "builtin:netplugin.io/bridge:sha256:" + h.hexdigest()[:16]


class _Step:
    """What is being done, for "failed to <what>" (the bash plugin's STEP)."""

    __slots__ = ("what",)

    def __init__(self) -> None:
        self.what = ""


def _file_key(path: str) -> tuple[str, int, int, int]:
    try:
        st = os.stat(path)
    except OSError:
        return (path, -1, -1, -1)
    return (path, st.st_ino, st.st_size, st.st_mtime_ns)


class NativeBridgePlugin:
    """The ``netplugin.io/bridge`` plugin. Thread-safe: one instance serves many pods at once."""

    name = PLUGIN_NAME

    def __init__(self, *, state_dir: str | None = None, plugin_dir: str | None = None) -> None:
        #: netplugin's state dir, used when the call's environment has no NETPLUGIN_STATE_DIR
        self.state_dir = state_dir
        #: the bash plugin's settings file, when it is installed as ``bridge`` in the exec dir
        self.conf_beside = os.path.join(plugin_dir, "bridge", "bridge.conf") if plugin_dir else None
        self.reaper = LinkReaper()
        self._version: str | None = None
        self._settings_cache: tuple[tuple[Any, ...], BridgeSettings] | None = None
        self._ipams: dict[tuple[str, str, str], IPAM] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, cfg: Config) -> NativeBridgePlugin:
        return cls(state_dir=cfg.state_dir, plugin_dir=cfg.plugin_dir)

    def __repr__(self) -> str:
        return f"NativeBridgePlugin(state_dir={self.state_dir!r})"

    def version(self) -> str:
        """A hash of this module and the IPAM's source: init runs again when the code changes."""
        if self._version is None:
            self._version = _code_version()
        return self._version

    # --- settings ---------------------------------------------------------------------------------

    def settings(self, env: Mapping[str, str], state_dir: str = "") -> BridgeSettings:
        """The effective settings for a call's environment (cached while nothing changes).

        netplugin's state dir (the default STATE_DIR's parent) is NETPLUGIN_STATE_DIR, else
        ``state_dir`` (the call context's), else the one given at construction.
        """
        state_dir = env.get("NETPLUGIN_STATE_DIR") or state_dir or self.state_dir or ""
        files: list[str] = []
        if self.conf_beside and os.path.exists(self.conf_beside):
            files.append(self.conf_beside)
        if env.get("NETPLUGIN_BRIDGE_CONF"):
            files.append(env["NETPLUGIN_BRIDGE_CONF"])
        key: tuple[Any, ...] = (
            state_dir,
            *(env.get("NETPLUGIN_BRIDGE_" + k) for k in _KEYS),
            *(_file_key(p) for p in files),
        )
        cached = self._settings_cache
        if cached is not None and cached[0] == key:
            return cached[1]
        merged = dict(env)
        if state_dir:
            merged["NETPLUGIN_STATE_DIR"] = state_dir
        settings = load_settings(merged, files)
        self._settings_cache = (key, settings)
        return settings

    def ipam(self, s: BridgeSettings) -> IPAM:
        key = (s.ipam_dir, str(s.subnet), str(s.gateway))
        with self._lock:
            ipam = self._ipams.get(key)
            if ipam is None:
                ipam = self._ipams[key] = IPAM(s.ipam_dir, s.subnet, str(s.gateway), lock_timeout=20.0)
            return ipam

    # --- errors ------------------------------------------------------------------------------------

    @contextmanager
    def _action(self, action: str, pod: PodRef | None, timeout: float) -> Iterator[_Step]:
        """Turn every failure into a PluginError that says what failed."""
        step = _Step()
        try:
            yield step
        except PluginError:
            raise
        except Exception as e:  # the plugin boundary: callers get PluginErrors only
            if not isinstance(e, NetpluginError | KernelError | TimeoutError):
                _drop_root_netlink()  # maybe the socket broke: the next call gets a fresh one
            details: dict[str, Any] = {"plugin": self.name, "action": action}
            if pod is not None:
                details["pod"] = str(pod)
            if isinstance(e, TimeoutError):
                raise PluginTimeout(timeout=timeout, **details) from e
            what = f" to {step.what}" if step.what else ""
            where = f" for pod {pod}" if pod is not None else ""
            if isinstance(e, NetpluginError):
                reason = e.message
            elif isinstance(e, OSError):
                reason = e.strerror or str(e)
            else:
                reason = f"internal error: {type(e).__name__}: {e}"
            raise PluginFailed(f"network plugin {self.name!r} {action}{where} failed{what}: {reason}", **details) from e

    # --- init ----------------------------------------------------------------------------------------

    def init(self, ctx: CallContext) -> None:
        """Bridge up with the gateway address (MAC pinned), IPv4 forwarding on, IPAM dir checked."""
        with self._action("init", None, ctx.timeout) as step:
            step.what = "read the settings"
            self._init(self.settings(ctx.env, ctx.state_dir), step)

    def _init(self, s: BridgeSettings, step: _Step) -> int:
        """IPAM check, bridge, forwarding; returns the bridge's ifindex. Idempotent."""
        # First: a changed subnet must fail before the bridge gets a second gateway address.
        step.what = f"check IPAM directory {s.ipam_dir}"
        with self.ipam(s).locked():
            pass
        if _in_event_loop():
            # pyroute2's sync API runs its own event loop and cannot inside a running one
            # (svinota/pyroute2#1342): called from a coroutine, do the netlink part in a thread.
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(1) as ex:
                index = ex.submit(_configure_bridge, s, step).result()
        else:
            index = _configure_bridge(s, step)
        if s.ip_forward:
            step.what = "enable IPv4 forwarding"
            with open("/proc/sys/net/ipv4/ip_forward", "r+") as f:
                if f.read().strip() != "1":
                    f.seek(0)
                    f.write("1\n")
        return index

    # --- setup -----------------------------------------------------------------------------------------

    def setup(self, pod: PodRef, ctx: CallContext) -> None:
        """Veth pair (peer created in the netns) on the bridge, address, default route. Idempotent."""
        with self._action("setup", pod, ctx.timeout) as step:
            step.what = "read the settings"
            s = self.settings(ctx.env, ctx.state_dir)
            step.what = ""
            try:
                nsfd = os.open(ctx.netns, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                raise BridgeError(f"network namespace {ctx.netns} does not exist") from None
            try:
                self._setup(pod, ctx, s, nsfd, step)
            finally:
                os.close(nsfd)

    def _setup(self, pod: PodRef, ctx: CallContext, s: BridgeSettings, nsfd: int, step: _Step) -> None:
        step.what = f"check bridge {s.name}"
        bridge = _bridge_up_index(s.name)
        if bridge is None:
            bridge = self._init(s, step)  # like the bash plugin: missing or down -> init
        ipam = self.ipam(s)
        step.what = f"allocate an address in {s.subnet}"
        alloc, new_allocation = ipam.claim(pod.infra_id, pod.namespace, pod.name, timeout=ctx.timeout)
        host = host_veth_name(pod.infra_id)
        created: int | None = None
        try:
            root = root_netlink()
            step.what = f"enter network namespace {ctx.netns}"
            with netns_netlink(ctx.netns) as ns:
                existing = _root_ifindex(host)
                peer: int | None = None
                if existing is not None:
                    step.what = f"inspect {s.ifname} in {ctx.netns}"
                    found = ns.link(s.ifname)
                    if found is not None:
                        if found[1] != existing:
                            raise BridgeError(f"{s.ifname} already exists in {ctx.netns} and is not the peer of {host}")
                        peer = found[0]
                if existing is not None and peer is not None:
                    # Setup again for the same pod: keep the pair and make sure it is configured.
                    step.what = f"attach {host} to {s.name}"
                    root.attach(existing, s.mtu, bridge)
                    index = existing
                else:
                    if existing is not None:
                        step.what = f"delete stale veth {host}"
                        self.reaper.delete(host, existing, ctx.timeout)
                    step.what = f"create veth {host} with peer {s.ifname} in {ctx.netns}"
                    # The peer is created inside the pod netns: moving a link there costs ~20 ms more.
                    root.add_veth(host, s.ifname, nsfd, s.mtu, bridge)
                    created = _root_ifindex(host)
                    found = ns.link(s.ifname)
                    if created is None or found is None:
                        raise OSError(errno.ENODEV, f"veth {host} vanished right after it was created")
                    index, peer = created, found[0]
                step.what = f"enable hairpin on {host}"
                _set_hairpin(host, index)
                step.what = f"configure {s.ifname} in {ctx.netns} ({alloc.cidr} via {s.gateway})"
                ns.configure_pod(peer, alloc.ip, alloc.prefixlen, str(s.gateway))
        except BaseException:
            # Undo only what this call did: a repeated setup must not break the running pod.
            if created is not None:
                try:
                    self.reaper.delete(host, created, ctx.timeout)
                except Exception:
                    pass
            if new_allocation:
                try:
                    ipam.release(pod.infra_id, timeout=ctx.timeout)
                except Exception:
                    pass
            raise

    # --- teardown ----------------------------------------------------------------------------------

    def teardown(self, pod: PodRef, ctx: CallContext) -> None:
        """Delete the host veth (and so the pair), then release the address. Idempotent.

        Works whether or not the netns, the veth or the address still exist. Returns once the
        link is gone (concurrent teardowns share one kernel deletion, see :class:`LinkReaper`).
        """
        with self._action("teardown", pod, ctx.timeout) as step:
            step.what = "read the settings"
            s = self.settings(ctx.env, ctx.state_dir)
            host = host_veth_name(pod.infra_id)
            # Deleting either end removes the pair; when the netns is gone the kernel already did (or
            # is about to: the pair dies asynchronously with the netns).
            step.what = f"delete veth {host}"
            index = _root_ifindex(host)
            if index is not None:
                self.reaper.delete(host, index, ctx.timeout)
            # Only now: the address must not be handed out while the old pod still has it.
            step.what = f"release the address of {pod.infra_id}"
            self.ipam(s).release(pod.infra_id, timeout=ctx.timeout)

    # --- status ----------------------------------------------------------------------------------------

    def status(self, pod: PodRef, ctx: CallContext) -> PodNetworkStatus | None:
        """The IPv4 address of the pod's interface, or None when the netns or interface is gone."""
        with self._action("status", pod, ctx.timeout) as step:
            step.what = "read the settings"
            s = self.settings(ctx.env, ctx.state_dir)
            step.what = f"read {s.ifname} in {ctx.netns}"
            try:
                ns = RawNetlink(netns_socket(ctx.netns))
            except FileNotFoundError:
                return None
            with ns:
                found = ns.link(s.ifname)
                ip = ns.ipv4_address(found[0]) if found is not None else None
            return PodNetworkStatus(ip=ip) if ip else None
