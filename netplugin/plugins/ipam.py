"""The bridge plugins' host-local IPAM: plain files under one flock'd directory.

The on-disk format is shared with the bash plugin ``exec_plugins/bridge/bridge``
byte for byte, so a node can switch between the two plugins (or run both at
once: both take the same ``lock``) without losing an allocation. The directory
(``$NETPLUGIN_BRIDGE_STATE_DIR/<bridge-name>/``) holds::

    lock              flock'd (exclusively) around every allocate/release
    subnet            "<network>/<prefixlen>\\n": the subnet the directory belongs to
    cursor            "<a.b.c.d>\\n": the last address handed out
    ips/<a.b.c.d>     "<infra-id>\\n": one file per allocated address
    pods/<infra-id>   "<a.b.c.d>/<prefixlen> <namespace> <pod-name>\\n"

This module writes a pod record atomically (a temp file whose name starts with
``.``, then ``rename``; neither an address nor an infra id starts with ``.``,
so listings skip temp files), creates an address file with ``O_EXCL`` and
rewrites the cursor in place. The bash plugin writes records in place with one
short write under the lock (an exec of ``mv`` per pod costs more than it buys),
so every reader here takes the lock too. Files are not fsync'ed: the records
describe kernel state (veths, addresses in network namespaces) that does not
survive a crash of the machine either, and a record torn by one is reported,
never trusted: allocate and lookup raise :class:`CorruptRecord` naming the
file (the bash plugin allocates anew instead), release falls back to a scan of
``ips/`` so a teardown can always clean up.

Allocation returns the pod's existing address when ``pods/<infra-id>`` exists;
otherwise it probes forward, round-robin, from the address after ``cursor``,
skipping the network, broadcast and gateway addresses. Release reads
``pods/<infra-id>``, removes ``ips/<addr>`` only if it still names that infra
id, then removes the pod record: both are O(1) in the number of allocations.

The order of writes makes a crash of this module at any point recoverable
without a scan: allocate writes ``pods/<id>`` before ``ips/<addr>`` (a retry
finds the pod record and re-creates the address file), release removes
``ips/<addr>`` before ``pods/<id>`` (a retry finds the pod record and
finishes).
"""

from __future__ import annotations

import builtins
import errno
import fcntl
import ipaddress
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from netplugin.core.errors import InvalidArgument, NetpluginError
from netplugin.core.names import validate_infra_id, validate_namespace, validate_pod_name

__all__ = [
    "IPAM",
    "AddressesExhausted",
    "Allocation",
    "CorruptRecord",
    "IPAMError",
    "SubnetMismatch",
    "parse_subnet",
]

log = logging.getLogger(__name__)

#: Smallest subnet the IPAM serves: a /30 has two usable addresses, one of them the gateway.
MAX_PREFIXLEN = 30
#: Probe this many addresses one by one before reading all of ips/ at once (dense subnets).
_PROBE_BEFORE_LISTING = 64


class IPAMError(NetpluginError):
    """The IPAM directory cannot serve the request; names the file or directory at fault."""

    def __init__(self, message: str, *, path: str, **details: object) -> None:
        super().__init__(message, path=path, **details)
        self.path = path


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


def parse_subnet(value: str) -> ipaddress.IPv4Network:
    """A subnet the IPAM can serve: IPv4, network address given exactly, /8 to /30."""
    try:
        net = ipaddress.IPv4Network(value.strip(), strict=True)
    except ValueError as e:
        raise InvalidArgument("subnet", value, f"not an IPv4 network in CIDR form ({e})") from None
    if net.prefixlen > MAX_PREFIXLEN:
        raise InvalidArgument("subnet", value, f"prefix must be at most /{MAX_PREFIXLEN}")
    if net.prefixlen < 8:
        raise InvalidArgument("subnet", value, "prefix must be at least /8")
    return net


# Threads of one process queue on this before taking the flock, so only other processes are polled for.
_thread_locks: dict[str, threading.Lock] = {}
_thread_locks_guard = threading.Lock()


def _thread_lock(path: str) -> threading.Lock:
    with _thread_locks_guard:
        lock = _thread_locks.get(path)
        if lock is None:
            lock = _thread_locks[path] = threading.Lock()
        return lock


class IPAM:
    """Host-local address allocation for one bridge. Thread-safe and multi-process safe."""

    def __init__(
        self,
        directory: str,
        subnet: str | ipaddress.IPv4Network,
        gateway: str | None = None,
        *,
        lock_timeout: float = 30.0,
    ) -> None:
        self.directory = directory
        self.subnet = subnet if isinstance(subnet, ipaddress.IPv4Network) else parse_subnet(subnet)
        first = self.subnet.network_address + 1
        if gateway is None:
            self.gateway = first
        else:
            try:
                self.gateway = ipaddress.IPv4Address(gateway)
            except ValueError as e:
                raise InvalidArgument("gateway", gateway, str(e)) from None
            if self.gateway not in self.subnet or self.gateway in (
                self.subnet.network_address,
                self.subnet.broadcast_address,
            ):
                raise InvalidArgument("gateway", gateway, f"must be a host address of {self.subnet}")
        self.lock_timeout = lock_timeout
        self._lock_path = os.path.join(directory, "lock")
        self._ips = os.path.join(directory, "ips")
        self._pods = os.path.join(directory, "pods")
        self._subnet_text = f"{self.subnet}\n"
        self._first = int(first)
        self._last = int(self.subnet.broadcast_address) - 1
        self._ready = False

    def __repr__(self) -> str:
        return f"IPAM({self.directory!r}, {str(self.subnet)!r}, gateway={str(self.gateway)!r})"

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
            existing = self._read_pod(infra_id)
            if existing is not None:
                self._repair_ip_file(existing)
                return existing, False
            addr = self._probe()
            record = Allocation(infra_id, str(addr), self.subnet.prefixlen, namespace, name)
            pod_path = os.path.join(self._pods, infra_id)
            self._write(pod_path, f"{record.cidr} {namespace} {name}\n")
            try:
                # O_EXCL: never overwrite an address file, whoever wrote it (as the bash plugin does).
                self._write(os.path.join(self._ips, record.ip), f"{infra_id}\n", mode="exclusive")
            except BaseException:
                _unlink(pod_path)
                raise
            # Written in place: a torn or lost cursor only makes the next probe start earlier, and
            # on ext4 a rename over an existing file costs a data flush (auto_da_alloc).
            try:
                self._write(os.path.join(self.directory, "cursor"), f"{record.ip}\n", mode="in-place")
            except IPAMError as e:
                log.warning("%s", e)
            return record, True

    def release(self, infra_id: str, *, timeout: float | None = None) -> str | None:
        """Free the pod's address; returns it, or None when the pod had none. Idempotent."""
        validate_infra_id(infra_id)
        with self.locked(timeout):
            pod_path = os.path.join(self._pods, infra_id)
            try:
                record = self._read_pod(infra_id)
            except CorruptRecord as e:
                # Releasing is the one thing to do with a torn record; find the address the slow way.
                log.warning("%s; releasing by scanning %s", e, self._ips)
                for ip in self._scan_owned(infra_id):
                    _unlink(os.path.join(self._ips, ip))
                _unlink(pod_path)
                return None
            if record is None:
                return None
            ip_path = os.path.join(self._ips, record.ip)
            owner = self._read_owner(ip_path)
            if owner == infra_id or owner == "":
                _unlink(ip_path)
            elif owner is not None:
                log.warning("%s names %r, not %r: left in place", ip_path, owner, infra_id)
            _unlink(pod_path)
            return record.ip

    def lookup(self, infra_id: str, *, timeout: float | None = None) -> Allocation | None:
        """The pod's allocation, or None.

        Takes the lock: the bash plugin writes records in place (one short write under the lock),
        so only a reader holding the lock never sees one half-written.
        """
        validate_infra_id(infra_id)
        with self.locked(timeout):
            return self._read_pod(infra_id)

    def list(self, *, timeout: float | None = None) -> builtins.list[Allocation]:
        """Every pod record, sorted by address. Raises CorruptRecord on the first torn one."""
        out: list[Allocation] = []
        with self.locked(timeout):
            for infra_id in _listdir(self._pods):
                if infra_id.startswith("."):
                    continue
                record = self._read_pod(infra_id)
                if record is not None:
                    out.append(record)
        out.sort(key=lambda a: ipaddress.IPv4Address(a.ip))
        return out

    def allocated_ips(self, *, timeout: float | None = None) -> dict[str, str]:
        """``{address: infra id}`` from ips/ (a torn file maps to "")."""
        out: dict[str, str] = {}
        with self.locked(timeout):
            for ip in self._ip_names():
                owner = self._read_owner(os.path.join(self._ips, ip))
                if owner is not None:
                    out[ip] = owner
        return out

    @contextmanager
    def locked(self, timeout: float | None = None) -> Iterator[None]:
        """Hold the directory's lock (the one the bash plugin flocks too) for the block."""
        limit = self.lock_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        tlock = _thread_lock(self._lock_path)
        if not tlock.acquire(timeout=max(limit, 0.0)):
            raise IPAMError(f"timed out after {limit:g}s waiting for lock {self._lock_path}", path=self._lock_path)
        try:
            self._prepare()
            fd = self._open_lock()
            try:
                self._flock(fd, deadline, limit)
                self._check_subnet()
                yield
            finally:
                os.close(fd)
        finally:
            tlock.release()

    # --- internals --------------------------------------------------------------------------------

    def _prepare(self) -> None:
        if self._ready:
            return
        for d in (self.directory, self._ips, self._pods):
            try:
                os.makedirs(d, mode=0o755, exist_ok=True)
            except OSError as e:
                raise IPAMError(f"cannot create {d}: {e.strerror or e}", path=d) from e
        self._ready = True

    def _open_lock(self) -> int:
        try:
            return os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except FileNotFoundError:
            self._ready = False  # the directory was removed under us: create it again
            self._prepare()
            return os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise IPAMError(f"cannot open {self._lock_path}: {e.strerror or e}", path=self._lock_path) from e

    def _flock(self, fd: int, deadline: float, limit: float) -> None:
        # flock(2) has no timeout; poll with a growing sleep. Only other processes can hold the
        # lock here (threads of this one queue on the thread lock), and they hold it for well
        # under a millisecond.
        delay = 0.0005
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EINTR):
                    raise IPAMError(f"cannot lock {self._lock_path}: {e.strerror or e}", path=self._lock_path) from e
            now = time.monotonic()
            if now >= deadline:
                raise IPAMError(f"timed out after {limit:g}s waiting for lock {self._lock_path}", path=self._lock_path)
            time.sleep(min(delay, deadline - now))
            delay = min(delay * 2, 0.02)

    def _check_subnet(self) -> None:
        path = os.path.join(self.directory, "subnet")
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            self._write(path, self._subnet_text)
            return
        except OSError as e:
            raise IPAMError(f"cannot read {path}: {e.strerror or e}", path=path) from e
        if text == self._subnet_text:
            return
        try:
            recorded = ipaddress.IPv4Network(text.strip(), strict=True)
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
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read(4096)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise IPAMError(f"cannot read {path}: {e.strerror or e}", path=path) from e
        return self._parse_pod(path, infra_id, text)

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
            addr = ipaddress.IPv4Address(ip)
            prefixlen = int(plen) if sep and plen.isdigit() else -1
        except ValueError:
            raise corrupt(f"bad address {ip!r}") from None
        if prefixlen != self.subnet.prefixlen or addr not in self.subnet:
            raise corrupt(f"address {cidr!r} is not in subnet {self.subnet}")
        if addr in (self.subnet.network_address, self.subnet.broadcast_address, self.gateway):
            raise corrupt(f"address {ip} is the network, broadcast or gateway address")
        if not namespace or not name:
            raise corrupt("empty namespace or pod name")
        return Allocation(infra_id, str(addr), prefixlen, namespace, name)

    def _read_owner(self, path: str) -> str | None:
        """The infra id in ``ips/<addr>``; None if absent, "" if torn."""
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read(512)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise IPAMError(f"cannot read {path}: {e.strerror or e}", path=path) from e
        owner = text[:-1] if text.endswith("\n") else ""
        try:
            validate_infra_id(owner)
        except InvalidArgument:
            return ""
        return owner

    def _repair_ip_file(self, record: Allocation) -> None:
        path = os.path.join(self._ips, record.ip)
        owner = self._read_owner(path)
        if owner == record.infra_id:
            return
        if owner is None or owner == "":
            # A crash between the two writes of an allocation (or a torn file): the pod record wins.
            self._write(path, f"{record.infra_id}\n", mode="in-place")
            return
        raise CorruptRecord(
            f"IPAM records disagree: {os.path.join(self._pods, record.infra_id)} says {record.ip} "
            f"but {path} names {owner!r}",
            path=path,
        )

    def _probe(self) -> ipaddress.IPv4Address:
        size = self._last - self._first + 1
        start = self._cursor_next()
        gateway = int(self.gateway)
        taken: set[str] | None = None
        for step in range(size):
            n = self._first + (start - self._first + step) % size
            if n == gateway:
                continue
            ip = str(ipaddress.IPv4Address(n))
            if taken is None:
                if step >= _PROBE_BEFORE_LISTING:
                    taken = set(self._ip_names())
                elif not os.path.lexists(os.path.join(self._ips, ip)):
                    return ipaddress.IPv4Address(n)
                else:
                    continue
            if ip not in taken:
                return ipaddress.IPv4Address(n)
        raise AddressesExhausted(
            # The bash plugin's words, so operators grep for one message whichever plugin runs.
            f"no free address in {self.subnet} (all {size - 1} pod addresses are allocated; see {self._ips})",
            path=self._ips,
            subnet=str(self.subnet),
        )

    def _cursor_next(self) -> int:
        """The first address to probe: the one after the cursor, or the subnet's first host."""
        path = os.path.join(self.directory, "cursor")
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                cursor = ipaddress.IPv4Address(f.read(64).strip())
        except (OSError, ValueError):
            return self._first  # absent or torn: start from the beginning, nothing is lost
        n = int(cursor)
        if not self._first <= n <= self._last:
            return self._first
        return n + 1 if n < self._last else self._first

    def _ip_names(self) -> Iterator[str]:
        for name in _listdir(self._ips):
            if not name.startswith("."):
                yield name

    def _scan_owned(self, infra_id: str) -> builtins.list[str]:
        return [ip for ip in self._ip_names() if self._read_owner(os.path.join(self._ips, ip)) == infra_id]

    def _write(self, path: str, text: str, *, mode: str = "atomic") -> None:
        """Write a record: "atomic" (temp file + rename), "exclusive" (O_EXCL) or "in-place"."""
        data = text.encode()
        if mode != "atomic":
            flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (os.O_EXCL if mode == "exclusive" else os.O_TRUNC)
            try:
                fd = os.open(path, flags, 0o644)
                try:
                    os.write(fd, data)
                finally:
                    os.close(fd)
            except OSError as e:
                raise IPAMError(f"cannot write {path}: {e.strerror or e}", path=path) from e
            return
        directory, base = os.path.split(path)
        tmp = os.path.join(directory, f".{base}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except OSError as e:
            _unlink(tmp)
            raise IPAMError(f"cannot write {path}: {e.strerror or e}", path=path) from e


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise IPAMError(f"cannot remove {path}: {e.strerror or e}", path=path) from e


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []
    except OSError as e:
        raise IPAMError(f"cannot list {path}: {e.strerror or e}", path=path) from e
