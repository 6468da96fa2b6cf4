"""``netplugin.io/hostport``: a pod's hostPorts DNATed with nftables, in process.

The same table, chain names, rules and records as the bash plugin ``exec_plugins/hostport/hostport``
(its README section says what a mapping does and how conflicts are refused), so the two are
interchangeable on a node and either can follow either bridge in a chain. What this one adds:

* ``init`` rebuilds the whole table from the pod records in one nft transaction (``table``;
  ``delete table``; the table with every recorded pod's chain and map elements): after a reboot,
  a ``nft flush ruleset`` or a firewall reload, the daemon's start brings every hostPort back.
  :func:`rebuild_script` is what :meth:`HostPortPlugin.init` runs, and what the uninstall and
  self-repair can call (:func:`remove_table` takes it away).
* with ``NETPLUGIN_HOSTPORT_LOCALHOST=true``, ``init`` also turns ``route_localnet`` back on for
  the recorded pods' bridges (a bridge made again after a reboot starts with it off).
* no bash: one ``nft`` process a setup or teardown.

A record, ``$NETPLUGIN_STATE_DIR/hostport/<chain>``: line 1 ``namespace/name infra-id``, line 2
the pod's keys (``tcp.8080 udp.53``), then the pod's ``add rule`` lines (its DNAT rules).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Sequence

from netplugin.core.chaining import DECLARES_HOST_PORTS
from netplugin.core.defaults import DEFAULT_STATE_DIR
from netplugin.core.errors import NetpluginError, PluginFailed
from netplugin.core.fileio import atomic_write
from netplugin.core.hostports import (
    ENV_HOST_PORTS,
    HOSTPORT_TABLE,
    LOCALHOST_DEFAULT,
    HostPort,
    check_families,
    localhost_enabled,
    parse_env,
)
from netplugin.core.names import PodRef
from netplugin.core.plugin import CallContext, PodNetworkStatus

__all__ = [
    "HOSTPORT_NAME",
    "TABLE",
    "HostPortPlugin",
    "base_script",
    "chain_name",
    "forget",
    "pod_script",
    "rebuild_script",
    "recorded_ipv4",
    "recorded_pods",
    "remove_table",
    "restore_table",
]

HOSTPORT_NAME = "netplugin.io/hostport"
TABLE = HOSTPORT_TABLE
HAIRPIN_MARK = "0x2000"
_DNAT4 = re.compile(r" dnat ip to (\d+\.\d+\.\d+\.\d+):\d+$")
_ELEMENT = re.compile(r"(tcp|udp|sctp) \. (\d+) : jump (pod_[0-9a-f]+)")
_BASE = f"""add table {TABLE}
add map {TABLE} ports {{ type inet_proto . inet_service : verdict; }}
add chain {TABLE} prerouting {{ type nat hook prerouting priority dstnat; policy accept; }}
add chain {TABLE} output {{ type nat hook output priority -100; policy accept; }}
add chain {TABLE} postrouting {{ type nat hook postrouting priority srcnat; policy accept; }}
add chain {TABLE} guard {{ type filter hook input priority filter; policy accept; }}
flush chain {TABLE} prerouting
flush chain {TABLE} output
flush chain {TABLE} postrouting
flush chain {TABLE} guard
"""
#: kube-proxy's guard for route_localnet (always in: it also covers a route_localnet the setting left on)
_GUARD = f"""add rule {TABLE} guard ip daddr 127.0.0.0/8 ip saddr != 127.0.0.0/8 ct status & dnat != dnat \
ct state != {{ established, related }} drop
add rule {TABLE} postrouting meta mark & {HAIRPIN_MARK} == {HAIRPIN_MARK} masquerade
add rule {TABLE} postrouting ip saddr 127.0.0.0/8 ct status dnat masquerade
"""


def base_script(localhost: bool) -> str:
    """The table's map and base chains, rewritten; 127.0.0.0/8 is DNATed only when ``localhost`` (the
    setting ``NETPLUGIN_HOSTPORT_LOCALHOST``), ::1 never (IPv6 has no route_localnet)."""
    lines = [_BASE.rstrip("\n")]
    for chain in ("prerouting", "output"):
        skip = ["ip6 daddr ::1"] if localhost else ["ip daddr 127.0.0.0/8", "ip6 daddr ::1"]
        lines += [f"add rule {TABLE} {chain} {match} return" for match in skip]
        lines.append(f"add rule {TABLE} {chain} fib daddr type local meta l4proto . th dport vmap @ports")
    return "\n".join(lines) + "\n" + _GUARD


def chain_name(infra_id: str) -> str:
    """``pod_`` + 12 hex digits of FNV-1a-64 of the infra id (the bash plugin's rule)."""
    h = 0xCBF29CE484222325
    for b in infra_id.encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"pod_{h:016x}"[:16]


def _key(m: HostPort) -> str:
    return f"{m.protocol}.{m.host_port}"


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


def _element(key: str) -> str:
    return key.replace(".", " . ")


def pod_script(chain: str, keys: Sequence[str], rules: Sequence[str]) -> str:
    """One pod's setup as one transaction: its chain rewritten, ``keys`` pointing at it. ``add
    element`` of a key another pod's chain holds fails (EBUSY); of one this pod holds, it does not."""
    lines = [f"add chain {TABLE} {chain}", f"flush chain {TABLE} {chain}", *rules]
    lines += [f"add element {TABLE} ports {{ {_element(k)} : jump {chain} }}" for k in keys]
    return "\n".join(lines) + "\n"


def _read_record(path: str) -> tuple[str, list[str], list[str]] | None:
    """(holder, keys, rules) of a record, or None when there is none."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return None
    holder = lines[0].split(" ", 1)[0] if lines else ""
    keys = lines[1].split() if len(lines) > 1 else []
    return holder, keys, [r for r in lines[2:] if r.startswith(f"add rule {TABLE} ")]


def rebuild_script(records_dir: str, localhost: bool = LOCALHOST_DEFAULT) -> str:
    """The whole table from the records: ``table``; ``delete table``; base; every recorded pod."""
    lines = [f"table {TABLE}", f"delete table {TABLE}", base_script(localhost).rstrip("\n")]
    names = sorted(os.listdir(records_dir)) if os.path.isdir(records_dir) else []
    for chain in (n for n in names if re.fullmatch(r"pod_[0-9a-f]{12}", n)):
        record = _read_record(os.path.join(records_dir, chain))
        if record is None:
            continue
        _, keys, rules = record
        lines += [f"add chain {TABLE} {chain}", *rules]
        lines += [f"add element {TABLE} ports {{ {_element(k)} : jump {chain} }}" for k in keys]
    return "\n".join(lines) + "\n"


def recorded_ipv4(records_dir: str) -> list[str]:
    """The IPv4 addresses the recorded pods' rules DNAT to (init turns route_localnet back on for them)."""
    names = sorted(os.listdir(records_dir)) if os.path.isdir(records_dir) else []
    out: set[str] = set()
    for chain in (n for n in names if re.fullmatch(r"pod_[0-9a-f]{12}", n)):
        record = _read_record(os.path.join(records_dir, chain))
        out.update(m.group(1) for r in (record[2] if record else []) if (m := _DNAT4.search(r)))
    return sorted(out)


def recorded_pods(records_dir: str) -> dict[str, tuple[str, str]]:
    """Chain -> (``namespace/name``, infra id) of every pod record (gc's view of who holds rules)."""
    out = {}
    names = sorted(os.listdir(records_dir)) if os.path.isdir(records_dir) else []
    for chain in (n for n in names if re.fullmatch(r"pod_[0-9a-f]{12}", n)):
        with open(os.path.join(records_dir, chain), encoding="utf-8", errors="replace") as f:
            words = f.readline().split()
        if len(words) == 2:
            out[chain] = (words[0], words[1])
    return out


def forget(records_dir: str, chain: str, nft: str = "nft") -> None:
    """Remove a pod's map elements, chain and record by its chain name; idempotent. Raises NetpluginError."""
    held = _ports_held(nft)
    if held is not None:  # else no table: nothing of the pod's can be left in it
        # the elements pointing at its chain, whatever the record says (it may be gone or stale)
        script = "".join(f"delete element {TABLE} ports {{ {_element(k)} }}\n" for k, c in held.items() if c == chain)
        err = _nft(nft, script + f"add chain {TABLE} {chain}\ndelete chain {TABLE} {chain}\n")
        if err:
            raise NetpluginError(f"cannot remove the hostPort rules of chain {chain}: {err}")
    try:
        os.unlink(os.path.join(records_dir, chain))
    except FileNotFoundError:
        pass


def restore_table(records_dir: str, nft: str = "nft", localhost: bool = LOCALHOST_DEFAULT) -> str | None:
    """Rebuild the table from the records when it is gone and a pod holds hostPorts (after ``nft flush
    ruleset``): what was done, or None when nothing was missing. Raises NetpluginError."""
    pods = recorded_pods(records_dir)
    if not pods or _ports_held(nft) is not None:
        return None
    err = _nft(nft, rebuild_script(records_dir, localhost))
    if err:
        raise NetpluginError(f"cannot rebuild nftables table {TABLE}: {err}")
    return f"nftables table {TABLE} rebuilt from {len(pods)} pod record(s)"


def remove_table(nft: str = "nft") -> None:
    """Delete the table if it exists (the uninstall's); nothing else. Raises NetpluginError."""
    _nft(nft, f"table {TABLE}\ndelete table {TABLE}\n")


def _nft(nft: str, script: str) -> str:
    """Run ``nft -f -``; the stderr of a failure, "" on success. OSError and timeouts raise."""
    try:
        done = subprocess.run([nft, "-f", "-"], input=script, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NetpluginError(f"cannot run {nft}: {e}") from e
    return done.stderr.strip() if done.returncode != 0 else ""


def _ports_held(nft: str) -> dict[str, str] | None:
    """Map key (``tcp.8080``) -> the chain holding it, from the kernel; None when there is no map."""
    try:
        out = subprocess.run([nft, "list", "map", *TABLE.split(), "ports"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NetpluginError(f"cannot run {nft}: {e}") from e
    if out.returncode != 0:
        return None
    return {f"{p}.{port}": chain for p, port, chain in _ELEMENT.findall(out.stdout)}


def _flush_udp(ports: Iterable[str], path: str | None) -> None:
    """Delete the conntrack entries of UDP ``ports``: a flow that predates the DNAT would keep going
    to whoever had the port before. With the ``conntrack`` command on ``path``, as the bash plugin
    (``netplugin doctor`` reports it missing)."""
    tool = shutil.which("conntrack", path=path)
    for port in ports if tool else ():
        # exit 1: no entry to delete, the common case
        subprocess.run([tool or "conntrack", "-D", "-p", "udp", "--dport", port], capture_output=True, timeout=30)


def _ip(ip_cmd: str, *args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run([ip_cmd, *args], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NetpluginError(f"cannot run {ip_cmd}: {e}") from e


def _route_localnet(ip_cmd: str, pod_ips: Sequence[str], strict: bool = True) -> None:
    """``route_localnet`` on for the bridge that routes to ``pod_ips`` (the pod's) and no other link:
    a DNAT from 127.0.0.1 leaves by it, and the answer comes back by it. Raises NetpluginError; an
    address with no route or not behind a bridge is skipped when not ``strict`` (init's records)."""
    for pod_ip in pod_ips:
        out = _ip(ip_cmd, "-o", "-4", "route", "get", pod_ip)
        dev = re.search(r" dev (\S+)", out.stdout)
        if out.returncode != 0 or dev is None:
            if not strict:
                continue
            raise NetpluginError(f"no route to the pod's address {pod_ip}: {out.stderr.strip()}")
        # never the underlay's link, whatever routes there
        if " bridge forward_delay " not in _ip(ip_cmd, "-o", "-d", "link", "show", "dev", dev.group(1)).stdout:
            if not strict:
                continue
            raise NetpluginError(f"the pod's address {pod_ip} is not behind a bridge (via {dev.group(1)}): "
                                 "route_localnet is only turned on for a bridge")  # fmt: skip
        path = f"/proc/sys/net/ipv4/conf/{dev.group(1)}/route_localnet"
        try:
            with open(path, "r+", encoding="ascii") as f:
                if f.read().strip() != "1":
                    f.seek(0)  # a sysctl ignores a write past offset 0
                    f.write("1")
        except OSError as e:
            raise NetpluginError(f"cannot turn route_localnet on for {dev.group(1)}: {e}") from e


class HostPortPlugin:
    """The hostport chain member; ``nft`` is the command (a path in tests)."""

    name = HOSTPORT_NAME

    def __init__(self, nft: str = "nft", ip: str = "ip") -> None:
        self.nft = nft
        self.ip = ip

    def version(self) -> str:
        return "builtin:hostport:1"

    def version_key(self) -> None:
        return None  # the version is a constant, so it needs no cheaper key

    def _fail(self, action: str, message: str) -> PluginFailed:
        return PluginFailed(f"network plugin {self.name!r} {action} failed: {message}", plugin=self.name, action=action)

    @staticmethod
    def _records(ctx: CallContext) -> str:
        return os.path.join(ctx.env.get("NETPLUGIN_STATE_DIR") or ctx.state_dir or DEFAULT_STATE_DIR, "hostport")

    def init(self, ctx: CallContext) -> frozenset[str]:
        """The table rebuilt from the records (every recorded pod's hostPorts back); the action mask."""
        try:
            localhost = localhost_enabled(ctx.env)
        except NetpluginError as e:
            raise self._fail("init", e.message) from None
        err = _nft(self.nft, rebuild_script(self._records(ctx), localhost))
        if err:
            raise self._fail("init", f"cannot rebuild nftables table {TABLE}: {err}")
        if localhost:  # a bridge made again (a reboot) starts with route_localnet off
            try:
                _route_localnet(self.ip, recorded_ipv4(self._records(ctx)), strict=False)
            except NetpluginError as e:
                raise self._fail("init", e.message) from None
        return frozenset({"setup", "teardown", "repair", DECLARES_HOST_PORTS})

    def setup(self, pod: PodRef, ctx: CallContext) -> PodNetworkStatus | None:
        try:
            maps = parse_env(ctx.env.get(ENV_HOST_PORTS, ""))
        except NetpluginError as e:
            raise self._fail("setup", e.message) from None
        if not maps:
            self.teardown(pod, ctx)
            return None
        ips = [ip for ip in ctx.env.get("NETPLUGIN_PREV_IPS", "").split(",") if ip]
        if not ips:
            raise self._fail("setup", "no pod address to map to: an earlier chain member (a bridge) must report one")
        try:
            check_families(maps, ips)
        except NetpluginError as e:
            raise self._fail("setup", e.message) from None
        chain, records = chain_name(pod.infra_id), self._records(ctx)
        keys = list(dict.fromkeys(_key(m) for m in maps))
        rules = pod_rules(chain, maps, ips)
        try:  # first, so that a refusal applies nothing
            if localhost_enabled(ctx.env):
                _route_localnet(self.ip, [ip for ip in ips if ":" not in ip])
        except NetpluginError as e:
            raise self._fail("setup", e.message) from None
        err = _nft(self.nft, pod_script(chain, keys, rules))
        if err:
            held = _ports_held(self.nft) or {}
            for k in keys:
                other = held.get(k)
                if other and other != chain:
                    theirs = _read_record(os.path.join(records, other))
                    who = theirs[0] if theirs else f"the pod of nft chain {other}"
                    port, proto = k.split(".")[1], k.split(".")[0]
                    raise self._fail("setup", f"hostPort {port}/{proto} is already held by pod {who}")
            raise self._fail("setup", f"cannot add the hostPort rules: {err}")
        os.makedirs(records, exist_ok=True)
        text = f"{pod.namespace}/{pod.name} {pod.infra_id}\n{' '.join(keys)}\n" + "".join(r + "\n" for r in rules)
        atomic_write(os.path.join(records, chain), text.encode(), mode=0o644)
        try:
            _flush_udp((k.split(".")[1] for k in keys if k.startswith("udp.")), ctx.env.get("PATH"))
        except (OSError, subprocess.TimeoutExpired) as e:
            raise self._fail("setup", f"cannot flush the UDP conntrack entries: {e}") from None
        return None

    def teardown(self, pod: PodRef, ctx: CallContext) -> None:
        try:
            forget(self._records(ctx), chain_name(pod.infra_id), self.nft)
        except NetpluginError as e:
            raise self._fail("teardown", e.message) from None

    def status(self, pod: PodRef, ctx: CallContext) -> PodNetworkStatus | None:
        return None

    def repair(self, pod: PodRef, ctx: CallContext) -> tuple[str, ...]:
        """The table back when it is gone (its rules are the records': every pod's at once)."""
        try:
            localhost = localhost_enabled(ctx.env)
            done = restore_table(self._records(ctx), self.nft, localhost)
            if localhost:  # a bridge the repair made again starts with route_localnet off
                _route_localnet(self.ip, recorded_ipv4(self._records(ctx)), strict=False)
        except NetpluginError as e:
            raise self._fail("repair", e.message) from None
        return (f"hostport: {done}",) if done else ()
