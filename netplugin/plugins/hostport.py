"""``netplugin.io/hostport``: a pod's hostPorts DNATed with nftables, in process.

In detail: ``ARCHITECTURE.md``, "Module notes".
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

from netplugin.core.chaining import DECLARES_HOST_PORTS
from netplugin.core.defaults import DEFAULT_STATE_DIR
from netplugin.core.errors import NetpluginError, PluginFailed
from netplugin.core.fileio import atomic_write
from netplugin.core.hostports import (
    ENV_HOST_PORTS,
    LOCALHOST_DEFAULT,
    HostPort,
    check_families,
    localhost_enabled,
    parse_env,
)
from netplugin.core.names import PodRef
from netplugin.core.plugin import CallContext, PodNetworkStatus
from netplugin.plugins.hostport_table import (
    TABLE,
    add_elements,
    base_rules,
    base_script,
    chain_name,
    conflicts,
    describe,
    element,
    kernel_table,
    key,
    pod_rules,
    pod_script,
    ports_held,
    run_nft,
)

__all__ = [
    "HOSTPORT_MEMBERS",
    "HOSTPORT_NAME",
    "TABLE",
    "HostPortPlugin",
    "base_script",
    "chain_name",
    "forget",
    "keep_table",
    "pod_rules",
    "pod_script",
    "rebuild_script",
    "recorded_ipv4",
    "recorded_pods",
    "remove_table",
    "restore_table",
]

HOSTPORT_NAME = "netplugin.io/hostport"
#: the members netplugin ships that map hostPorts (each declares it in its init mask): the built-in, then the bash one
HOSTPORT_MEMBERS = (HOSTPORT_NAME, "hostport")
_DNAT4 = re.compile(r" dnat ip to (\d+\.\d+\.\d+\.\d+):\d+$")
_POD_CHAIN = re.compile(r"pod_[0-9a-f]{12}")
#: the lock setup, teardown and the rebuilds take (a file among the records; the bash plugin takes it too)
LOCK_NAME = ".lock"


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
    for chain, (_, keys, rules) in _records(records_dir).items():
        lines += [f"add chain {TABLE} {chain}", *rules, *add_elements(chain, keys)]
    return "\n".join(lines) + "\n"


def _records(records_dir: str) -> dict[str, tuple[str, list[str], list[str]]]:
    """Chain -> (holder, keys, rules) of every record there is now (one removed while listed is skipped)."""
    names = sorted(os.listdir(records_dir)) if os.path.isdir(records_dir) else []
    out = {}
    for chain in (n for n in names if _POD_CHAIN.fullmatch(n)):
        record = _read_record(os.path.join(records_dir, chain))
        if record is not None:
            out[chain] = record
    return out


def _refuse_conflicts(records_dir: str, chain: str, keys: Sequence[str]) -> None:
    """NetpluginError naming the holder when another pod's record has a key that conflicts with one
    of ``keys`` (the caller holds the lock). The maps refuse a key held twice, not a mapping without
    hostIP beside one with (:func:`~netplugin.plugins.hostport_table.conflicts`)."""
    for other, (who, theirs, _) in _records(records_dir).items():
        for k in keys if other != chain else ():
            o = next((o for o in theirs if conflicts(k, o)), None)
            if o is not None:
                also = f" (its hostPort {describe(o)})" if o != k else ""
                raise NetpluginError(f"hostPort {describe(k)} is already held by pod {who}{also}")


@contextmanager
def table_lock(records_dir: str) -> Iterator[None]:
    """Serialise the table's writers (setup, teardown, rebuilds) across threads and processes."""
    os.makedirs(records_dir, exist_ok=True)
    try:
        fd = os.open(os.path.join(records_dir, LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise NetpluginError(f"cannot open the hostPort lock in {records_dir}: {e.strerror}") from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def recorded_ipv4(records_dir: str) -> list[str]:
    """The IPv4 addresses the recorded pods' rules DNAT to (init turns route_localnet back on for them)."""
    out: set[str] = set()
    for _, _, rules in _records(records_dir).values():
        out.update(m.group(1) for r in rules if (m := _DNAT4.search(r)))
    return sorted(out)


def recorded_pods(records_dir: str) -> dict[str, tuple[str, str]]:
    """Chain -> (``namespace/name``, infra id) of every pod record (gc's view of who holds rules)."""
    out = {}
    names = sorted(os.listdir(records_dir)) if os.path.isdir(records_dir) else []
    for chain in (n for n in names if _POD_CHAIN.fullmatch(n)):
        try:
            with open(os.path.join(records_dir, chain), encoding="utf-8", errors="replace") as f:
                words = f.readline().split()
        except FileNotFoundError:
            continue  # torn down while listed
        if len(words) == 2:
            out[chain] = (words[0], words[1])
    return out


def forget(records_dir: str, chain: str, nft: str = "nft") -> None:
    """Remove a pod's map elements, chain and record by its chain name; idempotent. Raises NetpluginError."""
    with table_lock(records_dir):
        _forget(records_dir, chain, nft)


def _forget(records_dir: str, chain: str, nft: str) -> None:
    held = ports_held(nft, complete=False)
    if held is not None:  # else no table: nothing of the pod's can be left in it
        # the elements pointing at its chain, whatever the record says (it may be gone or stale)
        elements = (element(k) for k, c in held.items() if c == chain)
        script = "".join(f"delete element {TABLE} {m} {{ {e} }}\n" for m, e in elements)
        err = run_nft(nft, script + f"add chain {TABLE} {chain}\ndelete chain {TABLE} {chain}\n")
        if err:
            raise NetpluginError(f"cannot remove the hostPort rules of chain {chain}: {err}")
    try:
        os.unlink(os.path.join(records_dir, chain))
    except FileNotFoundError:
        pass


def restore_table(records_dir: str, nft: str = "nft", localhost: bool = LOCALHOST_DEFAULT) -> str | None:
    """Rebuild the table from the records when it is gone (after ``nft flush ruleset``), whether or
    not a pod holds hostPorts: what was done, or None when it is there. Raises NetpluginError."""
    with table_lock(records_dir):
        if ports_held(nft) is not None:
            return None
        return _rebuild(records_dir, nft, localhost)


def _rebuild(records_dir: str, nft: str, localhost: bool) -> str:
    """The table replaced by the records' in one transaction (the caller holds the lock)."""
    script = rebuild_script(records_dir, localhost)
    err = run_nft(nft, script)
    if err:
        raise NetpluginError(f"cannot rebuild nftables table {TABLE}: {err}")
    pods = script.count(f"\nadd chain {TABLE} pod_")
    return f"nftables table {TABLE} rebuilt from {pods} pod record(s)"


def keep_table(records_dir: str, nft: str = "nft", localhost: bool = LOCALHOST_DEFAULT) -> list[str]:
    """The contract's ``node`` action: the table made what must exist, both ways, under the lock.

    What must exist: the base chains with their rules (the guard among them) and, for each record,
    its chain with its rules and its ports. A table that differs in any of these (gone, a chain
    flushed, a pod's chain or port missing, a chain or port no record accounts for) is replaced by
    the records' in one transaction. Returns one ``hostport: what`` line per difference found (none
    when it was right). Raises NetpluginError."""
    with table_lock(records_dir):
        kernel = kernel_table(nft)
        records = _records(records_dir)
        if kernel is None:
            return [f"hostport: {_rebuild(records_dir, nft, localhost)} (it was gone)"]
        chains, ports = kernel
        want = {**base_rules(localhost), **{c: len(r) for c, (_, _, r) in records.items()}}
        want_ports = {k: c for c, (_, keys, _) in records.items() for k in keys}
        found = []
        for chain in sorted(set(chains) - set(want)):
            holders = ", ".join(sorted(k for k, c in ports.items() if c == chain)) or "no port"
            found.append(f"chain {chain} with no record ({holders}) removed")
        for chain in sorted(set(want) - set(chains)):
            holder = records[chain][0] if chain in records else "the table"
            found.append(f"chain {chain} of {holder} re-added")
        for chain in sorted(c for c in set(want) & set(chains) if want[c] != chains[c]):
            found.append(f"chain {chain}: {chains[chain]} rule(s) where {want[chain]} belong, rewritten")
        for k in sorted(set(ports) | set(want_ports)):
            if ports.get(k) != want_ports.get(k) and ports.get(k) not in set(chains) - set(want):
                found.append(f"port {k}: {ports.get(k) or 'missing'}, {want_ports.get(k) or 'no record'} wanted")
        if not found:
            return []
        _rebuild(records_dir, nft, localhost)
        return [f"hostport: {what}" for what in found]


def remove_table(nft: str = "nft") -> None:
    """Delete the table if it exists (the uninstall's); nothing else. Raises NetpluginError."""
    run_nft(nft, f"table {TABLE}\ndelete table {TABLE}\n")


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
            with table_lock(self._records(ctx)):
                _rebuild(self._records(ctx), self.nft, localhost)
            if localhost:  # a bridge made again (a reboot) starts with route_localnet off
                _route_localnet(self.ip, recorded_ipv4(self._records(ctx)), strict=False)
        except NetpluginError as e:
            raise self._fail("init", e.message) from None
        return frozenset({"setup", "teardown", "repair", "node", DECLARES_HOST_PORTS})

    def node(self, ctx: CallContext) -> tuple[str, ...]:
        """The table made what the records say, both ways (:func:`keep_table`)."""
        try:
            localhost = localhost_enabled(ctx.env)
            done = keep_table(self._records(ctx), self.nft, localhost)
            if localhost:  # a bridge made again starts with route_localnet off
                _route_localnet(self.ip, recorded_ipv4(self._records(ctx)), strict=False)
        except NetpluginError as e:
            raise self._fail("node", e.message) from None
        return tuple(done)

    def setup(self, pod: PodRef, ctx: CallContext) -> PodNetworkStatus | None:
        try:
            localhost = localhost_enabled(ctx.env)
            maps = parse_env(ctx.env.get(ENV_HOST_PORTS, ""), localhost)
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
        keys = list(dict.fromkeys(key(m) for m in maps))
        rules = pod_rules(chain, maps, ips)
        try:
            with table_lock(records):
                _refuse_conflicts(records, chain, keys)  # first, so that a refusal applies nothing
                if localhost:
                    self._localnet(maps, ips)
                self._apply(pod, chain, keys, rules, records, localhost)
        except NetpluginError as e:
            raise self._fail("setup", e.message) from None
        try:
            _flush_udp(sorted({str(m.host_port) for m in maps if m.protocol == "udp"}), ctx.env.get("PATH"))
        except (OSError, subprocess.TimeoutExpired) as e:
            raise self._fail("setup", f"cannot flush the UDP conntrack entries: {e}") from None
        return None

    def _localnet(self, maps: Sequence[HostPort], ips: Sequence[str]) -> None:
        """route_localnet on the pod's bridge, so that the node's 127.0.0.1 reaches the pod. A pod not
        behind a bridge fails only when one of its mappings is on 127.0.0.0/8 itself (which then would
        map nothing); otherwise it keeps its hostPorts on the node's addresses, without 127.0.0.1."""
        loopback = any(m.host_ip and ipaddress.ip_address(m.host_ip).is_loopback for m in maps)
        _route_localnet(self.ip, [ip for ip in ips if ":" not in ip], strict=loopback)

    def _apply(self, pod: PodRef, chain: str, keys: list[str], rules: list[str], records: str, localhost: bool) -> None:
        """The pod's chain and ports, then its record (under the table lock). A table that is gone
        (a flush) or an older version's is made first from the records, guard and all: a setup
        never waits for the daemon."""
        err = run_nft(self.nft, pod_script(chain, keys, rules))
        if err and ports_held(self.nft) is None:
            _rebuild(records, self.nft, localhost)
            err = run_nft(self.nft, pod_script(chain, keys, rules))
        if err:
            held = ports_held(self.nft) or {}
            for k in keys:
                other = held.get(k)
                if other and other != chain:
                    theirs = _read_record(os.path.join(records, other))
                    who = theirs[0] if theirs else f"the pod of nft chain {other}"
                    raise NetpluginError(f"hostPort {describe(k)} is already held by pod {who}")
            raise NetpluginError(f"cannot add the hostPort rules: {err}")
        text = f"{pod.namespace}/{pod.name} {pod.infra_id}\n{' '.join(keys)}\n" + "".join(r + "\n" for r in rules)
        atomic_write(os.path.join(records, chain), text.encode(), mode=0o644)

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
