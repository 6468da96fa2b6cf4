"""Where pods come from: the ``Host`` seam.

As in the kubelet's exec plugin, a plugin manager asks its host for the pod
object of a (namespace, name) pair and, for plugins that want it, a kube
client. netplugin hands the pod to exec plugins as JSON on stdin.

Hosts here:

* :class:`StaticHost` — pod manifests (YAML or JSON, one pod per file) in a
  directory; the embedded default that needs no cluster (used by the demo).
* ``netplugin.hosts.kube.KubeHost`` — a real API server (lives in its own module so
  that its imports stay off the CLI's cold path).

Every host also knows the node netplugin runs on (:meth:`Host.node_info`, handed to
plugins) and the nodes of its cluster (:meth:`Host.list_nodes`, which the daemon routes to).
A host that also watches the cluster for the daemon is a :class:`ClusterHost`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from netplugin.core.node import NodeInfo, node_name

if TYPE_CHECKING:
    from netplugin.hosts.watch import ClusterCache

__all__ = ["ClusterHost", "Host", "NullHost", "Pod"]

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


@runtime_checkable
class ClusterHost(Host, Protocol):
    """A host that watches the cluster for the daemon (``host: kube``): what its node keeper reads beyond
    :class:`Host`. A host without these answers at once and is polled instead."""

    #: the list+watch caches while watching; None before :meth:`start_watching` and after :meth:`stop_watching`
    cache: ClusterCache | None
    #: requests made to the API server, by (verb, resource)
    requests: Mapping[tuple[str, str], int]

    def start_watching(
        self,
        on_nodes_change: Callable[[], None] | None = None,
        *,
        on_pod_deleted: Callable[[str, str], None] | None = None,
    ) -> ClusterCache:
        """Start the list+watch caches (every Node, this node's Pods); ``on_nodes_change`` on each Node
        event, ``on_pod_deleted(namespace, name)`` when a Pod of this node is deleted."""
        ...

    def stop_watching(self) -> None: ...

    def node_problems(self) -> list[tuple[str, str]]:
        """(node name, reason) of each Node that cannot be read."""
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
