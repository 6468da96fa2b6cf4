"""Settings of the bridge plugin: defaults, bridge.conf files, NETPLUGIN_BRIDGE_* variables.

Parsed and validated exactly like the bash plugin ``exec_plugins/bridge/bridge`` does, with the
same messages, so the two plugins are interchangeable on a node.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from netplugin.core.errors import NetpluginError

__all__ = ["SETTING_KEYS", "BridgeError", "BridgeSettings", "SettingsError", "host_veth_name", "load_settings"]


SETTING_KEYS = ("NAME", "SUBNET", "GATEWAY", "MTU", "STATE_DIR", "IFNAME", "IP_FORWARD")


_IFNAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,14}\Z")


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
        if short not in SETTING_KEYS:
            raise SettingsError(
                f"{path}:{n}: unknown key '{key}' "
                f"(known: {', '.join(SETTING_KEYS)}, optionally prefixed NETPLUGIN_BRIDGE_)"
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
    for key in SETTING_KEYS:
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
