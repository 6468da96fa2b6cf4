"""The cluster figures (issue 11), on a simulated cluster: nodes are network namespaces on a shared
underlay, each with its own ``netplugin serve`` watching the simulated API server.

* ``cluster-api``: API requests per pod setup. ``D-warm``: pods set up through each node's CLI,
  answered by its warm daemon, whose list+watch caches hold the node and its pods (target: 0).
  ``B-cli``: the same with ``use_daemon: never``, every CLI process asking the API itself
  (the reference: a GET of the pod and one of the node).
* ``cluster-routes``: route convergence with 50 nodes in the cluster: the time from a change in
  the API server until every daemon's kernel routes match it (polled with ``ip route``, so the
  figures include up to ~50 ms of polling). Rows: 47 nodes joining at once (3 -> 50), one node
  joining, one changing its InternalIP, one leaving (with 50 present), 47 leaving at once.

Everything lives in namespaces the figure creates (10.206.0.0/16 and fd6e:7031:1a00::/48 inside
them: the simulated cluster's ranges) and is removed at its end.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from netplugin.frontends.lab.simcluster.apiserver import make_node
from netplugin.frontends.lab.simcluster.cluster import SimCluster, node_addresses, node_pod_cidrs

from .report import Figure, Row
from .util import REPO, BenchError

__all__ = ["fig_cluster"]

CLUSTER_NODES = 50
MOVED = ("10.206.0.240", "fd6e:7031:1a00::f0")  # the InternalIPs a node moves to in "change-1"


def _requests(c: SimCluster) -> int:
    assert c.api is not None
    return c.api.count("get") + c.api.count("list")


def _api_figure(c: SimCluster, pods: int, say: Callable[[str], None]) -> Figure:
    fig = Figure(
        "cluster-api",
        "API requests per pod setup (simulated cluster)",
        "requests",
        ["per pod", "total"],
        notes=[
            f"{pods} pods set up through each node's CLI; GET and LIST requests counted by the API server "
            "(watch streams are long-lived and not counted)",
            "D-warm: the CLI hands the setup to the node's daemon, which answers the pod and node lookups "
            "from its list+watch caches",
            "B-cli: use_daemon never: each CLI process looks the pod and its node up itself",
        ],
    )
    nodes = list(c.nodes.values())
    for key, label, env in (("D-warm", "warm daemon", {}), ("B-cli", "CLI alone", {"NETPLUGIN_USE_DAEMON": "never"})):
        before = _requests(c)
        made = []
        for i in range(pods):
            node = nodes[i % len(nodes)]
            made.append(c.create_pod(node, f"{key.lower()}-{i}", env=env))
        total = _requests(c) - before
        fig.rows.append(Row(key, label, {"per pod": total / pods, "total": float(total)}))
        say(f"  {label}: {total} requests for {pods} pods")
        for pod in made:
            c.delete_pod(pod)
    return fig


def _timed_change(c: SimCluster, change: Callable[[], object]) -> float:
    start = time.monotonic()
    change()
    c.wait_routes(30.0)
    return (time.monotonic() - start) * 1000


def _node(i: int, ips: tuple[str, ...] | None = None) -> dict[str, Any]:
    return make_node(f"node-{i}", list(node_pod_cidrs(i)), list(ips or node_addresses(i)))


def _routes_figure(c: SimCluster, rounds: int, say: Callable[[str], None]) -> Figure:
    assert c.api is not None
    api = c.api
    real = len(c.nodes)
    extra = range(real + 1, CLUSTER_NODES + 1)
    samples: dict[str, list[float]] = {k: [] for k in ("join-all", "join-1", "change-1", "leave-1", "leave-all")}
    for _ in range(rounds):
        samples["join-all"].append(_timed_change(c, lambda: [api.apply(_node(i)) for i in extra]))
        samples["join-1"].append(_timed_change(c, lambda: api.apply(_node(CLUSTER_NODES + 1))))
        samples["change-1"].append(_timed_change(c, lambda: api.apply(_node(CLUSTER_NODES + 1, MOVED))))
        samples["leave-1"].append(_timed_change(c, lambda: api.delete("Node", f"node-{CLUSTER_NODES + 1}")))
        samples["leave-all"].append(_timed_change(c, lambda: [api.delete("Node", f"node-{i}") for i in extra]))
    labels = {
        "join-all": f"{len(extra)} nodes join at once ({real} -> {CLUSTER_NODES})",
        "join-1": f"one node joins ({CLUSTER_NODES} present)",
        "change-1": "one node changes its InternalIPs",
        "leave-1": "one node leaves",
        "leave-all": f"{len(extra)} nodes leave at once",
    }
    fig = Figure(
        "cluster-routes",
        f"Route convergence with {CLUSTER_NODES} nodes (every daemon's routes match the API)",
        "ms",
        ["median", "max"],
        notes=[
            f"{real} real nodes (namespaces with a daemon each) and up to {CLUSTER_NODES + 1 - real} more Node "
            f"objects on the same underlay; each node routes to every other's two pod CIDRs "
            f"(2 x {CLUSTER_NODES - 1} routes); {rounds} round(s)",
            "measured from the API server's change to the last daemon's kernel routes, polled every 20 ms",
        ],
    )
    for key, values in samples.items():
        fig.rows.append(Row(key, labels[key], {"median": statistics.median(values), "max": max(values)}))
        fig.samples[key] = values
        say(f"  {labels[key]}: median {statistics.median(values):.0f} ms, max {max(values):.0f} ms")
    return fig


def fig_cluster(quick: bool, say: Callable[[str], None]) -> list[Figure]:
    """Both cluster figures on one simulated cluster (2 nodes quick, 3 full)."""
    try:
        with SimCluster(plugin_source=REPO / "exec_plugins") as c:
            for _ in range(2 if quick else 3):
                c.add_node()
            c.wait_routes(10.0)
            return [_api_figure(c, 3 if quick else 20, say), _routes_figure(c, 1 if quick else 5, say)]
    except Exception as e:  # SystemFailure and friends: the figure fails, the run goes on
        raise BenchError(f"simulated cluster: {e}") from e
