"""What the daemon lends a worker for a call (callpool.lend), and how the worker's host answers with it.

A worker asks the daemon's host, whose list+watch caches answer without a request, for this node
and the call's pod; what that host cannot answer the worker asks its own. So a worker asks the API
server nothing the daemon knows, and a setup in a worker works while the API is away exactly when
the daemon's own would have.
"""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from netplugin.core.errors import HostError
from netplugin.core.node import NodeInfo
from netplugin.frontends.daemon.callpool import lend
from netplugin.frontends.daemon.callworker import Lent, LentHost
from netplugin.hosts.base import Pod
from tests.support.fakehost import DownHost, FakeHost

NODE = NodeInfo("node-a", ("10.244.1.0/24",), ("192.0.2.10",))
POD: Pod = {"metadata": {"namespace": "web", "name": "web-0", "annotations": {"k": "v"}}}
ARGS = "IgnoreUnknown=1;K8S_POD_NAMESPACE=web;K8S_POD_NAME=web-0"


class NodeDown(FakeHost):
    """Pods answered; the Node cannot be (the API away, no cache of it)."""

    def node_info(self) -> NodeInfo:
        raise HostError("connection refused", status=503)


def _fake() -> FakeHost:
    return FakeHost({("web", "web-0"): POD}, nodes=[NODE], node_name="node-a")


@pytest.mark.parametrize(
    ("host", "cni_args", "lent"),
    [
        pytest.param(_fake(), ARGS, (NODE, ("web", "web-0", POD)), id="node-and-pod"),
        pytest.param(_fake(), "K8S_POD_NAMESPACE=web;K8S_POD_NAME=gone", (NODE, ("web", "gone", None)), id="no-pod"),
        pytest.param(_fake(), "IgnoreUnknown=1", (NODE, None), id="no-pod-named"),
        pytest.param(_fake(), "K8S_POD_NAME", (NODE, None), id="cni-args-not-key-value"),
        pytest.param(DownHost(), ARGS, (NodeInfo("down-node"), None), id="api-away-pod-left-to-the-worker"),
        pytest.param(NodeDown({("web", "web-0"): POD}), ARGS, (None, ("web", "web-0", POD)), id="node-left-to-worker"),
    ],
)
def test_lend_gives_what_the_daemons_host_answers_and_leaves_the_rest(host: Any, cni_args: str, lent: Lent) -> None:
    got = lend(host, {"CNI_COMMAND": "ADD", "CNI_ARGS": cni_args})
    assert got == lent
    assert pickle.loads(pickle.dumps(got)) == got  # it travels to the worker


def test_the_workers_host_answers_from_what_was_lent_and_asks_its_own_for_the_rest() -> None:
    own = FakeHost({("web", "web-1"): {"metadata": {"name": "web-1"}}}, node_name="node-a")
    host = LentHost(own)
    host.lent = (NODE, ("web", "web-0", POD))
    assert host.node_info() == NODE
    assert host.get_pod_by_name("web", "web-0") == POD
    assert own.lookups == []  # nothing asked of its own host
    assert host.get_pod_by_name("web", "web-1") == {"metadata": {"name": "web-1"}}  # another pod: its own
    assert own.lookups == [("web", "web-1")]
    host.lent = (None, ("web", "gone", None))  # the daemon's host said the pod does not exist
    assert host.get_pod_by_name("web", "gone") is None
    assert own.lookups == [("web", "web-1")]
    assert host.node_info() == NodeInfo("node-a")  # nothing lent: its own
    assert host.node_name == "node-a"
