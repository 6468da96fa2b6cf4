"""Helpers shared by every suite that touches the kernel (kernel, fault, cni, bench smoke).

Each suite owns one /16 under 10.200.0.0/13 (see docs/development.md); ``free_third_octet`` picks a /24 of it
that no other run on this host is using right now.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import os
import random
import secrets
import shutil
import subprocess
from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol

import pytest

__all__ = [
    "close_all",
    "free_third_octet",
    "host_veth_name",
    "kernel_gate",
    "kernel_unavailable_reason",
    "link_exists",
    "live_netns_file",
    "run",
    "tcp_rate",
]


class Closable(Protocol):
    def close(self) -> None: ...


@functools.cache
def _spare_netns() -> str:
    """A network namespace of this test process's own (made once, deleted at its exit) for
    :func:`live_netns_file` to point at."""
    import atexit

    name = f"np{secrets.token_hex(4)}live"
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True, timeout=60)
    atexit.register(subprocess.run, ["ip", "netns", "del", name], capture_output=True, timeout=60)
    return f"/run/netns/{name}"


def live_netns_file(path: os.PathLike[str] | str) -> str:
    """Make ``path`` a live pod network namespace as gc sees it (a symlink to a real nsfs file; a
    plain file counts as gone); unlinking it later makes the pod's namespace gone. Returns the path."""
    os.symlink(_spare_netns(), path)
    return os.fspath(path)


def close_all(made: Iterable[Closable]) -> None:
    """Close each of a factory fixture's networks, the rest too when one fails; then raise the first error."""
    errors: list[Exception] = []
    for net in made:
        try:
            net.close()
        except Exception as e:  # keep cleaning the others
            errors.append(e)
    if errors:
        raise errors[0]


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


@functools.cache
def kernel_unavailable_reason() -> str | None:
    """Why kernel tests cannot run here, or None. Probes by really creating a namespace once."""
    if os.geteuid() != 0:
        return "kernel tests need root (network namespaces, veths, bridges)"
    if shutil.which("ip") is None:
        return "iproute2 `ip` is not installed"
    probe = f"np-{secrets.token_hex(4)}-probe"
    r = run(["ip", "netns", "add", probe])
    if r.returncode != 0:
        return f"`ip netns add` does not work here: {r.stderr.strip()}"
    run(["ip", "netns", "del", probe])
    return None


def host_veth_name(infra_id: str) -> str:
    """Mirror of the bridge plugins' rule: "np" + the first 12 hex digits of FNV-1a-64(infra id)."""
    h = 0xCBF29CE484222325
    for b in infra_id.encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"np{h:016x}"[:14]


def link_exists(name: str) -> bool:
    return os.path.exists(f"/sys/class/net/{name}")


def free_third_octet(suite_range: str) -> int:
    """A random X such that A.B.X.0/24 of ``suite_range`` (a /16) is not routed on this host."""
    rng = ipaddress.ip_network(suite_range)
    used: set[int] = set()
    for word in run(["ip", "-o", "-4", "route", "show"]).stdout.split():
        try:
            net = ipaddress.ip_network(word, strict=False)
        except ValueError:
            continue
        if net.version == 4 and net.prefixlen > 16 and net.overlaps(rng):
            used.add(int(net.network_address) >> 8 & 0xFF)
    return random.SystemRandom().choice(sorted(set(range(256)) - used))


def kernel_gate(request: pytest.FixtureRequest, extra_reason: str | None = None) -> None:
    """Skip a test marked ``kernel`` when the kernel features (or ``extra_reason``'s need) are missing."""
    if request.node.get_closest_marker("kernel") is not None:
        reason = kernel_unavailable_reason() or extra_reason
        if reason:
            pytest.skip(reason)


def tcp_rate(src_netns: str | None, dst_netns: str | None, dst_ip: str, nbytes: int) -> float:
    """Bits per second of one TCP transfer of ``nbytes`` between two netns names (None: the host's
    own), as the receiver saw it: the same measurement ``netplugin demo --chain`` prints."""
    from netplugin.frontends.lab.demo_chain import tcp_rate as measured

    return measured(src_netns, dst_netns, dst_ip, nbytes)


def ip_in(ns: str, *args: str, timeout: float = 60) -> str:
    """``ip -n NS ARGS``: its stdout; the test fails with ip's stderr when it fails."""
    done = subprocess.run(["ip", "-n", ns, *args], capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


@contextlib.contextmanager
def underlay_netns(tag: str, addresses: Sequence[str], default_via: str | None = None) -> Iterator[str]:
    """A node's netns of the test's own: ``eth0`` (a veth, up) with ``addresses`` (IPv6 ones without
    DAD), optionally a default route; deleted afterwards, whatever the test did."""
    name = f"np{secrets.token_hex(4)}{tag}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        ip_in(name, "link", "set", "lo", "up")
        ip_in(name, "link", "add", "eth0", "type", "veth", "peer", "name", "eth1")
        ip_in(name, "link", "set", "eth0", "up")
        ip_in(name, "link", "set", "eth1", "up")
        for addr in addresses:
            ip_in(name, "addr", "add", addr, "dev", "eth0", *(["nodad"] if ":" in addr else []))
        if default_via:
            ip_in(name, "route", "add", "default", "via", default_via)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)
