"""What the cluster suites share: whether they can run, their three started nodes, a node's metrics.

The suites differ in their API server (simcluster's, or the real control plane of
:mod:`tests.cluster.kubecluster`) and in their runtime; the nodes, as network namespaces on an
underlay each with its own ``netplugin serve``, are :class:`SimCluster`'s in all of them.
"""

from __future__ import annotations

import shutil
import sys
from typing import TypeVar

from netplugin.frontends.lab.simcluster.cluster import SimCluster, SimNode
from tests.support.nettest import kernel_unavailable_reason

__all__ = ["cluster_unavailable_reason", "plugin_operations", "scrape_metrics", "started"]

C = TypeVar("C", bound=SimCluster)


def cluster_unavailable_reason() -> str | None:
    """Why this machine cannot run a cluster of network namespaces, or None."""
    return kernel_unavailable_reason() or (None if shutil.which("nft") else "nft (nftables) is not installed")


def started(cluster: C, nodes: int = 3) -> C:
    """``cluster`` with ``nodes`` nodes added and every node's routes to the others in place."""
    for _ in range(nodes):
        cluster.add_node()
    cluster.wait_routes(10.0)
    return cluster


def scrape_metrics(cluster: SimCluster, node: SimNode) -> str:
    """The node daemon's /metrics text, fetched inside the node (the daemon listens on its loopback)."""
    url = f"http://{cluster.health(node)['metrics_address']}/metrics"
    code = f"import urllib.request; print(urllib.request.urlopen({url!r}, timeout=10).read().decode())"
    done = cluster.exec_in(node.netns, [sys.executable, "-c", code])
    assert done.returncode == 0, done.stderr
    return done.stdout.decode()


def plugin_operations(cluster: SimCluster, node: SimNode) -> dict[str, float]:
    """The node daemon's kubelet_network_plugin_operations_total by operation."""
    out = {}
    for line in scrape_metrics(cluster, node).splitlines():
        if line.startswith("kubelet_network_plugin_operations_total{"):
            out[line.split('operation_type="', 1)[1].split('"', 1)[0]] = float(line.rsplit(" ", 1)[1])
    return out
