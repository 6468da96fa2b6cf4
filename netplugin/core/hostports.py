"""A pod's hostPorts: parsed from where they come from, checked, and written for plugins.

Sources: the CNI ``portMappings`` capability (``runtimeConfig.portMappings``, which containerd and
CRI-O pass for a conflist declaring it), else the Pod's spec (``containers[].ports[]`` with a
``hostPort``) when the Host knows the pod, as kubenet's hostport manager read it.

Plugins get them in ``NETPLUGIN_HOST_PORTS`` (part of the plugin contract, docs/plugin-contract.md): one
entry per mapping, separated by spaces, each ``PROTOCOL/HOSTPORT/CONTAINERPORT`` or
``PROTOCOL/HOSTPORT/CONTAINERPORT/HOSTIP`` (protocol ``tcp``, ``udp`` or ``sctp``; the host IP in
its canonical form), already validated: a bash plugin splits it without parsing JSON.

A mapping without a host IP answers the node's own ``127.0.0.1`` too, and a host IP in
127.0.0.0/8 is accepted, as Kubernetes' portmap plugin and kube-proxy do: the hostport member turns
``route_localnet`` on for the pod's bridge alone, and its table always carries kube-proxy's guard
(CVE-2020-8558: services bound to localhost reachable from the bridge's neighbours).
``NETPLUGIN_HOSTPORT_LOCALHOST=false`` opts out: then 127.0.0.1 is not mapped and a loopback host IP
is refused, naming the setting. ``::1`` is always refused: IPv6 has no ``route_localnet``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from typing import Any

from netplugin.core.errors import ConfigError, InvalidArgument
from netplugin.core.plaindata import dataclass

__all__ = [
    "ENV_HOST_PORTS",
    "ENV_LOCALHOST",
    "HOSTPORT_TABLE",
    "LOCALHOST_DEFAULT",
    "PROTOCOLS",
    "HostPort",
    "check_families",
    "from_pod",
    "from_runtime_config",
    "localhost_enabled",
    "parse_env",
    "pod_host_ports",
    "to_env",
    "unmapped",
]

#: the nftables table of hostPort rules (the built-in and the bash `hostport` plugin), which uninstall removes
HOSTPORT_TABLE = "inet netplugin_hostport"

ENV_HOST_PORTS = "NETPLUGIN_HOST_PORTS"
PROTOCOLS = ("tcp", "udp", "sctp")
#: more than a pod can sensibly ask for; bounds the rules one pod makes
MAX_MAPPINGS = 256
_KEYS = ("hostPort", "containerPort", "protocol", "hostIP")
#: the setting that maps hostPorts on the node's 127.0.0.1 too (route_localnet on the pod's bridge)
ENV_LOCALHOST = "NETPLUGIN_HOSTPORT_LOCALHOST"
#: on, as Kubernetes' portmap and kube-proxy: pods expect 127.0.0.1:hostPort (the conformance suite
#: maps a hostIP of 127.0.0.1); the table's guard keeps the bridge's neighbours off localhost services
LOCALHOST_DEFAULT = True
_FLAGS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}


@dataclass(frozen=True, slots=True)
class HostPort:
    protocol: str
    host_port: int
    container_port: int
    host_ip: str = ""

    def entry(self) -> str:
        base = f"{self.protocol}/{self.host_port}/{self.container_port}"
        return f"{base}/{self.host_ip}" if self.host_ip else base


def _port(field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise InvalidArgument(field, value, "must be a port number 1-65535")
    return value


def _one(field: str, host_port: Any, container_port: Any, protocol: Any, host_ip: Any, localhost: bool) -> HostPort:
    proto = protocol.lower() if isinstance(protocol, str) and protocol else "tcp"
    if proto not in PROTOCOLS:
        raise InvalidArgument(f"{field}.protocol", protocol, "must be TCP, UDP or SCTP")
    ip = ""
    if host_ip not in (None, "", "0.0.0.0", "::"):
        try:
            addr = ipaddress.ip_address(host_ip if isinstance(host_ip, str) else "")
        except ValueError:
            raise InvalidArgument(f"{field}.hostIP", host_ip, "must be an IP address") from None
        if isinstance(addr, ipaddress.IPv6Address) and addr.is_loopback:
            reason = "IPv6 has no route_localnet, so ::1 cannot be DNATed to a pod (docs/hostport.md)"
            raise InvalidArgument(f"{field}.hostIP", host_ip, reason)
        if addr.is_loopback and not localhost:
            reason = f"a loopback hostIP is mapped only with {ENV_LOCALHOST}=true, which is off (docs/hostport.md)"
            raise InvalidArgument(f"{field}.hostIP", host_ip, reason)
        if isinstance(addr, ipaddress.IPv6Address) and addr.scope_id is not None:
            # a zone names one of the node's links: a hostPort answers on the node's addresses, not a link's
            raise InvalidArgument(f"{field}.hostIP", host_ip, "a scoped address (with %ZONE) cannot be a hostIP")
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            # no node has one as its address; nft and Python spell it differently, and it is the key of a mapping
            raise InvalidArgument(f"{field}.hostIP", host_ip, f"an IPv4-mapped address: use {addr.ipv4_mapped}")
        ip = str(addr)
    hport, cport = _port(f"{field}.hostPort", host_port), _port(f"{field}.containerPort", container_port)
    return HostPort(proto, hport, cport, ip)


def _unique(maps: Iterable[HostPort]) -> tuple[HostPort, ...]:
    out = tuple(dict.fromkeys(maps))
    if len(out) > MAX_MAPPINGS:
        raise InvalidArgument("portMappings", f"{len(out)} mappings", f"at most {MAX_MAPPINGS}")
    return out


def from_runtime_config(conf: Mapping[str, Any], localhost: bool = LOCALHOST_DEFAULT) -> tuple[HostPort, ...]:
    """``runtimeConfig.portMappings`` of a CNI config (() when absent); InvalidArgument names the
    entry. ``localhost``: the setting (:func:`localhost_enabled`), off refuses a loopback hostIP."""
    runtime = conf.get("runtimeConfig")
    maps = runtime.get("portMappings") if isinstance(runtime, dict) else None
    if maps is None:
        return ()
    if not isinstance(maps, list):
        raise InvalidArgument("runtimeConfig.portMappings", maps, "must be a list")
    out = []
    for i, m in enumerate(maps):
        field = f"runtimeConfig.portMappings[{i}]"
        if not isinstance(m, dict):
            raise InvalidArgument(field, m, "must be an object")
        # the spec's spelling, else Go's field names (containerd 1.6: go-cni's PortMapping has no JSON tags)
        values = [m.get(key, m.get(key[0].upper() + key[1:])) for key in _KEYS]
        out.append(_one(field, values[0], values[1], values[2], values[3], localhost))
    return _unique(out)


def from_pod(pod: Mapping[str, Any] | None) -> tuple[HostPort, ...]:
    """The hostPorts of a Pod object's containers (ports without a hostPort are not mappings)."""
    spec = (pod or {}).get("spec")
    containers = spec.get("containers") if isinstance(spec, dict) else None
    out = []
    for c in containers if isinstance(containers, list) else []:
        ports = c.get("ports") if isinstance(c, dict) else None
        for i, p in enumerate(ports if isinstance(ports, list) else []):
            if isinstance(p, dict) and p.get("hostPort"):
                field = f"pod.spec.containers[{c.get('name')}].ports[{i}]"
                hip = p.get("hostIP")
                # the member refuses a loopback hostIP under its own setting
                out.append(_one(field, p.get("hostPort"), p.get("containerPort"), p.get("protocol"), hip, True))
    return _unique(out)


def pod_host_ports(env: Mapping[str, str], pod: Mapping[str, Any] | None) -> dict[str, str]:
    """``NETPLUGIN_HOST_PORTS`` from the Pod's spec when the runtime passed none ({} otherwise)."""
    if pod is None or ENV_HOST_PORTS in env:
        return {}
    ports = to_env(from_pod(pod))
    return {ENV_HOST_PORTS: ports} if ports else {}


def localhost_enabled(env: Mapping[str, str]) -> bool:
    """The ``NETPLUGIN_HOSTPORT_LOCALHOST`` setting of a plugin's environment (unset or empty: the default)."""
    raw = env.get(ENV_LOCALHOST, "")
    if not raw:
        return LOCALHOST_DEFAULT
    if raw.lower() not in _FLAGS:
        raise InvalidArgument(ENV_LOCALHOST, raw, "expected true or false")
    return _FLAGS[raw.lower()]


def check_families(maps: Iterable[HostPort], pod_ips: Iterable[str]) -> None:
    """Refuse a mapping whose hostIP is of a family none of the pod's addresses has: it would map
    nothing, yet hold the port (InvalidArgument naming the mapping and the pod's addresses)."""
    ips = list(pod_ips)
    versions = {6 if ":" in ip else 4 for ip in ips}
    for i, m in enumerate(maps):
        if m.host_ip and ipaddress.ip_address(m.host_ip).version not in versions:
            version = ipaddress.ip_address(m.host_ip).version
            reason = f"the pod has no IPv{version} address to map it to (its addresses: {', '.join(ips) or 'none'})"
            raise InvalidArgument(f"{ENV_HOST_PORTS}[{i}].hostIP", m.host_ip, reason)


def unmapped(chain: Iterable[str], value: str, members: tuple[str, str]) -> ConfigError:
    """The error of a pod whose hostPorts (the variable's ``value``) no member of ``chain`` maps: a
    pod must not start without the ports it asked for, nor a second one on the same port.
    ``members``: the hostport members to suggest (the built-in one, the shipped bash one)."""
    names = list(chain)
    entries = [e.split("/") for e in value.split()]
    ports = ", ".join(dict.fromkeys(f"{e[1]}/{e[0]}" for e in entries if len(e) >= 3))
    member, bash = members
    reason = (
        f"the pod asks for hostPorts ({ports}) but no member of the chain ({', '.join(names)}) maps them: "
        f"the hostport member is missing; add {member} (after netplugin.io/bridge) or {bash} (after bridge) "
        f"to plugins, e.g. plugins: [{', '.join(names)}, {member if any('/' in n for n in names) else bash}]"
    )
    return ConfigError("plugins", reason)


def to_env(maps: Iterable[HostPort]) -> str:
    return " ".join(m.entry() for m in maps)


def parse_env(value: str, localhost: bool = LOCALHOST_DEFAULT) -> tuple[HostPort, ...]:
    """The variable's value back into mappings (validated again: it may come from anywhere);
    ``localhost`` as for :func:`from_runtime_config`."""
    out = []
    for i, entry in enumerate(value.split()):
        parts = entry.split("/")
        field = f"{ENV_HOST_PORTS}[{i}]"
        if len(parts) not in (3, 4) or not parts[1].isdigit() or not parts[2].isdigit():
            raise InvalidArgument(field, entry, "expected PROTOCOL/HOSTPORT/CONTAINERPORT[/HOSTIP]")
        hip = parts[3] if len(parts) == 4 else ""
        out.append(_one(field, int(parts[1]), int(parts[2]), parts[0], hip, localhost))
    return _unique(out)
