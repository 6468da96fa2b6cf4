"""A pod network namespace with a veth into it, made per test and removed afterwards.

What a real first chain member (a bridge) reports as ``hostInterface``: the host end of a veth
whose peer is in the pod's netns. Run-unique names; only namespaces and links the test made.
"""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

__all__ = ["PodVeth", "pod_veth"]


@dataclass(frozen=True)
class PodVeth:
    netns: str  #: the pod's netns path (/run/netns/NAME)
    host: str  #: the host end, in the test's namespace
    name: str  #: the netns name


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@contextmanager
def pod_veth() -> Iterator[PodVeth]:
    tag = secrets.token_hex(4)
    name, host = f"npv{tag}", f"npv{tag}h"
    _ip("netns", "add", name)
    try:
        _ip("link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", name)
        yield PodVeth(f"/run/netns/{name}", host, name)
    finally:
        subprocess.run(["ip", "link", "del", host], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
