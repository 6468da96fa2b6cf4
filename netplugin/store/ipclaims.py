"""Which live pod holds an address: one claim per IP, so a member cannot hand out another pod's.

A chain member reports its pod's addresses in its setup document; nothing else stops a buggy or
hostile member from reporting an address another live pod already has (two pods, one IP: the
traffic of one goes to the other). A setup's addresses are claimed under ``<state_dir>/ips/``:
``ips/<ip>`` is a symbolic link (never followed) whose target is the holding pod's record file
name. ``symlink`` is atomic and fails when the claim exists, so of two setups racing for one
address exactly one wins. A claim whose record is gone (the pod was torn down, or gc removed it)
is stale and taken over; a claim is also released when its pod's teardown succeeds.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable

from netplugin.core.dirs import ensure_dir
from netplugin.core.names import PodRef
from netplugin.store.records import record_filename

__all__ = ["claim_ips", "release_ips"]


def _dir(state_dir: str) -> str:
    return os.path.join(state_dir, "ips")


def claim_ips(state_dir: str, ref: PodRef, ips: Iterable[str]) -> str | None:
    """Claim ``ips`` for ``ref``; the first address a live other pod holds, as "IP (pod FILE)", or None.

    Claims made before a refusal are kept: the pod's rollback or teardown releases them, and a
    stale one is taken over anyway.
    """
    d = _dir(state_dir)
    ensure_dir(d, base=state_dir)
    mine = record_filename(ref)
    records = os.path.join(state_dir, "pods")
    for ip in ips:
        path = os.path.join(d, ip.replace(":", "_"))  # IPv6 colons: file names stay portable
        for _ in range(3):  # a claim that goes stale meanwhile is tried again
            try:
                os.symlink(mine, path)
                break
            except FileExistsError:
                pass
            try:
                holder = os.readlink(path)
            except FileNotFoundError:
                continue  # released meanwhile
            if holder == mine:
                break
            if os.path.lexists(os.path.join(records, os.path.basename(holder))):
                return f"{ip} (held by the pod of record {os.path.basename(holder)})"
            _replace(path, mine)  # stale: its pod's record is gone
            break
    return None


def _replace(path: str, target: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    os.symlink(target, tmp)
    os.replace(tmp, path)


def release_ips(state_dir: str, ref: PodRef, ips: Iterable[str]) -> None:
    """Drop ``ref``'s claims on ``ips`` (those another pod has taken over are left alone)."""
    mine = record_filename(ref)
    d = _dir(state_dir)
    for ip in ips:
        path = os.path.join(d, ip.replace(":", "_"))
        try:
            if os.readlink(path) == mine:
                os.unlink(path)
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.EINVAL):
                raise
