"""The API's objects as the simulated API server holds them: factories, field selectors, Status.

Split from :mod:`netplugin.frontends.lab.simcluster.apiserver` (which serves them over HTTP): the
shapes here are those of the real API (``spec.podCIDRs``, ``status.addresses``, a ``Status``
body with ``reason`` and ``code``, field selectors with ``=``, ``==``, ``!=``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["KINDS", "BadRequest", "Event", "Selector", "kubelet_node", "make_node", "make_pod", "resource_of", "status"]

Obj = dict[str, Any]

KINDS = {"nodes": "Node", "pods": "Pod"}
_FIELDS: dict[str, dict[str, Callable[[Obj], str]]] = {
    "pods": {
        "metadata.name": lambda o: o["metadata"]["name"],
        "metadata.namespace": lambda o: o["metadata"].get("namespace", ""),
        "spec.nodeName": lambda o: (o.get("spec") or {}).get("nodeName", ""),
        "status.phase": lambda o: (o.get("status") or {}).get("phase", ""),
    },
    "nodes": {"metadata.name": lambda o: o["metadata"]["name"]},
}


def resource_of(kind: object) -> str:
    for resource, k in KINDS.items():
        if k == kind:
            return resource
    raise ValueError(f"kind must be Node or Pod, got {kind!r}")


def make_node(name: str, pod_cidrs: list[str], internal_ips: list[str]) -> Obj:
    """A Node as the API holds it (``spec.podCIDR`` is the first of ``spec.podCIDRs``)."""
    spec: Obj = {"podCIDR": pod_cidrs[0], "podCIDRs": list(pod_cidrs)} if pod_cidrs else {}
    addresses = [{"type": "InternalIP", "address": a} for a in internal_ips]
    addresses.append({"type": "Hostname", "address": name})
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": spec,
        "status": {"addresses": addresses},
    }


def make_pod(namespace: str, name: str, node: str, labels: dict[str, str] | None = None) -> Obj:
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
        "spec": {"nodeName": node, "containers": [{"name": "app", "image": "busybox"}]},
        "status": {"phase": "Pending"},
    }


@dataclass
class Event:
    rv: int
    resource: str
    type: str  # ADDED, MODIFIED, DELETED
    obj: Obj
    old: Obj | None = None


class BadRequest(Exception):
    pass


@dataclass
class Selector:
    terms: list[tuple[str, str, bool]] = field(default_factory=list)  # (field, value, equal)

    @classmethod
    def parse(cls, resource: str, text: str) -> Selector:
        sel = cls()
        for term in filter(None, (t.strip() for t in text.split(","))):
            if "!=" in term:
                key, value, eq = *term.split("!=", 1), False
            elif "==" in term:
                key, value, eq = *term.split("==", 1), True
            elif "=" in term:
                key, value, eq = *term.split("=", 1), True
            else:
                raise BadRequest(f"invalid selector: '{text}'; can't understand '{term}'")
            key = key.strip()
            if key not in _FIELDS[resource]:
                raise BadRequest(f"field label not supported: {key}")
            sel.terms.append((key, value.strip(), eq))
        return sel

    def matches(self, resource: str, obj: Obj) -> bool:
        return all((_FIELDS[resource][k](obj) == v) == eq for k, v, eq in self.terms)


def status(code: int, reason: str, message: str, details: Obj | None = None) -> Obj:
    doc: Obj = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        doc["details"] = details
    return doc


def kubelet_node(name: str, pod_cidrs: list[str], internal_ips: list[str], *, images: int = 38) -> Obj:
    """A Node as a kubelet registers it (38 images, as big as a real one).

    Labels, annotations, the five conditions, capacity, node info and the image list are what
    makes a real LIST page large: big clusters were refused for a node count meant for one
    config document, which :func:`make_node`'s small objects never showed.
    """
    node = make_node(name, pod_cidrs, internal_ips)
    node["metadata"]["labels"].update(
        {
            "beta.kubernetes.io/arch": "amd64",
            "beta.kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "kubernetes.io/os": "linux",
            "node.kubernetes.io/instance-type": "m5.large",
            "topology.kubernetes.io/region": "eu-west-1",
            "topology.kubernetes.io/zone": "eu-west-1a",
        }
    )
    node["metadata"]["annotations"] = {
        "node.alpha.kubernetes.io/ttl": "0",
        "volumes.kubernetes.io/controller-managed-attach-detach": "true",
        "kubeadm.alpha.kubernetes.io/cri-socket": "unix:///run/containerd/containerd.sock",
    }
    node["status"].update(_kubelet_status(name, images))
    return node


def _kubelet_status(name: str, images: int) -> Obj:
    """What a kubelet reports in a Node's status beyond its addresses: resources, conditions, info, images."""
    resources = {
        "cpu": "2",
        "ephemeral-storage": "81106868Ki",
        "hugepages-2Mi": "0",
        "memory": "7990056Ki",
        "pods": "110",
    }
    stamp = "2026-01-01T00:00:00Z"
    conditions = [
        {
            "type": kind,
            "status": "True" if kind == "Ready" else "False",
            "lastHeartbeatTime": stamp,
            "lastTransitionTime": stamp,
            "reason": f"Kubelet{kind}",
            "message": f"kubelet reports {kind}",
        }
        for kind in ("MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable", "Ready")
    ]
    return {
        "capacity": dict(resources),
        "allocatable": dict(resources),
        "conditions": conditions,
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "nodeInfo": {
            "architecture": "amd64",
            "bootID": f"boot-{name}",
            "containerRuntimeVersion": "containerd://1.7.13",
            "kernelVersion": "6.1.0-18-amd64",
            "kubeProxyVersion": "v1.29.2",
            "kubeletVersion": "v1.29.2",
            "machineID": f"machine-{name}",
            "operatingSystem": "linux",
            "osImage": "Debian GNU/Linux 12 (bookworm)",
            "systemUUID": f"uuid-{name}",
        },
        "images": [
            {
                "names": [f"registry.example/img{i}@sha256:{i:064x}", f"registry.example/img{i}:v1"],
                "sizeBytes": 1 << 24,
            }
            for i in range(images)
        ],
    }
