"""Parsing a ``status`` action's stdout (or a ``setup``'s) into a :class:`~netplugin.core.plugin.PodNetworkStatus`.

The document's shape is part of the contract (``docs/plugin-contract.md``, "Exit status and
output" and "Chains"); this is the one parser of it, for both actions.
"""

from __future__ import annotations

# Imports inside this module's functions are kept for the per-call import set
# (tests/frontends/fastpath.py): each keeps a module off the calls that do not need it
# (BENCHMARKS.md rows B-i and B: the CLI's cold start and per-pod run without a daemon).
import json
from collections.abc import Callable
from typing import Any

from netplugin.core.chaining import host_interface
from netplugin.core.errors import TAIL, PluginOutputError
from netplugin.core.plaindata import replace
from netplugin.core.plugin import PodNetworkStatus

__all__ = ["parse_setup_document", "parse_status"]


def parse_status(stdout: bytes, *, plugin: str, pod: str = "", action: str = "status") -> PodNetworkStatus | None:
    """Parse a ``status`` action's stdout (or a ``setup``'s). Empty output means "no information" (None).

    Raises :class:`PluginOutputError` naming the offending value.
    """
    text_bytes = stdout.strip()
    if not text_bytes:
        return None

    def bad(msg: str) -> PluginOutputError:
        where = f" for pod {pod}" if pod else ""
        return PluginOutputError(
            f"network plugin {plugin!r} {action}{where}: {msg}",
            plugin=plugin,
            action=action,
            stdout_tail=text_bytes[-TAIL:].decode("utf-8", "replace"),
        )

    try:
        doc = json.loads(text_bytes)
    except (ValueError, RecursionError) as e:
        raise bad(f"output is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise bad(f"output must be a JSON object, got {type(doc).__name__}")
    kind = doc.get("kind", "")
    if kind not in ("", "PodNetworkStatus"):
        raise bad(f"invalid 'kind' {kind!r} (expected 'PodNetworkStatus')")
    version = doc.get("apiVersion", "")
    if version not in ("", "v1beta1"):
        raise bad(f"unknown 'apiVersion' {version!r} (expected 'v1beta1')")
    ips = _status_ips(doc.get("ips"), bad)
    hif = host_interface(doc.get("hostInterface"), plugin=plugin, action=action, out=text_bytes)
    if "ip" not in doc:
        if not ips:
            raise bad("no 'ip' in status")
        return PodNetworkStatus(ip=ips[0], ips=ips, host_interface=hif)
    ip = _status_ip(doc["ip"], "'ip'", bad)
    if ips and ips[0] != ip:
        raise bad(f"invalid 'ip' {doc['ip']!r}: must be the first of 'ips' {list(ips)!r}")
    return PodNetworkStatus(ip=ip, ips=ips, host_interface=hif)


def parse_setup_document(stdout: bytes, *, plugin: str, pod: str = "") -> PodNetworkStatus | None:
    """The status document a ``setup`` printed (the contract's setup document), or None.

    Only a JSON object with ``"kind": "PodNetworkStatus"`` is the document; any other output is
    ignored as before the extension (status is asked). A bad ``hostInterface`` raises
    :class:`PluginOutputError`: later chain members and every teardown would act on it, and
    nothing else reports it. A bad status part only costs the status exec, whose own error then
    says what is wrong.
    """
    text = stdout.strip()
    if not text.startswith(b"{"):
        return None  # progress text of a plugin that reports nothing (the kubelet logged it)
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or doc.get("kind") != "PodNetworkStatus":
        return None
    host_interface(doc.get("hostInterface"), plugin=plugin, action="setup", out=text)
    try:
        status = parse_status(text, plugin=plugin, pod=pod, action="setup")
    except PluginOutputError:
        return None
    mac = doc.get("mac")
    if status is not None and isinstance(mac, str) and _unicast_mac(mac):
        status = replace(status, mac=mac.lower())
    return status


def _unicast_mac(text: str) -> bool:
    """Six colon-separated hex pairs, not a multicast (or broadcast) address, not all zeros."""
    pairs = text.split(":")
    if len(pairs) != 6 or any(len(p) != 2 or p.strip("0123456789abcdefABCDEF") for p in pairs):
        return False
    return not int(pairs[0], 16) & 1 and any(int(p, 16) for p in pairs)


def _status_ip(value: Any, what: str, bad: Callable[[str], PluginOutputError]) -> str:
    """One address of a status document, in canonical form."""
    if not isinstance(value, str):
        raise bad(f"invalid {what} {value!r}: must be a string")
    import ipaddress

    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise bad(f"invalid {what} {value!r}: not an IPv4 or IPv6 address") from None


def _status_ips(value: Any, bad: Callable[[str], PluginOutputError]) -> tuple[str, ...]:
    """The optional ``ips`` list: addresses, at most one per family."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise bad(f"invalid 'ips' {value!r}: must be a list of addresses")
    out = tuple(_status_ip(v, "address in 'ips'", bad) for v in value)
    families = [":" in ip for ip in out]
    if len(set(families)) != len(families):
        raise bad(f"invalid 'ips' {value!r}: at most one IPv4 and one IPv6 address")
    return out
