"""Egress: masquerade pod traffic that leaves the cluster, with nftables.

In detail: ``ARCHITECTURE.md``, "Module notes".

Pods have addresses from the node's pod CIDRs, which nothing outside the cluster routes back to.
Traffic from a pod to an address outside the cluster CIDRs therefore leaves the node with the
node's own address as its source (``masquerade``: the address of the outgoing interface, looked
up per connection, so a node whose address changes needs no update). Traffic between pods, on one
node or across nodes, keeps the pod's address: Kubernetes requires pods to see each other's real
addresses.
"""

from __future__ import annotations

import ipaddress
import re
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from netplugin.core.netns import in_netns

from ..core.errors import TAIL, InvalidArgument, NetpluginError

__all__ = ["DEFAULT_TABLE", "Egress", "EgressError", "EgressRules", "parse_cidrs"]

DEFAULT_TABLE = "netplugin"
_TABLE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,31}\Z")
_COMMENT = "netplugin pod egress"

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class EgressError(NetpluginError):
    """nft failed, timed out or is missing; carries the command's stderr tail."""


def parse_cidrs(field: str, values: Iterable[str] | str) -> tuple[Network, ...]:
    """CIDRs from a list (or a comma-separated string); each must be a network address exactly.

    Raises :class:`InvalidArgument` naming ``field``.
    """
    if isinstance(values, str):
        items = [v.strip() for v in values.split(",")] if values.strip() else []
    else:
        items = [str(v).strip() for v in values]
    out: list[Network] = []
    for item in items:
        try:
            out.append(ipaddress.ip_network(item, strict=True))
        except ValueError as e:
            raise InvalidArgument(field, item, f"not a network in CIDR form ({e})") from None
    return tuple(out)


@dataclass(frozen=True, slots=True)
class EgressRules:
    """The sets of one table, per family; :meth:`render` gives the nft script that installs them."""

    table: str
    pods4: tuple[ipaddress.IPv4Network, ...]
    inside4: tuple[ipaddress.IPv4Network, ...]
    pods6: tuple[ipaddress.IPv6Network, ...]
    inside6: tuple[ipaddress.IPv6Network, ...]

    @classmethod
    def build(cls, table: str, cluster_cidrs: Sequence[Network], pod_cidrs: Sequence[Network]) -> EgressRules:
        def family(version: int) -> tuple[list[Network], list[Network]]:
            cluster = [n for n in cluster_cidrs if n.version == version]
            pods = [n for n in pod_cidrs if n.version == version]
            return (pods or cluster), cluster + pods

        p4, i4 = family(4)
        p6, i6 = family(6)
        return cls(
            table=table,
            pods4=_collapse4(p4),
            inside4=_collapse4(i4),
            pods6=_collapse6(p6),
            inside6=_collapse6(i6),
        )

    def render(self) -> str:
        """``table``; ``delete table``; the table: one transaction that replaces it, or creates it."""
        sets: list[str] = []
        rules: list[str] = []
        for name, kind, match, pods, inside in (
            ("4", "ipv4_addr", "ip", self.pods4, self.inside4),
            ("6", "ipv6_addr", "ip6", self.pods6, self.inside6),
        ):
            if not pods:
                continue
            for set_name, nets in ((f"pods{name}", pods), (f"inside{name}", inside)):
                elements = ", ".join(str(n) for n in nets)
                sets.append(f"\tset {set_name} {{ type {kind}; flags interval; elements = {{ {elements} }}; }}")
            rules.append(
                f'\t\t{match} saddr @pods{name} {match} daddr != @inside{name} masquerade comment "{_COMMENT}"'
            )
        body = "\n".join(
            [
                *sets,
                "\tchain postrouting {",
                "\t\ttype nat hook postrouting priority srcnat; policy accept;",
                *rules,
                "\t}",
            ]
        )
        return f"table inet {self.table}\ndelete table inet {self.table}\ntable inet {self.table} {{\n{body}\n}}\n"


def _collapse4(nets: Sequence[Network]) -> tuple[ipaddress.IPv4Network, ...]:
    # nft refuses overlapping interval elements; collapse_addresses also sorts, so output is stable.
    return tuple(ipaddress.collapse_addresses([n for n in nets if isinstance(n, ipaddress.IPv4Network)]))


def _collapse6(nets: Sequence[Network]) -> tuple[ipaddress.IPv6Network, ...]:
    return tuple(ipaddress.collapse_addresses([n for n in nets if isinstance(n, ipaddress.IPv6Network)]))


class Egress:
    """The masquerade table of one network namespace.

    ``netns`` (a path such as ``/var/run/netns/NAME``) runs nft in that namespace through
    ``nsenter``; by default nft runs in the caller's own namespace, which is what the daemon wants.
    """

    def __init__(
        self, table: str = DEFAULT_TABLE, *, netns: str | None = None, nft: str = "nft", timeout: float = 10.0
    ) -> None:
        if not _TABLE_NAME.match(table):
            raise InvalidArgument("table", table, "1-32 characters of letters, digits and '_', starting with a letter")
        self.table = table
        self.netns = netns
        self.nft = nft
        self.timeout = timeout

    def __repr__(self) -> str:
        where = f", netns={self.netns!r}" if self.netns else ""
        return f"Egress(table inet {self.table}{where})"

    def rules(self, cluster_cidrs: Iterable[str] | str, pod_cidrs: Iterable[str] | str = ()) -> EgressRules:
        """Validate the CIDRs (InvalidArgument names ``cluster_cidrs`` or ``pod_cidrs``)."""
        cluster = parse_cidrs("cluster_cidrs", cluster_cidrs)
        pods = parse_cidrs("pod_cidrs", pod_cidrs)
        if not cluster and not pods:
            raise InvalidArgument("cluster_cidrs", "", "empty: masquerading needs at least one cluster or pod CIDR")
        return EgressRules.build(self.table, cluster, pods)

    def ensure(self, cluster_cidrs: Iterable[str] | str, pod_cidrs: Iterable[str] | str = ()) -> EgressRules:
        """Install (or replace) the table: one transaction, idempotent. Returns what was installed."""
        rules = self.rules(cluster_cidrs, pod_cidrs)
        self._nft(["-f", "-"], rules.render(), "install")
        return rules

    def remove(self) -> None:
        """Delete the table if it exists; nothing else. Idempotent."""
        self._nft(["-f", "-"], f"table inet {self.table}\ndelete table inet {self.table}\n", "remove")

    def present(self) -> bool:
        """Whether the table exists."""
        out = self._nft(["list", "tables", "inet"], None, "list")
        return f"table inet {self.table}" in out.splitlines()

    def listing(self) -> str:
        """``nft list table inet TABLE`` ("" when there is no such table)."""
        if not self.present():
            return ""
        return self._nft(["list", "table", "inet", self.table], None, "list")

    def _nft(self, args: list[str], script: str | None, what: str) -> str:
        verb = f"{what} nftables table inet {self.table}"
        # Checked here: through nsenter a missing nft is only an exit status.
        if shutil.which(self.nft) is None:
            raise EgressError(
                f"cannot {verb}: {self.nft} not found (install the nftables package, e.g. apt-get install nftables)",
                table=self.table,
            )
        argv = in_netns([self.nft, *args], self.netns)
        try:
            done = subprocess.run(
                argv,
                input=script if script is not None else "",
                capture_output=True,
                text=True,
                timeout=self.timeout,
                check=False,
            )
        except FileNotFoundError:
            raise EgressError(
                f"cannot {verb}: {argv[0]} not found (install the nftables package, e.g. apt-get install nftables)",
                table=self.table,
            ) from None
        except subprocess.TimeoutExpired:
            raise EgressError(f"cannot {verb}: nft did not finish within {self.timeout:g}s", table=self.table) from None
        except OSError as e:
            raise EgressError(f"cannot {verb}: cannot run {argv[0]}: {e.strerror or e}", table=self.table) from e
        if done.returncode != 0:
            tail = done.stderr.strip()[-TAIL:]
            raise EgressError(
                f"cannot {verb}: nft exited with status {done.returncode}: {tail or '(no message)'}",
                table=self.table,
                exit_status=done.returncode,
                stderr_tail=tail,
            )
        return done.stdout
