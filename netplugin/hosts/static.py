"""StaticHost: pods and nodes described by manifest files, for clusters without an API server (and the demo).

Pods are Pod manifests in ``pods_dir``; nodes are Node manifests in ``nodes_dir`` (the same
shape as the API's: ``metadata.name``, ``spec.podCIDRs``, ``status.addresses`` with
``InternalIP`` entries), one per file, for example::

    kind: Node
    metadata: {name: node-2}
    spec: {podCIDRs: [10.244.2.0/24, "fd00:10:244:2::/64"]}
    status: {addresses: [{type: InternalIP, address: 192.168.1.12}]}
"""

from __future__ import annotations

# Imports inside this module's functions are kept for the per-call import set
# (tests/frontends/fastpath.py): each keeps a module off the calls that do not need it
# (BENCHMARKS.md rows B-i and B: the CLI's cold start and per-pod run without a daemon).
import os
from typing import Any

from netplugin.core._yaml import short_repr
from netplugin.core.errors import HostError
from netplugin.core.node import NodeInfo, node_name
from netplugin.hosts.base import Pod

__all__ = ["StaticHost", "load_manifest"]

#: The largest manifest read: etcd's default request limit (a Pod or Node object never comes near it).
MAX_MANIFEST_BYTES = 1536 * 1024


def load_manifest(path: str, kind: str = "Pod") -> Pod:
    """Read one manifest of ``kind`` (YAML or JSON). Raises HostError naming the file and the reason."""
    result = _load(path, kind)[1]
    if isinstance(result, HostError):
        raise result
    return result


def _load(path: str, kind: str = "Pod") -> tuple[bytes | None, Pod | HostError]:
    """(the bytes read, None if unreadable; the object or why there is none).

    Bounded whatever the file holds (see :mod:`netplugin.core._yaml`): at most
    MAX_MANIFEST_BYTES are read, never from a FIFO, and the parse is limited in depth and size.
    """
    from netplugin.core._yaml import DocumentError, load_json, load_yaml, read_document

    what = kind.lower()
    syntax = "JSON" if path.endswith(".json") else "YAML"
    try:
        raw = read_document(path, MAX_MANIFEST_BYTES)
    except OSError as e:
        return None, HostError(f"cannot read {what} manifest {path}: {e.strerror or e}")
    except DocumentError as e:
        return None, HostError(f"cannot read {what} manifest {path}: it {e}")
    try:
        return raw, _check(path, load_json(raw) if syntax == "JSON" else load_yaml(raw), kind)
    except DocumentError as e:
        return raw, HostError(f"{what} manifest {path} is not valid {syntax}: {e}")
    except HostError as e:
        return raw, e


def _check(path: str, doc: Any, kind: str) -> Pod:
    what = kind.lower()
    if not isinstance(doc, dict):
        raise HostError(f"{what} manifest {path}: expected a {kind} object, got {type(doc).__name__}")
    found = doc.get("kind", kind)
    if found != kind:
        raise HostError(f"{what} manifest {path}: kind must be {kind!r}, got {short_repr(found)}")
    meta = doc.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta["name"]:
        raise HostError(f"{what} manifest {path}: metadata.name is missing or not a string")
    if kind == "Pod":
        ns = meta.get("namespace", "default")
        if not isinstance(ns, str) or not ns:
            raise HostError(f"pod manifest {path}: metadata.namespace must be a non-empty string")
        meta.setdefault("namespace", "default")
    return doc


class StaticHost:
    """Pods from manifest files in a directory (``*.yaml``, ``*.yml``, ``*.json``).

    The directory is read at each lookup (it is small, and this keeps a long-running
    daemon current without a watch). A missing directory knows no pods; an unreadable
    one is a HostError. A broken manifest (one that cannot be parsed, or is not a valid
    Pod) is a HostError only for the pods it might describe: those whose name occurs in
    its bytes. So one broken file never blocks the setup of other pods, and teardown and
    status never need the pod (the manager goes on without it). A manifest that cannot be
    read at all (permissions, not a regular file) might be anyone's: it is reported to
    every lookup that finds no pod.
    """

    SUFFIXES = (".yaml", ".yml", ".json")

    def __init__(self, directory: str, *, nodes_dir: str | None = None, node_name: str | None = None) -> None:
        self.directory = directory
        self.nodes_dir = nodes_dir
        self._node_name = node_name

    def _files(self, directory: str | None = None, what: str = "pod") -> list[str]:
        directory = self.directory if directory is None else directory
        try:
            names = sorted(os.listdir(directory))
        except FileNotFoundError:
            return []
        except OSError as e:
            raise HostError(f"cannot read {what} manifest dir {directory}: {e.strerror or e}") from e
        return [os.path.join(directory, n) for n in names if n.endswith(self.SUFFIXES)]

    def get_pod_by_name(self, namespace: str, name: str) -> Pod | None:
        errors: list[HostError] = []
        for path in self._files():
            raw, pod = _load(path)
            if isinstance(pod, HostError):
                if raw is None or name.encode() in raw:
                    errors.append(pod)
                continue
            meta = pod["metadata"]
            if meta["name"] == name and meta["namespace"] == namespace:
                return pod
        if errors:
            # The pod may be in a file we could not parse: say so rather than guess "absent".
            raise HostError(
                f"pod {namespace}/{name} not found and {len(errors)} manifest(s) could not be read: "
                + "; ".join(e.message for e in errors)
            )
        return None

    def list_pods(self) -> list[Pod]:
        return [load_manifest(p) for p in self._files()]

    def kube_client(self) -> Any | None:
        return None

    # --- nodes ---

    @property
    def node_name(self) -> str:
        return node_name(self._node_name)

    def list_nodes(self) -> list[NodeInfo]:
        """Every Node manifest in ``nodes_dir`` (none when it is unset or missing).

        Unlike pods, one broken node file fails the whole list: the daemon routes from it, and a
        node silently missing would lose its routes.
        """
        if not self.nodes_dir:
            return []
        nodes: dict[str, NodeInfo] = {}
        for path in self._files(self.nodes_dir, "node"):
            info = NodeInfo.from_node(load_manifest(path, "Node"), where=f"node manifest {path}:")
            if info.name in nodes:
                raise HostError(f"node manifest {path}: node {info.name!r} is described twice in {self.nodes_dir}")
            nodes[info.name] = info
        return [nodes[k] for k in sorted(nodes)]

    def node_info(self) -> NodeInfo:
        me = self.node_name
        for info in self.list_nodes():
            if info.name == me:
                return info
        return NodeInfo(me)
