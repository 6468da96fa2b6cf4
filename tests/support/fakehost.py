"""A Host for tests: pods and nodes from dicts, every pod lookup recorded."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from netplugin.core.errors import HostError
from netplugin.core.node import NodeInfo
from netplugin.hosts.base import Pod

__all__ = ["DownHost", "FakeHost"]


class FakeHost:
    """Pods from a dict keyed by ``(namespace, name)``; records every lookup."""

    def __init__(
        self,
        pods: Mapping[tuple[str, str], Pod] | None = None,
        client: Any | None = None,
        *,
        nodes: Iterable[NodeInfo] = (),
        node_name: str = "fake-node",
    ) -> None:
        self.pods: dict[tuple[str, str], Pod] = dict(pods or {})
        self.client = client
        self.lookups: list[tuple[str, str]] = []
        self.nodes: dict[str, NodeInfo] = {n.name: n for n in nodes}
        self._node_name = node_name

    def add(self, pod: Pod) -> None:
        meta = pod.get("metadata") or {}
        self.pods[(meta.get("namespace", "default"), meta["name"])] = pod

    def get_pod_by_name(self, namespace: str, name: str) -> Pod | None:
        self.lookups.append((namespace, name))
        return self.pods.get((namespace, name))

    def kube_client(self) -> Any | None:
        return self.client

    @property
    def node_name(self) -> str:
        return self._node_name

    def node_info(self) -> NodeInfo:
        return self.nodes.get(self._node_name) or NodeInfo(self._node_name)

    def list_nodes(self) -> list[NodeInfo]:
        return [self.nodes[k] for k in sorted(self.nodes)]


class DownHost:
    """A host that cannot answer (an API server that is away): every pod lookup is a HostError, counted."""

    def __init__(self) -> None:
        self.lookups = 0

    def get_pod_by_name(self, namespace: str, name: str) -> Pod | None:
        self.lookups += 1
        raise HostError("connection refused", status=503, url="https://api.invalid/pods")

    def kube_client(self) -> Any | None:
        return None

    @property
    def node_name(self) -> str:
        return "down-node"

    def node_info(self) -> NodeInfo:
        return NodeInfo(self.node_name)  # known by name only, as a host without the Node's object answers

    def list_nodes(self) -> list[NodeInfo]:
        return []
