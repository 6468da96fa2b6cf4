"""The bridge plugins' host-local IPAM: plain files under one flock'd directory.

In detail: ``ARCHITECTURE.md``, "Module notes".

The on-disk format is shared with the bash plugin ``exec_plugins/bridge/bridge``
byte for byte, so a node can switch between the two plugins (or run both at
once: both take the same ``lock``) without losing an allocation. The directory
(``$NETPLUGIN_BRIDGE_STATE_DIR/<bridge-name>/``) holds::
"""

from __future__ import annotations

import builtins
import ipaddress
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from netplugin.core.errors import InvalidArgument, NetpluginError
from netplugin.core.names import validate_infra_id, validate_namespace, validate_pod_name
from netplugin.core.spares import spares_for
from netplugin.plugins.bridge.ipam_files import DirLock, IPAMError, listdir, read_owner, read_text, unlink, write_record

__all__ = [
    "IPAM",
    "MAX_POD_RECORD",
    "AddressesExhausted",
    "Allocation",
    "CorruptRecord",
    "IPAMError",
    "Network",
    "SubnetMismatch",
    "family_dir",
    "parse_subnet",
    "pool_bounds",
]

log = logging.getLogger(__name__)

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

#: Prefix lengths the IPAM serves: a gateway and at least one pod must fit.
PREFIX_RANGE = {4: (8, 30), 6: (48, 126)}
#: The IPv6 pool's size limit (the bash plugin computes in the last 32 bits).
_POOL6_LIMIT = 1 << 32
#: Probe this many addresses one by one before reading all of ips/ at once (dense subnets).
_PROBE_BEFORE_LISTING = 64
#: A ``pods/<infra-id>`` record ("CIDR NAMESPACE NAME") is far shorter; anything longer is not one.
MAX_POD_RECORD = 4095
#: The ``cursor`` file holds one address.
_MAX_CURSOR = 63


class AddressesExhausted(IPAMError):
    """Every usable address of the subnet is allocated."""


class SubnetMismatch(IPAMError):
    """The directory was created for another subnet (the bridge's subnet changed under it)."""


class CorruptRecord(IPAMError):
    """A record file does not have the documented format."""


@dataclass(frozen=True, slots=True)
class Allocation:
    """One pod's address, as recorded in ``pods/<infra-id>``."""

    infra_id: str
    ip: str
    prefixlen: int
    namespace: str
    name: str

    @property
    def cidr(self) -> str:
        return f"{self.ip}/{self.prefixlen}"


def parse_subnet(value: str) -> Network:
    """A subnet the IPAM can serve: network address given exactly, IPv4 /8-/30 or IPv6 /48-/126."""
    try:
        net = ipaddress.ip_network(value.strip(), strict=True)
    except ValueError as e:
        raise InvalidArgument("subnet", value, f"not an IPv4 or IPv6 network in CIDR form ({e})") from None
    low, high = PREFIX_RANGE[net.version]
    if net.prefixlen > high:
        raise InvalidArgument("subnet", value, f"prefix must be at most /{high}")
    if net.prefixlen < low:
        raise InvalidArgument("subnet", value, f"prefix must be at least /{low}")
    return net


def pool_bounds(subnet: Network) -> tuple[int, int]:
    """The first and last address (as integers) the IPAM hands out of ``subnet``, gateway included.

    IPv4: every host address (not the network or broadcast address). IPv6: host addresses ::1
    to ::ffff:ffff of the subnet, or all of it (its last address too) when it is smaller.
    """
    net = int(subnet.network_address)
    if subnet.version == 4:
        return net + 1, int(subnet.broadcast_address) - 1
    return net + 1, net + min(subnet.num_addresses, _POOL6_LIMIT) - 1


def family_dir(directory: str, version: int) -> str:
    """A family's directory inside a bridge's IPAM directory: IPv4 at the top, IPv6 in ipv6/."""
    return directory if version == 4 else os.path.join(directory, "ipv6")


class IPAM:
    """Host-local allocation of one family's addresses for one bridge. Thread- and multi-process safe.

    ``directory`` is the family's own (see :func:`family_dir`); ``lock_path`` defaults to
    ``directory/lock`` and is the bridge directory's ``lock`` for every family.
    """

    def __init__(
        self,
        directory: str,
        subnet: str | Network,
        gateway: str | None = None,
        *,
        lock_timeout: float = 30.0,
        lock_path: str | None = None,
    ) -> None:
        self.directory = directory
        self.subnet: Network = (
            subnet if isinstance(subnet, ipaddress.IPv4Network | ipaddress.IPv6Network) else parse_subnet(subnet)
        )
        self._first, self._last = pool_bounds(self.subnet)
        self.gateway: Address = self.subnet.network_address + 1
        if gateway is not None:
            try:
                self.gateway = ipaddress.ip_address(gateway)
            except ValueError as e:
                raise InvalidArgument("gateway", gateway, str(e)) from None
            host = self.gateway.version == self.subnet.version and self.gateway in self.subnet
            if (
                not host
                or self.gateway == self.subnet.network_address
                or (self.subnet.version == 4 and self.gateway == self.subnet.broadcast_address)
            ):
                raise InvalidArgument("gateway", gateway, f"must be a host address of {self.subnet}")
        self.lock_timeout = lock_timeout
        self._lock_path = lock_path or os.path.join(directory, "lock")
        self._ips = os.path.join(directory, "ips")
        self._pods = os.path.join(directory, "pods")
        # removed and replaced records keep their inodes for the next pod (see netplugin.core.spares)
        self._spares = spares_for(directory, directory)
        self._subnet_text = f"{self.subnet}\n"
        self.lock = DirLock(self._lock_path, (directory, self._ips, self._pods), lock_timeout)

    def __repr__(self) -> str:
        return f"IPAM({self.directory!r}, {str(self.subnet)!r}, gateway={str(self.gateway)!r})"

    @property
    def pool_size(self) -> int:
        """How many pods the pool holds (the gateway, when inside it, is not for a pod)."""
        size = self._last - self._first + 1
        return size - 1 if self._first <= int(self.gateway) <= self._last else size

    # --- public API -------------------------------------------------------------------------------

    def allocate(self, infra_id: str, namespace: str, name: str, *, timeout: float | None = None) -> tuple[str, int]:
        """The pod's address and prefix length: its existing one, or a newly allocated one."""
        record, _ = self.claim(infra_id, namespace, name, timeout=timeout)
        return record.ip, record.prefixlen

    def claim(
        self, infra_id: str, namespace: str, name: str, *, timeout: float | None = None
    ) -> tuple[Allocation, bool]:
        """Like :meth:`allocate`; also says whether this call allocated (True) or found the record."""
        validate_infra_id(infra_id)
        validate_namespace(namespace)
        validate_pod_name(name)
        with self.locked(timeout):
            return self.claim_locked(infra_id, namespace, name)

    def claim_locked(self, infra_id: str, namespace: str, name: str) -> tuple[Allocation, bool]:
        """:meth:`claim` for a caller that holds the lock and has checked the subnet."""
        existing = self._read_pod(infra_id)
        if existing is not None:
            self._repair_ip_file(existing)
            return existing, False
        addr = self._probe()
        record = Allocation(infra_id, str(addr), self.subnet.prefixlen, namespace, name)
        pod_path = os.path.join(self._pods, infra_id)
        write_record(pod_path, f"{record.cidr} {namespace} {name}\n", spares=self._spares)
        try:
            # O_EXCL: never overwrite an address file, whoever wrote it (as the bash plugin does).
            write_record(os.path.join(self._ips, record.ip), f"{infra_id}\n", mode="exclusive", spares=self._spares)
        except BaseException:
            unlink(pod_path, self._spares)
            raise
        # Written in place: a torn or lost cursor only makes the next probe start earlier, and
        # on ext4 a rename over an existing file costs a data flush (auto_da_alloc).
        try:
            write_record(os.path.join(self.directory, "cursor"), f"{record.ip}\n", mode="in-place")
        except IPAMError as e:
            log.warning("%s", e)
        return record, True

    def release(self, infra_id: str, *, timeout: float | None = None) -> str | None:
        """Free the pod's address; returns it, or None when the pod had none. Idempotent."""
        validate_infra_id(infra_id)
        with self.locked(timeout):
            return self.release_locked(infra_id)

    def release_locked(self, infra_id: str) -> str | None:
        """:meth:`release` for a caller that holds the lock."""
        pod_path = os.path.join(self._pods, infra_id)
        try:
            record = self._read_pod(infra_id)
        except CorruptRecord as e:
            # Releasing is the one thing to do with a torn record; find the address the slow way.
            log.warning("%s; releasing by scanning %s", e, self._ips)
            for ip in self._scan_owned(infra_id):
                unlink(os.path.join(self._ips, ip), self._spares)
            unlink(pod_path, self._spares)
            return None
        if record is None:
            return None
        ip_path = os.path.join(self._ips, record.ip)
        owner = read_owner(ip_path)
        if owner == infra_id or owner == "":
            unlink(ip_path, self._spares)
        elif owner is not None:
            log.warning("%s names %r, not %r: left in place", ip_path, owner, infra_id)
        unlink(pod_path, self._spares)
        return record.ip

    def lookup(self, infra_id: str, *, timeout: float | None = None) -> Allocation | None:
        """The pod's allocation, or None.

        Takes the lock: the bash plugin writes records in place (one short write under the lock),
        so only a reader holding the lock never sees one half-written.
        """
        validate_infra_id(infra_id)
        with self.locked(timeout):
            return self._read_pod(infra_id)

    def lookup_locked(self, infra_id: str) -> Allocation | None:
        """:meth:`lookup` for a caller that holds the lock."""
        return self._read_pod(infra_id)

    def list(self, *, timeout: float | None = None) -> builtins.list[Allocation]:
        """Every pod record, sorted by address. Raises CorruptRecord on the first torn one."""
        out: list[Allocation] = []
        with self.locked(timeout):
            for infra_id in listdir(self._pods):
                if infra_id.startswith("."):
                    continue
                record = self._read_pod(infra_id)
                if record is not None:
                    out.append(record)
        out.sort(key=lambda a: ipaddress.ip_address(a.ip))
        return out

    def allocated_ips(self, *, timeout: float | None = None) -> dict[str, str]:
        """``{address: infra id}`` from ips/ (a torn file maps to "")."""
        out: dict[str, str] = {}
        with self.locked(timeout):
            for ip in self._ip_names():
                owner = read_owner(os.path.join(self._ips, ip))
                if owner is not None:
                    out[ip] = owner
        return out

    @contextmanager
    def locked(self, timeout: float | None = None) -> Iterator[None]:
        """Hold the directory's lock (the one the bash plugin flocks too) and check the subnet."""
        with self.lock.hold(timeout):
            self.check_subnet()
            yield

    # --- internals --------------------------------------------------------------------------------

    def stock(self) -> None:
        """Spare inodes for the records, made ahead of the pods (init; see :mod:`netplugin.core.spares`)."""
        try:
            self._spares.fill()
        except (OSError, NetpluginError) as e:
            log.warning("cannot make spare inodes in %s: %s", self.directory, e)

    def check_subnet(self) -> None:
        """Refuse a directory created for another subnet; record ours in a new one (with the lock)."""
        path = os.path.join(self.directory, "subnet")
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            write_record(path, self._subnet_text)
            return
        except OSError as e:
            raise IPAMError(f"cannot read {path}: {e.strerror or e}", path=path) from e
        if text == self._subnet_text:
            return
        try:
            recorded = ipaddress.ip_network(text.strip(), strict=True)
        except ValueError:
            raise CorruptRecord(f"{path}: not a subnet: {text[:64]!r}", path=path) from None
        if recorded != self.subnet:
            raise SubnetMismatch(
                # The bash plugin's words.
                f"IPAM directory {self.directory} was created for subnet {recorded} but the configured "
                f"subnet is {self.subnet}; tear down its pods first or use another bridge name or state dir",
                path=path,
                recorded=str(recorded),
                requested=str(self.subnet),
            )

    def _read_pod(self, infra_id: str) -> Allocation | None:
        path = os.path.join(self._pods, infra_id)
        text = read_text(path, MAX_POD_RECORD)
        return None if text is None else self._parse_pod(path, infra_id, text)

    def _parse_pod(self, path: str, infra_id: str, text: str) -> Allocation:
        def corrupt(why: str) -> CorruptRecord:
            return CorruptRecord(
                f"corrupt IPAM record {path}: {why} (content {text[:120]!r}); "
                "expected '<address>/<prefixlen> <namespace> <pod-name>'",
                path=path,
            )

        if not text.endswith("\n") or text.count("\n") != 1:
            raise corrupt("not exactly one line")
        fields = text[:-1].split(" ")
        if len(fields) != 3:
            raise corrupt("not three space-separated fields")
        cidr, namespace, name = fields
        ip, sep, plen = cidr.partition("/")
        try:
            addr = ipaddress.ip_address(ip)
            prefixlen = int(plen) if sep and plen.isdigit() else -1
        except ValueError:
            raise corrupt(f"bad address {ip!r}") from None
        if prefixlen != self.subnet.prefixlen or addr.version != self.subnet.version or addr not in self.subnet:
            raise corrupt(f"address {cidr!r} is not in subnet {self.subnet}")
        if not self._first <= int(addr) <= self._last or addr == self.gateway:
            raise corrupt(f"address {ip} is the network, broadcast or gateway address, or outside the pool")
        if str(addr) != ip:
            raise corrupt(f"address {ip!r} is not written in its canonical form {str(addr)!r}")
        if not namespace or not name:
            raise corrupt("empty namespace or pod name")
        return Allocation(infra_id, str(addr), prefixlen, namespace, name)

    def _repair_ip_file(self, record: Allocation) -> None:
        path = os.path.join(self._ips, record.ip)
        owner = read_owner(path)
        if owner == record.infra_id:
            return
        if owner is None or owner == "":
            # A crash between the two writes of an allocation (or a torn file): the pod record wins.
            write_record(path, f"{record.infra_id}\n", mode="in-place")
            return
        raise CorruptRecord(
            f"IPAM records disagree: {os.path.join(self._pods, record.infra_id)} says {record.ip} "
            f"but {path} names {owner!r}",
            path=path,
        )

    def _probe(self) -> Address:
        size = self._last - self._first + 1
        start = self._cursor_next()
        gateway = int(self.gateway)
        make = ipaddress.IPv4Address if self.subnet.version == 4 else ipaddress.IPv6Address
        taken: set[str] | None = None
        for step in range(size):
            n = self._first + (start - self._first + step) % size
            if n == gateway:
                continue
            ip = str(make(n))
            if taken is None:
                if step >= _PROBE_BEFORE_LISTING:
                    taken = set(self._ip_names())
                elif not os.path.lexists(os.path.join(self._ips, ip)):
                    return make(n)
                else:
                    continue
            if ip not in taken:
                return make(n)
        raise AddressesExhausted(
            # The bash plugin's words, so operators grep for one message whichever plugin runs.
            f"no free address in {self.subnet} (all {self.pool_size} pod addresses are allocated; see {self._ips})",
            path=self._ips,
            subnet=str(self.subnet),
        )

    def _cursor_next(self) -> int:
        """The first address to probe: the one after the cursor, or the pool's first."""
        path = os.path.join(self.directory, "cursor")
        try:
            cursor = ipaddress.ip_address((read_text(path, _MAX_CURSOR) or "").strip())
        except (IPAMError, ValueError):
            return self._first  # absent or torn: start from the beginning, nothing is lost
        n = int(cursor)
        if cursor.version != self.subnet.version or not self._first <= n <= self._last:
            return self._first
        return n + 1 if n < self._last else self._first

    def _ip_names(self) -> Iterator[str]:
        for name in listdir(self._ips):
            if not name.startswith("."):
                yield name

    def _scan_owned(self, infra_id: str) -> builtins.list[str]:
        return [ip for ip in self._ip_names() if read_owner(os.path.join(self._ips, ip)) == infra_id]
