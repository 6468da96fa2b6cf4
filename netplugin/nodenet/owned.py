"""What netplugin owns in a node's kernel outside its pods, as one list: what an uninstall removes.

Each entry says what it is and can tell whether it is there and remove it (idempotent). Today:
the egress table (``table inet netplugin``, :mod:`.egress`) and the routes to other nodes' pod
CIDRs (``proto 78``, :mod:`.routes`). Node-level objects added later (a hostPort table, an
iptables chain of FORWARD rules) belong here too, so that uninstall (and anything else that must
know what netplugin made) finds them without knowing each one. Pods' own interfaces are not here:
their plugins make and remove them (teardown).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable

from netplugin.core.errors import NetpluginError, SystemFailure
from netplugin.core.plaindata import dataclass
from netplugin.nodenet.egress import DEFAULT_TABLE, Egress
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


def _egress_present(netns: str | None) -> list[str]:
    egress = Egress(DEFAULT_TABLE, netns=netns)
    return [f"nftables table inet {DEFAULT_TABLE}"] if shutil.which("nft") and egress.present() else []


def _egress_remove(netns: str | None) -> None:
    if shutil.which("nft"):
        Egress(DEFAULT_TABLE, netns=netns).remove()


def _ip(netns: str | None, *args: str) -> str:
    argv = ["ip", *args] if netns is None else ["nsenter", f"--net={netns}", "ip", *args]
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
)


def remove_owned(netns: str | None = None, *, dry_run: bool = False) -> tuple[list[str], list[str]]:
    """Remove every owned object (in ``netns``, default this namespace): (what was there, errors)."""
    removed: list[str] = []
    errors: list[str] = []
    for owned in OWNED:
        try:
            there = owned.present(netns)
            if there and not dry_run:
                owned.remove(netns)
            removed += there
        except NetpluginError as e:
            errors.append(f"{owned.what}: {e.message}")
    return removed, errors
