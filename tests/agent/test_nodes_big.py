"""Issue 21, class 3: a cluster of 5,000 kubelet-sized Nodes is listed page by page and routed.

Today's main parsed each LIST page (500 Nodes, about 140,000 JSON nodes) with the 50,000-node
limit of one config document: no cluster of more than about 170 nodes ever got a route. Here
the daemon's NodeKeeper (in-process, its route table and egress in a namespace of the test's)
watches the simulated API server and must install a route to every other node.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator

import pytest

from netplugin.agent.nodekeeper import NodeKeeper
from netplugin.core.config import Config
from netplugin.frontends.lab.simcluster.apiserver import ApiServer, kubelet_node
from netplugin.hosts.kube import KubeHost
from netplugin.hosts.kubeconfig import KubeSettings
from netplugin.nodenet.egress import Egress
from netplugin.nodenet.forward import Forward
from netplugin.nodenet.routes import RouteTable
from tests.support.nettest import ip_in as ip
from tests.support.nettest import kernel_gate, underlay_netns

pytestmark = pytest.mark.kernel

NODES = 5000
CLUSTER = ("fd6e:7031:1a00:8000::/49",)



@pytest.fixture
def netns(request: pytest.FixtureRequest) -> Iterator[str]:
    kernel_gate(request)
    with underlay_netns('b', ['fd6e:7031:1a00::1:0/96']) as name:
        yield name


def big_cluster(api: ApiServer, count: int) -> None:
    """Nodes n00000..: n00000 is this node; each a /64 of the cluster and an InternalIP on the underlay."""
    for i in range(count):
        api.apply(
            kubelet_node(f"n{i:05d}", [f"fd6e:7031:1a00:{0x8000 + i:x}::/64"], [f"fd6e:7031:1a00::1:{0x100 + i:x}"])
        )


def test_5000_nodes_list_page_by_page_and_get_their_routes(netns: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(var, raising=False)
    api = ApiServer(bookmark_interval=1.0)
    big_cluster(api, NODES)
    host = KubeHost(settings=KubeSettings(server=api.url, source="test"), proxies={}, environ={}, node_name="n00000")
    keeper = NodeKeeper(
        Config(cluster_cidrs=CLUSTER, node_resync=600.0),
        host,
        routes=RouteTable("n00000", cluster_cidrs=CLUSTER, netns=netns),
        egress=Egress(f"np{secrets.token_hex(3)}", netns=netns),
        forward=Forward(f"NP-{secrets.token_hex(3)}", netns=netns),
    )
    start = time.monotonic()
    keeper.start()
    try:
        deadline = time.monotonic() + 240
        while keeper.report is None or len(keeper.report.routes) < NODES - 1:
            assert time.monotonic() < deadline, keeper.status().get("watch")
            time.sleep(0.2)
        elapsed = time.monotonic() - start
        st = keeper.status()
    finally:
        keeper.stop()
        api.close()
    assert st["nodes"] == NODES and st["problems"] == [], st["problems"][:3]
    assert st["watch"]["nodes"]["synced"] and st["watch"]["nodes"]["lists"] == 1
    assert api.count("list", "nodes") == NODES // 500  # page by page, 500 a page
    kernel = json.loads(ip(netns, "-j", "-6", "route", "show", "proto", "78"))
    assert len(kernel) == NODES - 1
    assert {r["dst"]: r["gateway"] for r in kernel}["fd6e:7031:1a00:9387::/64"] == "fd6e:7031:1a00::1:1487"
    print(f"\n{NODES} nodes: first routes complete in {elapsed:.1f}s")
