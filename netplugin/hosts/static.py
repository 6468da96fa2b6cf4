"""StaticHost: pods described by manifest files, for nodes without an API server (and the demo)."""

from __future__ import annotations

import json
import os
from typing import Any

from netplugin.core.errors import HostError
from netplugin.hosts.base import Pod

__all__ = ["StaticHost", "load_manifest"]


def load_manifest(path: str) -> Pod:
    """Read one pod manifest (YAML or JSON). Raises HostError naming the file and the reason."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise HostError(f"cannot read pod manifest {path}: {e.strerror or e}") from e
    try:
        if path.endswith(".json"):
            doc = json.loads(raw)
        else:
            from netplugin.core._yaml import load_yaml

            doc = load_yaml(raw)
    except ValueError as e:
        raise HostError(f"pod manifest {path} is not valid {'JSON' if path.endswith('.json') else 'YAML'}: {e}") from e
    if not isinstance(doc, dict):
        raise HostError(f"pod manifest {path}: expected a Pod object, got {type(doc).__name__}")
    kind = doc.get("kind", "Pod")
    if kind != "Pod":
        raise HostError(f"pod manifest {path}: kind must be 'Pod', got {kind!r}")
    meta = doc.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta["name"]:
        raise HostError(f"pod manifest {path}: metadata.name is missing or not a string")
    ns = meta.get("namespace", "default")
    if not isinstance(ns, str) or not ns:
        raise HostError(f"pod manifest {path}: metadata.namespace must be a non-empty string")
    meta.setdefault("namespace", "default")
    return doc


class StaticHost:
    """Pods from manifest files in a directory (``*.yaml``, ``*.yml``, ``*.json``).

    The directory is read at each lookup (it is small, and this keeps a long-running
    daemon current without a watch). A missing directory knows no pods; an unreadable
    one, or a broken manifest for the pod asked about, is a HostError. A broken
    manifest of some *other* pod does not stop lookups of good ones.
    """

    SUFFIXES = (".yaml", ".yml", ".json")

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def _files(self) -> list[str]:
        try:
            names = sorted(os.listdir(self.directory))
        except FileNotFoundError:
            return []
        except OSError as e:
            raise HostError(f"cannot read pod manifest dir {self.directory}: {e.strerror or e}") from e
        return [os.path.join(self.directory, n) for n in names if n.endswith(self.SUFFIXES)]

    def get_pod_by_name(self, namespace: str, name: str) -> Pod | None:
        errors: list[HostError] = []
        for path in self._files():
            try:
                pod = load_manifest(path)
            except HostError as e:
                errors.append(e)
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
