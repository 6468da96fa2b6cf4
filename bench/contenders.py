"""The contenders: five ways of wiring a pod to a Linux bridge, behind one small interface.

A  the reference CNI ``bridge`` + ``host-local`` plugins v1.10 (scripts/build-peers.sh builds them
   into ``$NETPLUGIN_PEERS/cni``), exec'd the way libcni does it: CNI_* environment, the network
   config on stdin. O is the same with Debian's containernetworking-plugins 1.1.1, the old reference.
   Without the peer build, A falls back to Debian's 1.1.1 (and O, the same plugins, is left out).
B  the ``netplugin`` CLI (a new process per action) with ``exec_plugins/bridge``.
C  the daemon (``netplugin serve``) with ``exec_plugins/bridge``; the benchmark is its client.
D  the daemon with the in-process plugin ``netplugin.io/bridge``.
E  the floor: the same netlink requests sent directly with pyroute2 from the benchmark's own
   process: no exec, no IPAM, no locks, no state.

Every contender wires a pod the same way: a veth pair whose host end is a port of the
network's bridge (hairpin on) and whose pod end is ``eth0`` with an address of the subnet and
a default route via the bridge's gateway address. ipMasq is off for A; no contender touches
iptables.

This module is the interface and the table; the contenders live by kind: a process per action
(:mod:`bench.processes`: A, B, X), a daemon of their own (:mod:`bench.daemon`: C, D) and the
floor (:mod:`bench.floor`: E).
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

from .util import Pod

if TYPE_CHECKING:
    from .context import Network

__all__ = ["CNI_DIR", "CONTENDERS", "LABELS", "PEERS_ENV", "Contender", "a_is_fallback", "cni_dir", "reference_version"]

#: Debian's containernetworking-plugins (1.1.1): contender O
CNI_DIR = "/usr/lib/cni"
#: the peer build's directory (scripts/build-peers.sh prints it); the CNI plugins v1.10 are in its cni/
PEERS_ENV = "NETPLUGIN_PEERS"


def _peer_cni_dir() -> str:
    peers = os.environ.get(PEERS_ENV, "")
    return os.path.join(peers, "cni") if peers else ""


def a_is_fallback() -> bool:
    """True when the v1.10 plugins are not built, so that A is Debian's 1.1.1."""
    d = _peer_cni_dir()
    return not (d and os.access(os.path.join(d, "bridge"), os.X_OK))


def cni_dir(key: str) -> str:
    """The CNI plugin directory of reference contender ``key``: A v1.10 (Debian's 1.1.1 as the fallback),
    O Debian's 1.1.1."""
    return CNI_DIR if key == "O" or a_is_fallback() else _peer_cni_dir()


@functools.cache
def reference_version(key: str) -> str:
    """The version of reference contender ``key``'s CNI plugins: the module version Go built into its
    ``bridge`` ("v1.10.0"), else (Debian's build carries none) the Debian package's."""
    try:
        with open(os.path.join(cni_dir(key), "bridge"), "rb") as f:
            found = re.search(rb"\tgithub\.com/containernetworking/plugins\t(v[0-9][0-9A-Za-z.+-]*)", f.read())
    except OSError:
        return "not found"
    if found:
        return found.group(1).decode()
    query = ["dpkg-query", "-W", "-f", "${Version}", "containernetworking-plugins"]
    done = subprocess.run(query, capture_output=True, text=True, check=False)
    return f"{done.stdout.strip()} (Debian)" if done.returncode == 0 and done.stdout.strip() else "unknown"


#: key -> one-line description, in report order
CONTENDERS = {
    "A": "CNI bridge + host-local "
    + ("1.1.1, Debian's (fallback: the v1.10 peers are not built)" if a_is_fallback() else "v1.10")
    + " (exec per ADD/DEL)",
    "B": "netplugin CLI + exec_plugins/bridge",
    "C": "netplugin daemon + exec_plugins/bridge",
    "D": "netplugin daemon + netplugin.io/bridge (native)",
    "E": "floor: pyroute2 in one process (no exec, no IPAM)",
    "O": "CNI bridge + host-local 1.1.1, Debian's (the old reference A)",
}
#: row labels, contenders and the reference rows some figures add
LABELS = {
    **CONTENDERS,
    "X": "reference: exec_plugins/bridge exec'd directly, no netplugin",
}



class Contender:
    """One way of setting pods up. ``setup``/``teardown`` raise BenchError when the contender fails."""

    key: ClassVar[str] = "?"
    #: True when ``burst`` really runs setups concurrently
    concurrent: ClassVar[bool] = True

    def __init__(self, net: Network) -> None:
        self.net = net
        self.ctx = net.ctx

    @property
    def label(self) -> str:
        return LABELS[self.key]

    def start(self) -> None:
        """Get ready (start a daemon, create the bridge); not timed."""

    def setup(self, pod: Pod) -> None:
        raise NotImplementedError

    def teardown(self, pod: Pod) -> None:
        raise NotImplementedError

    def burst(self, pods: Sequence[Pod]) -> float:
        """Set all ``pods`` up at once; returns the makespan in seconds."""
        raise NotImplementedError

    def drain(self, pods: Sequence[Pod]) -> float:
        """Tear all ``pods`` down as fast as this contender can; returns seconds."""
        t0 = time.perf_counter()
        for p in pods:
            self.teardown(p)
        return time.perf_counter() - t0

    def populate(self, pods: Sequence[Pod]) -> None:
        """Set ``pods`` up by the fastest path this contender has (not timed)."""
        for p in pods:
            self.setup(p)

    def rss(self) -> int | None:
        """Resident memory of this contender's long-running process, if it has one (bytes)."""
        return None

    def stop(self) -> None:
        """Stop what ``start`` started (the network itself is closed by its owner)."""

