"""All of a pod's addresses: one per configured family (IPv4, IPv6 or both), under one lock.

A bridge's IPAM directory holds the IPv4 files at its top and the IPv6 files in ``ipv6/``
(:func:`~netplugin.plugins.bridge.ipam.family_dir`); both families share the top directory's ``lock``,
which the bash plugin takes around the same work, so a pod gets both addresses or neither.

Release also frees a family that is no longer configured (a pod set up while the bridge was
dual-stack, torn down after IPv6 was dropped): nothing is leaked by a settings change.
"""

from __future__ import annotations

import ipaddress
import logging
import os
from collections.abc import Sequence

from netplugin.core.names import validate_infra_id, validate_namespace, validate_pod_name
from netplugin.plugins.bridge.ipam import IPAM, MAX_POD_RECORD, Allocation, CorruptRecord, Network, family_dir
from netplugin.plugins.bridge.ipam_files import DirLock, read_owner, read_text, unlink

__all__ = ["PodIPAM"]

log = logging.getLogger(__name__)


class PodIPAM:
    """The IPAMs of one bridge, one per family in ``subnets`` (the primary family first)."""

    def __init__(
        self,
        directory: str,
        subnets: Sequence[Network],
        gateways: Sequence[str | None] = (),
        *,
        lock_timeout: float = 30.0,
    ) -> None:
        self.directory = directory
        self.lock_path = os.path.join(directory, "lock")
        gws = list(gateways) + [None] * (len(subnets) - len(gateways))
        self.families = [
            IPAM(family_dir(directory, net.version), net, gw, lock_timeout=lock_timeout, lock_path=self.lock_path)
            for net, gw in zip(subnets, gws, strict=True)
        ]
        dirs = [d for f in self.families for d in f.lock.dirs[1:]]
        self.lock = DirLock(self.lock_path, dirs, lock_timeout)

    def __repr__(self) -> str:
        return f"PodIPAM({self.directory!r}, {[str(f.subnet) for f in self.families]!r})"

    def check(self, timeout: float | None = None) -> None:
        """Take the lock and check (or record) every family's subnet; for init."""
        with self.lock.hold(timeout):
            for f in self.families:
                f.check_subnet()
        for f in self.families:
            f.stock()

    def claim(
        self, infra_id: str, namespace: str, name: str, *, timeout: float | None = None
    ) -> tuple[list[Allocation], list[int]]:
        """The pod's address of every family (its existing ones, or new ones), in configured order,
        and the IP versions this call allocated (for a rollback that frees only those).

        All or nothing: when a family is exhausted, what this call allocated is released again.
        """
        validate_infra_id(infra_id)
        validate_namespace(namespace)
        validate_pod_name(name)
        with self.lock.hold(timeout):
            for f in self.families:
                f.check_subnet()
            allocs: list[Allocation] = []
            new: list[int] = []
            try:
                for f in self.families:
                    alloc, fresh = f.claim_locked(infra_id, namespace, name)
                    allocs.append(alloc)
                    if fresh:
                        new.append(f.subnet.version)
            except BaseException:
                self._release_locked(infra_id, new)
                raise
            return allocs, new

    def release(self, infra_id: str, versions: Sequence[int] = (4, 6), *, timeout: float | None = None) -> list[str]:
        """Free the pod's addresses of ``versions`` (default: both, configured or not). Idempotent."""
        validate_infra_id(infra_id)
        todo = [v for v in versions if os.path.lexists(self._pod_file(v, infra_id))]
        if not todo:
            return []
        with self.lock.hold(timeout):
            return self._release_locked(infra_id, todo)

    def lookup(self, infra_id: str, *, timeout: float | None = None) -> list[Allocation]:
        """The pod's allocations of the configured families, in configured order."""
        validate_infra_id(infra_id)
        with self.lock.hold(timeout):
            found = (f.lookup_locked(infra_id) for f in self.families)
            return [a for a in found if a is not None]

    def _pod_file(self, version: int, infra_id: str) -> str:
        return os.path.join(family_dir(self.directory, version), "pods", infra_id)

    def _release_locked(self, infra_id: str, versions: Sequence[int]) -> list[str]:
        freed: list[str] = []
        configured: dict[int, IPAM] = {f.subnet.version: f for f in self.families}
        for v in versions:
            f = configured.get(v)
            ip = f.release_locked(infra_id) if f is not None else _release_unconfigured(self.directory, v, infra_id)
            if ip is not None:
                freed.append(ip)
        return freed


def _release_unconfigured(directory: str, version: int, infra_id: str) -> str | None:
    """Free a pod's address of a family the bridge no longer has (the bash plugin does the same).

    Without a configured subnet the record is only checked for being an address of the right
    family, which is all it takes to name the address file safely.
    """
    d = family_dir(directory, version)
    pod_path = os.path.join(d, "pods", infra_id)
    text = read_text(pod_path, MAX_POD_RECORD)
    if text is None:
        return None
    ip = text.split(" ", 1)[0].partition("/")[0]
    try:
        addr = ipaddress.ip_address(ip)
        if addr.version != version or str(addr) != ip:
            raise ValueError(ip)
    except ValueError:
        raise CorruptRecord(f"corrupt IPAM record {pod_path}: bad address {ip!r}", path=pod_path) from None
    ip_path = os.path.join(d, "ips", ip)
    owner = read_owner(ip_path)
    if owner in (infra_id, ""):
        unlink(ip_path)
    elif owner is not None:
        log.warning("%s names %r, not %r: left in place", ip_path, owner, infra_id)
    unlink(pod_path)
    return ip
