"""The NetworkPolicy agents running beside netplugin on a node, seen by what they keep in the kernel.

netplugin enforces no NetworkPolicy itself; an agent does (kube-network-policies, the one this
project is tested with: docs/networkpolicy.md). Such an agent filters pod traffic in the node's
netfilter, so what netplugin does there matters to it: bridged pod-to-pod traffic reaches netfilter
only with br_netfilter (``bridge-nf-call-ip(6)tables``), and netplugin's own tables must never be
what decides a packet the agent has to judge. ``netplugin doctor`` names the agents it sees here.

An agent is recognised by its own objects, read, never changed: an nftables table of its name, or
an iptables chain of its name in ``filter``. :data:`KNOWN` is that table of names.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass

from netplugin.core.netns import in_netns

__all__ = ["KNOWN", "KUBE_NETWORK_POLICIES", "KnownAgent", "Seen", "seen"]

_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class KnownAgent:
    """A NetworkPolicy agent and the kernel objects that show it runs."""

    name: str
    #: its nftables tables, as (family, name)
    nft_tables: tuple[tuple[str, str], ...] = ()
    #: its chains in iptables' ``filter`` table
    iptables_chains: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Seen:
    """An agent found on the node, and what showed it."""

    agent: str
    evidence: str


#: kube-network-policies queues the packets of the pods a policy selects from ``table inet
#: kube-network-policies`` (its controller's default ``NFTableName``)
KUBE_NETWORK_POLICIES = KnownAgent("kube-network-policies", nft_tables=(("inet", "kube-network-policies"),))
#: the agents recognised; kube-router and Calico (iptables mode) by the FORWARD chains they jump to
KNOWN: tuple[KnownAgent, ...] = (
    KUBE_NETWORK_POLICIES,
    KnownAgent("kube-router", iptables_chains=("KUBE-ROUTER-FORWARD",)),
    KnownAgent("calico", iptables_chains=("cali-FORWARD",)),
)


def _output(argv: list[str], netns: str | None) -> str:
    """``argv``'s standard output ("" when the command is missing or fails: then it shows nothing)."""
    if shutil.which(argv[0]) is None:
        return ""
    try:
        done = subprocess.run(in_netns(argv, netns), capture_output=True, text=True, timeout=_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""


def _nft_tables(netns: str | None) -> set[tuple[str, str]]:
    try:
        doc = json.loads(_output(["nft", "-j", "list", "tables"], netns) or "{}")
    except ValueError:
        return set()
    items = doc.get("nftables", []) if isinstance(doc, dict) else []
    return {(t["table"]["family"], t["table"]["name"]) for t in items if isinstance(t, dict) and "table" in t}


def _iptables_chains(netns: str | None) -> set[str]:
    lines = _output(["iptables", "-w", "-t", "filter", "-S"], netns).splitlines()
    return {line.split()[1] for line in lines if line.startswith("-N ") and len(line.split()) > 1}


def seen(netns: str | None = None, known: tuple[KnownAgent, ...] = KNOWN) -> list[Seen]:
    """The ``known`` agents whose objects are in ``netns`` (a path; default this namespace), in order."""
    tables = _nft_tables(netns)
    chains = _iptables_chains(netns) if any(a.iptables_chains for a in known) else set()
    out = []
    for agent in known:
        shown = [f"nftables table {f} {n}" for f, n in agent.nft_tables if (f, n) in tables]
        shown += [f"iptables chain {c}" for c in agent.iptables_chains if c in chains]
        if shown:
            out.append(Seen(agent.name, ", ".join(shown)))
    return out
