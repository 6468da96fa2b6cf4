"""What netplugin owns in a node's kernel outside its pods, as one list: what an uninstall removes.

Each entry says what it is and can tell whether it is there and remove it (idempotent). Today:
the egress table (``table inet netplugin``, :mod:`.egress`) and the routes to other nodes' pod
CIDRs (``proto 78``, :mod:`.routes`), the hostPort table (``table inet netplugin_hostport``) and
the iptables chain of FORWARD accepts (:mod:`.forward`). A node-level object added later belongs
here too, so that uninstall (and anything else that must know what netplugin made) finds it
without knowing each one. Pods' own interfaces are not here: their plugins make and remove them
(teardown).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

from netplugin.core.errors import NetpluginError, SystemFailure
from netplugin.core.hostports import HOSTPORT_TABLE
from netplugin.core.netns import in_netns
from netplugin.nodenet.egress import DEFAULT_TABLE, Egress
from netplugin.nodenet.forward import Forward
from netplugin.nodenet.routes import RTPROT_NETPLUGIN

__all__ = ["OWNED", "Owned", "remove_owned"]

_TIMEOUT = 10.0


@dataclass(frozen=True)
class Owned:
    """One kind of kernel object netplugin makes on a node."""

    what: str
    #: (netns path or None) -> a description of each one there now
    present: Callable[[str | None], list[str]]
    #: (netns path or None) -> None; removes every one (idempotent)
    remove: Callable[[str | None], None]
    #: live pods' network depends on it (their hostPorts, the localhost guard): kept while pods
    #: may be live, removed only once every pod is torn down
    pods_need: bool = False


def _egress_present(netns: str | None) -> list[str]:
    egress = Egress(DEFAULT_TABLE, netns=netns)
    return [f"nftables table inet {DEFAULT_TABLE}"] if shutil.which("nft") and egress.present() else []


def _egress_remove(netns: str | None) -> None:
    if shutil.which("nft"):
        Egress(DEFAULT_TABLE, netns=netns).remove()


def _hostport_present(netns: str | None) -> list[str]:
    if not shutil.which("nft"):
        return []
    done = _run(netns, "nft", "list", "table", *HOSTPORT_TABLE.split(), ok=(0, 1))
    return [f"nftables table {HOSTPORT_TABLE}"] if done else []


def _hostport_remove(netns: str | None) -> None:
    if _hostport_present(netns):
        _run(netns, "nft", "delete", "table", *HOSTPORT_TABLE.split())


def _forward_present(netns: str | None) -> list[str]:
    forward = Forward(netns=netns)
    states = forward.check()
    return [f"ip{'' if s.version == 4 else '6'}tables chain {forward.chain}" for s in states if s.jumps or s.accepted]


def _forward_remove(netns: str | None) -> None:
    Forward(netns=netns).remove()


def _run(netns: str | None, *argv: str, ok: tuple[int, ...] = (0,)) -> bool:
    """Run ``argv`` (in ``netns``): True on exit 0, False on another code in ``ok``; else raises."""
    full = in_netns(list(argv), netns)
    try:
        done = subprocess.run(full, capture_output=True, text=True, timeout=_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SystemFailure(argv[0], None, f"cannot run {' '.join(full)}: {e}") from e
    if done.returncode not in ok:
        raise SystemFailure(argv[0], None, f"{' '.join(full)}: {done.stderr.strip()[-400:]}")
    return done.returncode == 0


def _ip(netns: str | None, *args: str) -> str:
    argv = in_netns(["ip", *args], netns)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SystemFailure("routes", None, f"cannot run {' '.join(argv)}: {e}") from e
    if done.returncode != 0:
        raise SystemFailure("routes", None, f"{' '.join(argv)}: {done.stderr.strip()[-400:]}")
    return done.stdout


def _routes_present(netns: str | None) -> list[str]:
    out = []
    for family in ("-4", "-6"):
        for r in json.loads(_ip(netns, "-j", family, "route", "show", "proto", str(RTPROT_NETPLUGIN)) or "[]"):
            out.append(f"route {r.get('dst')} via {r.get('gateway', '-')} (proto {RTPROT_NETPLUGIN})")
    return out


def _routes_remove(netns: str | None) -> None:
    for family in ("-4", "-6"):
        _ip(netns, family, "route", "flush", "proto", str(RTPROT_NETPLUGIN))


#: everything netplugin owns in the node's kernel (outside pods), in the order uninstall removes it
OWNED: tuple[Owned, ...] = (
    Owned("egress table", _egress_present, _egress_remove),
    Owned("routes to other nodes", _routes_present, _routes_remove),
    Owned("hostPort table", _hostport_present, _hostport_remove, pods_need=True),
    Owned("FORWARD accept chain", _forward_present, _forward_remove),
)


def remove_owned(
    netns: str | None = None, *, dry_run: bool = False, pods_live: bool = False
) -> tuple[list[str], list[str], list[str]]:
    """Remove every owned object (in ``netns``, default this namespace): (what was there and removed,
    what was there and kept, errors). ``pods_live``: pods may still be live, so what their network
    needs (:attr:`Owned.pods_need`) is kept."""
    removed: list[str] = []
    kept: list[str] = []
    errors: list[str] = []
    for owned in OWNED:
        try:
            there = owned.present(netns)
            if there and owned.pods_need and pods_live:
                kept += there
                continue
            if there and not dry_run:
                owned.remove(netns)
            removed += there
        except NetpluginError as e:
            errors.append(f"{owned.what}: {e.message}")
    return removed, kept, errors
