"""The CNI ADD result: the host veth and the pod interface with their MACs, the addresses with their
prefix and gateway from the bridge settings, pointing at the pod interface.

Listing the host-side interface (no ``sandbox``) is what makes the result chainable: CNI's own
``bandwidth``, ``tuning`` and ``firewall`` find the veth to act on there, as after the reference bridge.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
from collections.abc import Mapping, Sequence
from typing import Any

from netplugin.core.netns import entered

__all__ = ["host_link_mac", "link_mac", "make_result", "prev_ips"]


def _address(ip: str, env: Mapping[str, str]) -> tuple[str, str | None]:
    """(CIDR, gateway or None) for a reported address, using the bridge settings when they fit.

    SUBNET and GATEWAY may be comma lists (dual stack: one entry per family); SUBNET ``node``
    means the node's pod CIDRs, NETPLUGIN_NODE_POD_CIDRS, when ``env`` has them.
    """
    addr = ipaddress.ip_address(ip)
    subnets = env.get("NETPLUGIN_BRIDGE_SUBNET", "")
    if subnets.strip() == "node":
        subnets = env.get("NETPLUGIN_NODE_POD_CIDRS", "")
    for subnet_text in subnets.split(","):
        try:
            net = ipaddress.ip_network(subnet_text.strip(), strict=False)
        except ValueError:
            continue
        if net.version == addr.version and addr in net:
            gateway: str | None = None
            gws = [g.strip() for g in env.get("NETPLUGIN_BRIDGE_GATEWAY", "").split(",") if g.strip()]
            try:
                gw = next((g for g in map(ipaddress.ip_address, gws) if g.version == addr.version), None)
                gw = gw or net.network_address + 1
                gateway = str(gw) if gw in net and gw != addr else None
            except ValueError:
                gateway = None
            return f"{addr}/{net.prefixlen}", gateway
    return f"{addr}/{addr.max_prefixlen}", None


_SIOCGIFHWADDR = 0x8927


def link_mac(netns: str, ifname: str) -> str | None:
    """The MAC address of ``ifname`` inside the netns at ``netns``, or None if it cannot be read.

    For a plugin whose setup did not report it (:attr:`PodNetworkStatus.mac`). The calling thread
    enters the netns only to create a socket there (:func:`netplugin.core.netns.entered`: back in
    its own namespace before anything else runs, or the process aborts), then asks the kernel with
    SIOCGIFHWADDR on it: no process and no thread is started (a thread per ADD cost the daemon
    about a millisecond). /sys cannot be used: it shows the netns of whoever mounted it.
    """
    try:
        with entered(netns):
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
    except OSError:  # no such netns: the MAC is optional in a CNI result
        return None
    with sock:
        return _mac_of(sock, ifname)


def host_link_mac(ifname: str) -> str | None:
    """The MAC address of ``ifname`` in the caller's own netns (a pod's host veth), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        return _mac_of(sock, ifname)


def _mac_of(sock: Any, ifname: str) -> str | None:
    try:
        ifreq = fcntl.ioctl(sock.fileno(), _SIOCGIFHWADDR, struct.pack("256s", ifname.encode()))
    except OSError:  # no such interface: the MAC is optional in a CNI result
        return None
    return ":".join(f"{b:02x}" for b in ifreq[18:24])


def make_result(
    cni_version: str,
    ifname: str,
    netns: str,
    ip: str | Sequence[str] | None,
    env: Mapping[str, str],
    prev: Mapping[str, Any] | None = None,
    mac: str | None = None,
    host: tuple[str, str | None] | None = None,
) -> dict[str, Any]:
    """The ADD result in ``cni_version``'s format; ``prev`` (a prevResult) is extended, not replaced.

    ``ip`` is the pod's address, or all of them (a dual-stack pod's ``PodNetworkStatus.ips``).
    ``host`` is the host-side interface the plugin made for the pod and its MAC: listed before the
    pod interface, without ``sandbox``, as the reference bridge lists its veth.
    """
    interfaces = [dict(i) for i in (prev or {}).get("interfaces") or [] if isinstance(i, dict)]
    ips = [dict(i) for i in (prev or {}).get("ips") or [] if isinstance(i, dict)]
    if host is not None:
        host_iface: dict[str, Any] = {"name": host[0]}
        if host[1]:
            host_iface["mac"] = host[1]
        interfaces.append(host_iface)
    index = len(interfaces)
    iface: dict[str, Any] = {"name": ifname}
    if mac:
        iface["mac"] = mac
    if netns:
        iface["sandbox"] = netns
    interfaces.append(iface)
    for one in [ip] if isinstance(ip, str) else ip or []:
        cidr, gateway = _address(one, env)
        entry: dict[str, Any] = {"address": cidr, "interface": index}
        if gateway:
            entry["gateway"] = gateway
        if not cni_version.startswith("1."):
            entry["version"] = "6" if ":" in one else "4"
        ips.append(entry)
    result: dict[str, Any] = {"cniVersion": cni_version, "interfaces": interfaces, "ips": ips}
    for key in ("routes", "dns"):
        if prev and prev.get(key):
            result[key] = prev[key]
    return result


def prev_ips(prev: Any) -> set[str]:
    out: set[str] = set()
    if not isinstance(prev, dict):
        return out
    for entry in prev.get("ips") or []:
        if isinstance(entry, dict) and isinstance(entry.get("address"), str):
            try:
                out.add(str(ipaddress.ip_interface(entry["address"]).ip))
            except ValueError:
                continue
    return out
