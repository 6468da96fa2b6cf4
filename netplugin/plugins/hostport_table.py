"""The hostport members' nftables table, ``inet netplugin_hostport``: the nft text that makes it,
and what the kernel holds of it. The bash member ``exec_plugins/hostport`` writes the same text.

A pod's mappings are keyed as the kubelet and the scheduler key hostPorts: protocol, port and
hostIP. A mapping with a hostIP is an element of ``ports4`` or ``ports6`` (address . protocol .
port), one without of ``ports`` (protocol . port); prerouting and output look the addressed maps
up first, so that 10.0.0.5:80 may be one pod's and 127.0.0.1:80 another's. Each map's keys are
unique, so the kernel refuses a second pod on the same key (``add element``: EBUSY). A mapping
without hostIP also conflicts with every hostIP of its protocol and port, which no map key can
say: the member checks that from the records under the table lock (:func:`conflicts`).

A key as the records write it (line 2): ``tcp.8080`` (no hostIP: the only form older records have)
or ``tcp.8080@10.0.0.5`` / ``udp.53@fd00::5``.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
from collections.abc import Sequence
from typing import Any

from netplugin.core.errors import NetpluginError
from netplugin.core.hostports import HOSTPORT_TABLE, HostPort
from netplugin.core.names import infra_id_digest

__all__ = [
    "HAIRPIN_MARK",
    "MAPS",
    "TABLE",
    "add_elements",
    "base_rules",
    "base_script",
    "chain_name",
    "conflicts",
    "describe",
    "element",
    "kernel_table",
    "key",
    "pod_rules",
    "pod_script",
    "ports_held",
    "run_nft",
]

TABLE = HOSTPORT_TABLE
HAIRPIN_MARK = "0x2000"
#: map name -> its key type: the addressed maps first, as the base chains look them up
MAPS = {
    "ports4": "ipv4_addr . inet_proto . inet_service",
    "ports6": "ipv6_addr . inet_proto . inet_service",
    "ports": "inet_proto . inet_service",
}
_LOOKUP = {"ports4": "ip daddr . ", "ports6": "ip6 daddr . ", "ports": ""}
_BASE = (
    f"add table {TABLE}\n"
    + "".join(f"add map {TABLE} {name} {{ type {kind} : verdict; }}\n" for name, kind in MAPS.items())
    + f"""add chain {TABLE} prerouting {{ type nat hook prerouting priority dstnat; policy accept; }}
add chain {TABLE} output {{ type nat hook output priority -100; policy accept; }}
add chain {TABLE} postrouting {{ type nat hook postrouting priority srcnat; policy accept; }}
add chain {TABLE} guard {{ type filter hook input priority filter; policy accept; }}
flush chain {TABLE} prerouting
flush chain {TABLE} output
flush chain {TABLE} postrouting
flush chain {TABLE} guard
"""
)
#: kube-proxy's guard for route_localnet (always in: it also covers a route_localnet the setting left on)
_GUARD = f"""add rule {TABLE} guard ip daddr 127.0.0.0/8 ip saddr != 127.0.0.0/8 ct status & dnat != dnat \
ct state != {{ established, related }} drop
add rule {TABLE} postrouting meta mark & {HAIRPIN_MARK} == {HAIRPIN_MARK} masquerade
add rule {TABLE} postrouting ip saddr 127.0.0.0/8 ct status dnat masquerade
"""


def base_script(localhost: bool) -> str:
    """The table's maps and base chains, rewritten. 127.0.0.0/8 is DNATed only in ``output`` (what
    the node itself sends: a packet to 127.0.0.1 arriving from a link must not be DNATed into a pod
    that mapped hostIP 127.0.0.1 for the node alone) and only when ``localhost`` (the setting
    ``NETPLUGIN_HOSTPORT_LOCALHOST``); ::1 never (IPv6 has no route_localnet)."""
    lines = [_BASE.rstrip("\n")]
    for chain in ("prerouting", "output"):
        skip = ["ip6 daddr ::1"] if localhost and chain == "output" else ["ip daddr 127.0.0.0/8", "ip6 daddr ::1"]
        lines += [f"add rule {TABLE} {chain} {match} return" for match in skip]
        lines += [f"add rule {TABLE} {chain} fib daddr type local {_LOOKUP[m]}meta l4proto . th dport vmap @{m}"
                  for m in MAPS]  # fmt: skip
    return "\n".join(lines) + "\n" + _GUARD


def base_rules(localhost: bool) -> dict[str, int]:
    """How many rules each base chain holds (what :func:`base_script` writes)."""
    counts: dict[str, int] = {}
    for line in base_script(localhost).splitlines():
        if line.startswith(f"add rule {TABLE} "):
            chain = line.split()[4]
            counts[chain] = counts.get(chain, 0) + 1
    return counts


def chain_name(infra_id: str) -> str:
    """``pod_`` + 12 hex digits of FNV-1a-64 of the infra id (the bash plugin's rule)."""
    return f"pod_{infra_id_digest(infra_id)}"[:16]


def key(m: HostPort) -> str:
    """The record's key of a mapping (``tcp.8080``, ``tcp.8080@10.0.0.5``)."""
    return f"{m.protocol}.{m.host_port}@{m.host_ip}" if m.host_ip else f"{m.protocol}.{m.host_port}"


def element(k: str) -> tuple[str, str]:
    """(map, element) of a key: ``("ports4", "10.0.0.5 . tcp . 8080")``, ``("ports", "tcp . 8080")``."""
    port, _, ip = k.partition("@")
    base = port.replace(".", " . ")
    if not ip:
        return "ports", base
    return ("ports6" if ":" in ip else "ports4"), f"{ip} . {base}"


def conflicts(a: str, b: str) -> bool:
    """Whether two keys cannot be two pods' (Kubernetes' HostPortInfo): the same protocol and port,
    and the same hostIP or either without one (0.0.0.0 and :: are "without": every address)."""
    (pa, _, ia), (pb, _, ib) = a.partition("@"), b.partition("@")
    return pa == pb and (not ia or not ib or ia == ib)


def describe(k: str) -> str:
    """A key as a message says it: ``8080/tcp`` or ``8080/tcp on 10.0.0.5``."""
    port, _, ip = k.partition("@")
    proto, _, number = port.partition(".")
    return f"{number}/{proto} on {ip}" if ip else f"{number}/{proto}"


def pod_rules(chain: str, maps: Sequence[HostPort], ips: Sequence[str]) -> list[str]:
    """The pod's ``add rule`` lines: per mapping and pod address of its family, the hairpin mark and the DNAT."""
    out = []
    for m in maps:
        for ip in ips:
            fam, nfp = ("ip6", "ipv6") if ":" in ip else ("ip", "ipv4")
            if m.host_ip and (":" in m.host_ip) != (fam == "ip6"):
                continue
            match = f"meta nfproto {nfp} meta l4proto {m.protocol} th dport {m.host_port}"
            if m.host_ip:
                match += f" {fam} daddr {m.host_ip}"
            to = f"[{ip}]" if fam == "ip6" else ip
            out.append(f"add rule {TABLE} {chain} {match} {fam} saddr {ip} meta mark set meta mark | {HAIRPIN_MARK}")
            out.append(f"add rule {TABLE} {chain} {match} dnat {fam} to {to}:{m.container_port}")
    return out


def add_elements(chain: str, keys: Sequence[str]) -> list[str]:
    """The ``add element`` lines pointing ``keys`` at ``chain``."""
    return [f"add element {TABLE} {m} {{ {e} : jump {chain} }}" for m, e in map(element, keys)]


def pod_script(chain: str, keys: Sequence[str], rules: Sequence[str]) -> str:
    """One pod's setup as one transaction: its chain rewritten, ``keys`` pointing at it. ``add
    element`` of a key another pod's chain holds fails (EBUSY); of one this pod holds, it does not."""
    lines = [f"add chain {TABLE} {chain}", f"flush chain {TABLE} {chain}", *rules, *add_elements(chain, keys)]
    return "\n".join(lines) + "\n"


def run_nft(cmd: str, script: str) -> str:
    """Run ``nft -f -``; the stderr of a failure, "" on success. OSError and timeouts raise NetpluginError."""
    try:
        done = subprocess.run([cmd, "-f", "-"], input=script, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NetpluginError(f"cannot run {cmd}: {e}") from e
    return done.stderr.strip() if done.returncode != 0 else ""


def _list(cmd: str, *what: str) -> list[dict[str, Any]] | None:
    """The items of ``nft -j list WHAT``; None when nft says there is no such thing."""
    try:
        out = subprocess.run([cmd, "-j", "list", *what], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NetpluginError(f"cannot run {cmd}: {e}") from e
    if out.returncode != 0:
        return None
    try:
        items: list[dict[str, Any]] = json.loads(out.stdout)["nftables"]
    except (ValueError, KeyError, TypeError) as e:
        raise NetpluginError(f"cannot read nftables table {TABLE}: {e}") from e
    return items


def _elements(items: list[dict[str, Any]], complete: bool = True) -> dict[str, str] | None:
    """Key -> the chain it jumps to, of the table's maps among ``items``. None when one of them is
    missing (no table, or one an older version made: a setup then makes it again), or, when not
    ``complete``, only when all are."""
    family, name = TABLE.split()
    found: dict[str, dict[str, str]] = {}
    for item in items:
        m = item.get("map")
        if not m or m.get("family") != family or m.get("table") != name or m.get("name") not in MAPS:
            continue
        held = found.setdefault(m["name"], {})
        for k, verdict in m.get("elem", []):
            *ip, proto, port = k["concat"]
            text = f"{proto}.{port}" + (f"@{ipaddress.ip_address(ip[0])}" if ip else "")
            held[text] = verdict.get("jump", {}).get("target", "")
    if (set(found) != set(MAPS)) if complete else not found:
        return None
    return {k: c for held in found.values() for k, c in held.items()}


def kernel_table(cmd: str) -> tuple[dict[str, int], dict[str, str]] | None:
    """(chain -> rule count, key -> the chain it jumps to) of the table in the kernel; None: no table."""
    items = _list(cmd, "table", *TABLE.split())
    if items is None:
        return None
    chains: dict[str, int] = {}
    for item in items:
        if "chain" in item:
            chains.setdefault(item["chain"]["name"], 0)
        elif "rule" in item:
            chains[item["rule"]["chain"]] = chains.get(item["rule"]["chain"], 0) + 1
    return chains, _elements(items) or {}


def ports_held(cmd: str, complete: bool = True) -> dict[str, str] | None:
    """Key -> the chain holding it, from the kernel's maps; None when the table or one of its maps
    is not there (not ``complete``: when none of them is, so that a teardown still finds its
    elements in the one map an older version made)."""
    items = _list(cmd, "maps", TABLE.split()[0])
    return None if items is None else _elements(items, complete)
