"""Settings of the bridge plugin: defaults, bridge.conf files, NETPLUGIN_BRIDGE_* variables.

Parsed and validated exactly like the bash plugin ``exec_plugins/bridge/bridge`` does, with the
same messages, so the two plugins are interchangeable on a node.

SUBNET is one network or an IPv4 and an IPv6 network separated by a comma (dual stack; the
first is the primary family, as in Kubernetes' ``podCIDRs``), or ``node``: the node's pod CIDRs
from NETPLUGIN_NODE_POD_CIDRS, which netplugin passes to every call. GATEWAY is empty (the
first address of each subnet) or a comma list of at most one address per family.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from netplugin.core.defaults import DEFAULT_STATE_DIR
from netplugin.core.errors import NetpluginError
from netplugin.core.names import infra_id_digest

__all__ = [
    "SETTING_KEYS",
    "BridgeError",
    "BridgeSettings",
    "SettingsError",
    "bridge_mac",
    "host_veth_name",
    "load_settings",
    "parse_gateways",
    "parse_subnets",
]


SETTING_KEYS = ("NAME", "SUBNET", "GATEWAY", "MTU", "STATE_DIR", "IFNAME", "IP_FORWARD", "BR_NETFILTER")


_IFNAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,14}\Z")


def host_veth_name(infra_id: str) -> str:
    """``np`` + the first 12 hex digits of FNV-1a-64 of the infra id (the bash plugin's rule)."""
    return f"np{infra_id_digest(infra_id)}"[:14]


def bridge_mac(name: str) -> str:
    """The MAC a bridge is created with: the 48 bits of :func:`host_veth_name` of its name, made a
    locally administered unicast address (the bash plugin's rule). A bridge made again (by a repair,
    or after a reboot) keeps its MAC, so the pods' neighbour entries for the gateway stay right."""
    x = host_veth_name(name)[2:]
    return ":".join([f"{(int(x[:2], 16) & 0xFC) | 2:02x}", *(x[i : i + 2] for i in range(2, 12, 2))])


class BridgeError(NetpluginError):
    """The bridge plugin cannot do what was asked; the message says why (as the bash plugin's would)."""


class SettingsError(BridgeError):
    """A bridge setting is invalid; the message names the variable (or file and line)."""


Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True, slots=True)
class BridgeSettings:
    """Validated settings; build with :func:`load_settings` (``load_settings({})`` are the defaults)."""

    name: str
    #: one network per family, the primary family first
    subnets: tuple[Network, ...]
    #: the bridge's address in each of ``subnets`` (same order)
    gateways: tuple[Address, ...]
    #: None: ``auto``, the underlay's (computed by init, recorded in :attr:`mtu_record`)
    mtu: int | None
    state_dir: str
    ifname: str
    ip_forward: bool
    br_netfilter: bool = True

    @property
    def ipam_dir(self) -> str:
        return os.path.join(self.state_dir, self.name)

    @property
    def mtu_record(self) -> str:
        """Where init records the MTU it found (``auto``), for setup to use."""
        return os.path.join(self.ipam_dir, "mtu")

    @property
    def subnet(self) -> Network:
        """The primary family's subnet."""
        return self.subnets[0]

    @property
    def gateway(self) -> Address:
        """The primary family's gateway."""
        return self.gateways[0]

    def subnet_of(self, version: int) -> Network | None:
        return next((n for n in self.subnets if n.version == version), None)

    def to_env(self) -> dict[str, str]:
        """The settings as the bash plugin's ``config`` action prints them."""
        return {
            "NETPLUGIN_BRIDGE_NAME": self.name,
            "NETPLUGIN_BRIDGE_SUBNET": ",".join(str(n) for n in self.subnets),
            "NETPLUGIN_BRIDGE_GATEWAY": ",".join(str(g) for g in self.gateways),
            "NETPLUGIN_BRIDGE_MTU": "auto" if self.mtu is None else str(self.mtu),
            "NETPLUGIN_BRIDGE_STATE_DIR": self.state_dir,
            "NETPLUGIN_BRIDGE_IFNAME": self.ifname,
            "NETPLUGIN_BRIDGE_IP_FORWARD": "true" if self.ip_forward else "false",
            "NETPLUGIN_BRIDGE_BR_NETFILTER": "true" if self.br_netfilter else "false",
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
        if short not in SETTING_KEYS:
            raise SettingsError(
                f"{path}:{n}: unknown key '{key}' "
                f"(known: {', '.join(SETTING_KEYS)}, optionally prefixed NETPLUGIN_BRIDGE_)"
            )
        into[short] = value


# --- subnets and gateways (the bash plugin's parse_subnets / parse_gateways) ------------------------

_EXAMPLES = {4: "an IPv4 network like 10.244.0.0/24", 6: "an IPv6 network like fd00:10:244:1::/64"}
#: prefix lengths a bridge subnet may have: a gateway and at least one pod must fit
PREFIX_RANGE = {4: (8, 30), 6: (48, 126)}
_PLEN_DIGITS = {4: 2, 6: 3}


def _parse_addr(text: str, version: int) -> Address | None:
    """An address as the bash plugin reads it: dotted quad; or hex groups, no zone, no IPv4 tail."""
    try:
        if version == 4:
            return ipaddress.IPv4Address(text)
        if "." in text or "%" in text:
            return None
        return ipaddress.IPv6Address(text)
    except ValueError:
        return None


def _one_subnet(entry: str, version: int) -> tuple[Network | None, str]:
    """The network, or None and the reason (the bash plugin's add_subnet4/add_subnet6)."""
    addr_text, sep, plen_text = entry.partition("/")
    addr = _parse_addr(addr_text, version) if sep else None
    if addr is None or not re.fullmatch(f"[0-9]{{1,{_PLEN_DIGITS[version]}}}", plen_text):
        return None, f"expected {_EXAMPLES[version]}"
    prefix = int(plen_text, 10)
    low, high = PREFIX_RANGE[version]
    if not low <= prefix <= high:
        return None, f"prefix length must be {low}-{high} (a gateway and at least one pod)"
    net = ipaddress.ip_network(f"{addr}/{prefix}", strict=False)
    if net.network_address != addr:
        return None, f"host bits are set (did you mean {net}?)"
    return net, ""


def parse_subnets(value: str, what: str, note: str = "") -> tuple[Network, ...]:
    """A comma list of at most one IPv4 and one IPv6 network; messages name ``what``."""
    if not value:
        raise SettingsError(
            f"invalid {what} ''{note}: expected a network like 10.244.0.0/24, "
            "or an IPv4 and an IPv6 network separated by a comma"
        )
    head = f"invalid {what} '{value}'{note}: "
    if value.startswith(",") or value.endswith(",") or ",," in value:
        raise SettingsError(head + "empty entry")
    label = "," in value
    out: list[Network] = []
    for raw in value.split(","):
        entry = raw.strip()
        version = 6 if ":" in entry else 4 if "." in entry else 0
        if not version:
            raise SettingsError(
                head + (f"{entry}: " if label else "") + f"expected {_EXAMPLES[4]} or {_EXAMPLES[6]}"
            )
        if any(n.version == version for n in out):
            raise SettingsError(head + f"more than one IPv{version} network (at most one per family)")
        net, reason = _one_subnet(entry, version)
        if net is None:
            raise SettingsError(head + (f"{entry}: " if label else "") + reason)
        out.append(net)
    return tuple(out)


def parse_gateways(value: str, subnets: Sequence[Network]) -> tuple[Address, ...]:
    """The gateway of each subnet (same order): from ``value`` (a comma list) or the first host."""
    head = f"invalid NETPLUGIN_BRIDGE_GATEWAY '{value}': "
    if value.startswith(",") or value.endswith(",") or ",," in value:
        raise SettingsError(head + "empty entry")
    listed = ",".join(str(n) for n in subnets)
    given: dict[int, Address] = {}
    for raw in value.split(",") if value else []:
        entry = raw.strip()
        gw = _parse_addr(entry, 4) or _parse_addr(entry, 6)
        if gw is None:
            raise SettingsError(head + "expected an IPv4 or IPv6 address")
        if gw.version in given:
            raise SettingsError(head + f"more than one IPv{gw.version} address")
        net = next((n for n in subnets if n.version == gw.version), None)
        if net is None:
            raise SettingsError(head + f"{entry}: there is no IPv{gw.version} subnet ({listed})")
        first, last = _host_range(net)
        # IPv6: any address of the subnet but the subnet-router anycast address (the first).
        if gw not in net or gw == net.network_address or (net.version == 4 and not first <= int(gw) <= last):
            raise SettingsError(head + f"not a host address of {net}")
        given[gw.version] = gw
    return tuple(given.get(n.version) or n.network_address + 1 for n in subnets)


def _host_range(net: Network) -> tuple[int, int]:
    if net.version == 4:
        return int(net.network_address) + 1, int(net.broadcast_address) - 1
    return int(net.network_address) + 1, int(net.broadcast_address)


def _flag(raw: Mapping[str, str], key: str) -> bool:
    value = raw[key].lower()
    if value not in ("true", "yes", "1", "false", "no", "0"):
        raise SettingsError(f"invalid NETPLUGIN_BRIDGE_{key} '{raw[key]}': expected true or false")
    return value in ("true", "yes", "1")


def _raw_settings(env: Mapping[str, str], conf_files: Sequence[str]) -> dict[str, str]:
    """The settings' raw values: defaults, then ``conf_files``, then non-empty ``NETPLUGIN_BRIDGE_*``."""
    raw: dict[str, str] = {
        "NAME": "cbr0",
        "SUBNET": "10.244.0.0/24",
        "GATEWAY": "",
        "MTU": "auto",
        "STATE_DIR": (env.get("NETPLUGIN_STATE_DIR") or DEFAULT_STATE_DIR) + "/bridge",
        "IFNAME": "eth0",
        "IP_FORWARD": "true",
        "BR_NETFILTER": "true",
    }
    for path in conf_files:
        _read_conf_file(path, raw)
    for key in SETTING_KEYS:
        value = env.get("NETPLUGIN_BRIDGE_" + key)
        if value:
            raw[key] = value
    return raw


def _bad(raw: Mapping[str, str], key: str, reason: str) -> SettingsError:
    return SettingsError(f"invalid NETPLUGIN_BRIDGE_{key} '{raw[key]}': {reason}")


def _subnets(raw: Mapping[str, str], env: Mapping[str, str], subnets_optional: bool) -> tuple[Network, ...]:
    """SUBNET's networks, or the node's pod CIDRs for ``node`` (none when optional and unknown)."""
    if raw["SUBNET"] != "node":
        return parse_subnets(raw["SUBNET"], "NETPLUGIN_BRIDGE_SUBNET")
    if env.get("NETPLUGIN_NODE_POD_CIDRS"):
        return parse_subnets(
            env["NETPLUGIN_NODE_POD_CIDRS"], "NETPLUGIN_NODE_POD_CIDRS", " (from NETPLUGIN_BRIDGE_SUBNET=node)"
        )
    if subnets_optional:
        return ()
    node = env.get("NETPLUGIN_NODE_NAME")
    raise SettingsError(
        "NETPLUGIN_BRIDGE_SUBNET is 'node' but NETPLUGIN_NODE_POD_CIDRS is not set: the node "
        + (f"{node!r} " if node else "")
        + "has no pod CIDRs (spec.podCIDRs) or netplugin does not know the node; a cluster gives every "
        "Node its pod CIDRs with kube-controller-manager --allocate-node-cidrs (and --cluster-cidr), "
        "or they are set by hand"
    )


def _mtu(raw: Mapping[str, str], subnets: tuple[Network, ...]) -> int | None:
    """MTU's value: None for ``auto``, else an integer 68-65535 (at least 1280 with IPv6)."""
    if raw["MTU"].lower() == "auto":
        return None
    if not re.fullmatch(r"[0-9]{1,5}", raw["MTU"]) or not 68 <= int(raw["MTU"], 10) <= 65535:
        raise _bad(raw, "MTU", "expected auto or an integer 68-65535")
    mtu = int(raw["MTU"], 10)
    if any(n.version == 6 for n in subnets) and mtu < 1280:
        raise _bad(raw, "MTU", "IPv6 needs at least 1280")
    return mtu


def load_settings(
    env: Mapping[str, str], conf_files: Sequence[str] = (), *, subnets_optional: bool = False
) -> BridgeSettings:
    """Settings from the defaults, ``conf_files`` (in rising precedence) and ``env``.

    Validation and messages follow the bash plugin's ``validate_settings``. With
    ``subnets_optional`` (teardown and status), SUBNET=node without node pod CIDRs (the Node is
    gone) gives no subnets instead of an error: a teardown releases what the pod's records hold,
    a status reads the interface.
    """
    raw = _raw_settings(env, conf_files)
    for key in ("NAME", "IFNAME"):
        if not _IFNAME.match(raw[key]):
            raise _bad(raw, key, "1-15 characters of letters, digits, '_', '.', '-'")
    subnets = _subnets(raw, env, subnets_optional)
    gateways = parse_gateways(raw["GATEWAY"], subnets) if subnets else ()
    mtu = _mtu(raw, subnets)

    state_dir = raw["STATE_DIR"]
    if not state_dir.startswith("/"):
        raise _bad(raw, "STATE_DIR", "must be an absolute path")
    state_dir = state_dir.rstrip("/")
    if not state_dir:
        raise SettingsError("invalid NETPLUGIN_BRIDGE_STATE_DIR '/': refusing the root directory")

    flags = {key: _flag(raw, key) for key in ("IP_FORWARD", "BR_NETFILTER")}
    return BridgeSettings(
        name=raw["NAME"],
        subnets=subnets,
        gateways=gateways,
        mtu=mtu,
        state_dir=state_dir,
        ifname=raw["IFNAME"],
        ip_forward=flags["IP_FORWARD"],
        br_netfilter=flags["BR_NETFILTER"],
    )
