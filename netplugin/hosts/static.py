"""StaticHost: pods described by manifest files, for nodes without an API server (and the demo)."""

from __future__ import annotations

import os
from typing import Any

from netplugin.core._yaml import short_repr
from netplugin.core.errors import HostError
from netplugin.hosts.base import Pod

__all__ = ["StaticHost", "load_manifest"]


#: The largest manifest read: etcd's default request limit (a Pod object never comes near it).
MAX_MANIFEST_BYTES = 1536 * 1024


def load_manifest(path: str) -> Pod:
    """Read one pod manifest (YAML or JSON). Raises HostError naming the file and the reason."""
    result = _load(path)[1]
    if isinstance(result, HostError):
        raise result
    return result


def _load(path: str) -> tuple[bytes | None, Pod | HostError]:
    """(the bytes read, None if unreadable; the pod or why there is none).

    Bounded whatever the file holds (see :mod:`netplugin.core._yaml`): at most
    MAX_MANIFEST_BYTES are read, never from a FIFO, and the parse is limited in depth and size.
    """
    from netplugin.core._yaml import DocumentError, load_json, load_yaml, read_document

    kind = "JSON" if path.endswith(".json") else "YAML"
    try:
        raw = read_document(path, MAX_MANIFEST_BYTES)
    except OSError as e:
        return None, HostError(f"cannot read pod manifest {path}: {e.strerror or e}")
    except DocumentError as e:
        return None, HostError(f"cannot read pod manifest {path}: it {e}")
    try:
        return raw, _check(path, load_json(raw) if kind == "JSON" else load_yaml(raw))
    except DocumentError as e:
        return raw, HostError(f"pod manifest {path} is not valid {kind}: {e}")
    except HostError as e:
        return raw, e


def _check(path: str, doc: Any) -> Pod:
    if not isinstance(doc, dict):
        raise HostError(f"pod manifest {path}: expected a Pod object, got {type(doc).__name__}")
    kind = doc.get("kind", "Pod")
    if kind != "Pod":
        raise HostError(f"pod manifest {path}: kind must be 'Pod', got {short_repr(kind)}")
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
    one is a HostError. A broken manifest (one that cannot be parsed, or is not a valid
    Pod) is a HostError only for the pods it might describe: those whose name occurs in
    its bytes. So one broken file never blocks the setup of other pods, and teardown and
    status never need the pod (the manager goes on without it). A manifest that cannot be
    read at all (permissions, not a regular file) might be anyone's: it is reported to
    every lookup that finds no pod.
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
