"""What a chain member declares (its action mask) and what a chain passes along (the prev result).

In detail: ``ARCHITECTURE.md``, "Module notes".

Part of the plugin contract (``docs/plugin-contract.md`` describes the semantics); this module
holds the two documents' shapes, their parsers and the environment variables that carry them, so
the manager, the built-in plugins and the tests share one definition.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from netplugin.core.errors import TAIL, PluginOutputError
from netplugin.core.plaindata import dataclass, field

__all__ = [
    "ALL_POD_ACTIONS",
    "CHAIN_ENV",
    "DECLARATIONS",
    "DECLARES_HOST_PORTS",
    "ENV_CHAIN",
    "ENV_CHAIN_INDEX",
    "ENV_PREV_HOST_INTERFACE",
    "ENV_PREV_IPS",
    "ENV_PREV_RESULT",
    "MASK_NAMES",
    "OPT_IN_ACTIONS",
    "MemberResult",
    "PrevResult",
    "parse_actions",
    "repair_lines",
]

ENV_CHAIN = "NETPLUGIN_CHAIN"
ENV_CHAIN_INDEX = "NETPLUGIN_CHAIN_INDEX"
ENV_PREV_RESULT = "NETPLUGIN_PREV_RESULT"
ENV_PREV_IPS = "NETPLUGIN_PREV_IPS"
ENV_PREV_HOST_INTERFACE = "NETPLUGIN_PREV_HOST_INTERFACE"
#: set per call by the manager; an outer value must never leak into a plugin
CHAIN_ENV = (ENV_CHAIN, ENV_CHAIN_INDEX, ENV_PREV_RESULT, ENV_PREV_IPS, ENV_PREV_HOST_INTERFACE)

#: the pod actions a mask may name (``init`` always runs: it is where the mask is declared)
ALL_POD_ACTIONS = frozenset({"setup", "teardown", "status"})
#: actions a member handles only when its mask names them (plugins written before them never declare them):
#: ``repair`` (a pod's) and ``node`` (the member's node-level state, no pod)
OPT_IN_ACTIONS = frozenset({"repair", "node"})
#: the mask's word for "this member maps the pod's hostPorts (NETPLUGIN_HOST_PORTS)"
DECLARES_HOST_PORTS = "hostports"
#: what a mask may declare besides actions: what the member takes (never an action it is called for)
DECLARATIONS = frozenset({DECLARES_HOST_PORTS})
#: every word a mask may hold
MASK_NAMES = ALL_POD_ACTIONS | OPT_IN_ACTIONS | DECLARATIONS
_IFNAME = re.compile(r"[^\s/:]{1,15}\Z")


def _bad(plugin: str, action: str, msg: str, out: bytes) -> PluginOutputError:
    return PluginOutputError(
        f"network plugin {plugin!r} {action}: {msg}",
        plugin=plugin,
        action=action,
        stdout_tail=out[-TAIL:].decode("utf-8", "replace"),
    )


def parse_actions(stdout: bytes, *, plugin: str) -> frozenset[str]:
    """The pod actions an ``init`` output declares; empty output declares all of them."""
    text = stdout.strip()
    if not text:
        return ALL_POD_ACTIONS
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise _bad(plugin, "init", f"output is not JSON: {e}", text) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("actions"), list):
        raise _bad(plugin, "init", 'output must be {"actions": [...]} (or nothing)', text)
    names = doc["actions"]
    if not all(isinstance(a, str) for a in names):
        raise _bad(plugin, "init", "'actions' must be a list of action names (strings)", text)
    unknown = [a for a in names if a not in MASK_NAMES and a != "init"]
    if unknown:
        known = ", ".join(sorted(MASK_NAMES))
        raise _bad(plugin, "init", f"unknown action(s) {unknown!r:.120} in 'actions' (known: {known})", text)
    out = frozenset(a for a in names if a in MASK_NAMES)
    if "setup" in out and "teardown" not in out:
        raise _bad(plugin, "init", "'actions' has setup but not teardown (rollback must undo setup)", text)
    return out


#: a repair's report is short: more lines, or longer ones, are cut (the output is the member's, untrusted)
_REPAIR_LINES = 32
_REPAIR_LINE = 200


def repair_lines(stdout: bytes) -> tuple[str, ...]:
    """What a member's ``repair`` put back: its non-empty stdout lines (``KIND: what``), bounded."""
    text = stdout.decode("utf-8", "replace")
    lines = [line.strip()[:_REPAIR_LINE] for line in text.splitlines() if line.strip()]
    return tuple(lines[:_REPAIR_LINES])


def host_interface(value: Any, *, plugin: str, action: str, out: bytes) -> str | None:
    """A reported ``hostInterface``: a Linux interface name (1-15 bytes, no space, '/' or ':')."""
    if value is None:
        return None
    if not isinstance(value, str) or not _IFNAME.match(value) or value in (".", ".."):
        raise _bad(plugin, action, f"invalid 'hostInterface' {value!r:.80}: not an interface name", out)
    return value


@dataclass(frozen=True, slots=True)
class MemberResult:
    """What one member's setup reported."""

    plugin: str
    ips: tuple[str, ...] = ()
    host_interface: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"plugin": self.plugin, "ips": list(self.ips), "hostInterface": self.host_interface}


@dataclass(frozen=True)
class PrevResult:
    """What the members before one member reported, and the names of the whole chain."""

    chain: tuple[str, ...]
    netns: str = ""
    members: tuple[MemberResult, ...] = field(default=())

    @property
    def ips(self) -> tuple[str, ...]:
        return next((m.ips for m in self.members if m.ips), ())

    @property
    def host_interface(self) -> str | None:
        return next((m.host_interface for m in self.members if m.host_interface), None)

    def before(self, index: int, results: Iterable[MemberResult | None]) -> PrevResult:
        """The prev result member ``index`` (from 0) sees: the reports of members 0..index-1."""
        got = [r for i, r in enumerate(results) if i < index and r is not None]
        return PrevResult(self.chain, self.netns, tuple(got))

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "NetpluginPrevResult",
            "netns": self.netns,
            "ips": list(self.ips),
            "hostInterface": self.host_interface,
            "members": [m.to_dict() for m in self.members],
        }

    def env(self, index: int) -> Mapping[str, str]:
        """The variables of member ``index`` (from 0)."""
        return {
            ENV_CHAIN: ",".join(self.chain),
            ENV_CHAIN_INDEX: str(index + 1),
            ENV_PREV_RESULT: json.dumps(self.to_dict(), separators=(",", ":")),
            ENV_PREV_IPS: ",".join(self.ips),
            ENV_PREV_HOST_INTERFACE: self.host_interface or "",
        }
