"""The big-cluster figure (issue 21): a daemon's first sync with 1,000 and 5,000 Nodes, and its memory.

One real node of the simulated cluster (its own ``netplugin serve``, host: kube) joins a cluster
whose other Nodes are objects only: kubelet-sized Nodes (about 280 JSON nodes each, as a kubelet
registers them) with an IPv6 pod CIDR inside the cluster's and an InternalIP on the underlay.
Measured from the daemon's start until its kernel table holds a route to every other node
(polled with ``ip route``, so up to ~50 ms of polling is included): the paged LIST (500 a page),
parsing, the route decisions and the netlink work. Memory is the daemon's RSS once it is there.
The reference row is the same daemon in a cluster of one.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from netplugin.frontends.lab.simcluster.apiserver import kubelet_node
from netplugin.frontends.lab.simcluster.cluster import SimCluster, SimNode
from netplugin.frontends.lab.simcluster.nsexec import ip

from .report import Figure, Row
from .util import REPO, BenchError

__all__ = ["fig_bigcluster"]

FULL = (1000, 5000)
QUICK = (50, 200)


def _phantoms(c: SimCluster, count: int) -> None:
    """``count`` Node objects with no namespace behind them (routes need only their objects)."""
    assert c.api is not None
    for i in range(count):
        c.api.apply(kubelet_node(f"big-{i:05d}", [f"fd6e:7031:1a00:{0xA000 + i:x}::/64"], [f"fd6e:7031:1a00::1:{i:x}"]))


def _routes(node: SimNode) -> int:
    return sum(1 for line in ip("-n", node.netns, "-6", "route", "show", "proto", "78").splitlines() if line.strip())


def _rss_mib(node: SimNode) -> float | None:
    import psutil

    if node.daemon is None:
        return None
    try:
        proc = psutil.Process(node.daemon.pid)
        procs = [proc, *proc.children(recursive=True)]
        return max(p.memory_info().rss for p in procs) / (1 << 20)
    except psutil.Error:
        return None


def _one(count: int, say: Callable[[str], None]) -> tuple[float, float | None]:
    with SimCluster(plugin_source=REPO / "exec_plugins") as c:
        node = c.add_node(1, start=False)
        _phantoms(c, count - 1)
        start = time.monotonic()
        c.start_daemon(node, ready_timeout=120.0)
        deadline = start + 600
        while _routes(node) < count - 1:
            if time.monotonic() > deadline:
                raise BenchError(f"{count} nodes: {_routes(node)} of {count - 1} routes after 600 s")
            time.sleep(0.05)
        took = time.monotonic() - start
        rss = _rss_mib(node)
        say(f"  {count} nodes: first sync {took:.2f} s, daemon RSS {rss or 0:.0f} MiB")
        return took, rss


def fig_bigcluster(quick: bool, say: Callable[[str], None]) -> list[Figure]:
    fig = Figure(
        "cluster-size",
        "A daemon's first sync in a big cluster: time until it routes to every node, and its memory",
        "s",
        ["nodes", "first sync", "RSS"],
        column_units={"nodes": "", "RSS": "MiB"},
        notes=[
            "one node with its own daemon; the others are kubelet-sized Node objects (about 280 JSON nodes each) "
            "listed 500 a page; time from the daemon's start until its kernel holds a route to each of them",
            "reference: the same daemon in a cluster of one (its start-up, no routes)",
        ],
    )
    try:
        for key, count in (("A", 1), *((f"D-{n}", n) for n in (QUICK if quick else FULL))):
            took, rss = _one(count, say)
            fig.rows.append(
                Row(key, f"{count:,} node{'s' if count > 1 else ''}",
                    {"nodes": float(count), "first sync": took, "RSS": rss})
            )
    except BenchError:
        raise
    except Exception as e:  # SystemFailure and friends: the figure fails, the run goes on
        raise BenchError(f"big cluster: {e}") from e
    return [fig]
