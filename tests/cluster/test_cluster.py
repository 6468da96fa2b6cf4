"""The cluster suite's hostile-server cases: what only simcluster's API server can do to the daemons.

Three nodes as in ``test_kube_cluster.py`` (network namespaces on an underlay, each with its own
``netplugin serve``, ``host: kube``), but against simcluster's API server, which can break every
watch stream, compact its history and answer a re-watch with 410 Gone on demand. Everything else
the cluster suite checks (addresses, pod-to-pod and egress traffic, the daemons' cache, Nodes
added, changed and deleted, nodes off the segment, teardown) runs against the real kube-apiserver
in ``test_kube_cluster.py``. Nothing here touches the machine's own namespace.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from netplugin.frontends.lab.simcluster.apiserver import make_node
from netplugin.frontends.lab.simcluster.cluster import SimCluster, node_addresses
from tests.cluster.labnodes import cluster_unavailable_reason, started

pytestmark = pytest.mark.kernel


@pytest.fixture(scope="module")
def cluster() -> Iterator[SimCluster]:
    reason = cluster_unavailable_reason()
    if reason:
        pytest.skip(reason)
    with SimCluster(bookmark_interval=0.5) as c:
        yield started(c)


def _added_node(i: int) -> dict[str, object]:
    cidrs = [f"10.206.{128 + i}.0/24", f"fd6e:7031:1a00:{0x8000 + i:x}::/64"]
    return make_node(f"node-{i}", cidrs, list(node_addresses(i)))


def test_broken_watches_and_410_recover_without_losing_events(cluster: SimCluster) -> None:
    api = cluster.api
    assert api is not None
    api.apply(_added_node(10))
    cluster.wait_routes(2.0)
    # The streams drop; meanwhile one node leaves and another joins; history is compacted, and
    # the first re-watch is answered 410: the daemons must relist and see both changes.
    api.break_watches()
    api.delete("Node", "node-10")
    api.apply(_added_node(11))
    api.expire_history()
    api.answer_next_watches_410(len(cluster.nodes))
    cluster.wait_routes(5.0)
    for node in cluster.nodes.values():
        have = cluster.routes(node)
        assert "10.206.139.0/24" in have and "10.206.138.0/24" not in have
        watch = cluster.health(node)["node"]["watch"]["nodes"]
        assert watch["failures"] + watch["relists"] >= 1
    api.break_watches()  # a plain drop: resumed from the last revision, no relist needed
    api.delete("Node", "node-11")
    cluster.wait_routes(5.0)
