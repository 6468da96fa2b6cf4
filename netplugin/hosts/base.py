"""Where pods come from: the ``Host`` seam.

As in the kubelet's exec plugin, a plugin manager asks its host for the pod
object of a (namespace, name) pair and, for plugins that want it, a kube
client. netplugin hands the pod to exec plugins as JSON on stdin.

Hosts here:

* :class:`FakeHost` — an in-memory dict, for tests.
* :class:`StaticHost` — pod manifests (YAML or JSON, one pod per file) in a
  directory; the embedded default that needs no cluster (used by the demo).
* ``netplugin.hosts.kube.KubeHost`` — a real API server (lives in its own module so
  that its imports stay off the CLI's cold path).

Every host also knows the node netplugin runs on (:meth:`Host.node_info`, handed to
plugins) and the nodes of its cluster (:meth:`Host.list_nodes`, which the daemon routes to).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

from netplugin.core.node import NodeInfo, node_name

__all__ = ["FakeHost", "Host", "NullHost", "Pod"]

Pod = dict[str, Any]


@runtime_checkable
class Host(Protocol):
    """What the manager needs from its surroundings."""

    def get_pod_by_name(self, namespace: str, name: str) -> Pod | None:
        """The pod object (a Kubernetes Pod as a dict), or None when the host does not know it.

        Raises :class:`~netplugin.core.errors.HostError` when the host cannot answer at all.
        """
        ...

    def kube_client(self) -> Any | None:
        """A Kubernetes client for plugins that want one, or None."""
        ...

    @property
    def node_name(self) -> str:
        """This node's name (known even when nothing else about the node is)."""
        ...

    def node_info(self) -> NodeInfo:
        """This node: its pod CIDRs and InternalIPs, or just its name when the host has no record of it.

        Raises :class:`~netplugin.core.errors.HostError` when the host cannot answer at all.
        """
        ...

    def list_nodes(self) -> list[NodeInfo]:
        """Every node of the cluster (this one included), sorted by name. HostError as above."""
        ...


class NullHost:
    """Knows no pods and has no client (the kubelet's ``NewFakeHost(nil)``); knows this node by name only."""

    def __init__(self, node_name: str | None = None) -> None:
        self._node_name = node_name

    def get_pod_by_name(self, namespace: str, name: str) -> Pod | None:
        return None

    def kube_client(self) -> Any | None:
        return None

    @property
    def node_name(self) -> str:
        return node_name(self._node_name)

    def node_info(self) -> NodeInfo:
        return NodeInfo(self.node_name)

    def list_nodes(self) -> list[NodeInfo]:
        return []


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
