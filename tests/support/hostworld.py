"""A private "node" for attacks on the node's own network: a netns and a PID namespace of the test's.

An attack that names "the host's network namespace" (``/proc/1/ns/net``, ``/proc/self/ns/net``,
a bind mount of it) must never reach the machine's real one, even when the code under test is
broken. So the code under test runs as ``ip netns exec WORLD unshare -p -f --mount-proc -- ...``:
its own network namespace is WORLD (``/proc/self/ns/net``), and PID 1 of its PID namespace lives
there too (``/proc/1/ns/net``). WORLD has an underlay link and a default route of its own, which
the tests check survives; the machine's own interfaces and routes are never touched.
Names: ``np<hex>h`` (the world), ``np<hex>d`` (its underlay link); subnets from 10.201.0.0/16.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.support.nettest import free_third_octet, kernel_unavailable_reason

__all__ = ["World", "world"]

REPO = Path(__file__).resolve().parents[2]
CNI_RANGE = "10.201.0.0/16"


def _ip(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *argv], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)


class World:
    """A network namespace playing the node, with an underlay link and a default route."""

    def __init__(self) -> None:
        self.tag = secrets.token_hex(3)
        self.name = f"np{self.tag}h"
        self.path = f"/run/netns/{self.name}"
        third = free_third_octet(CNI_RANGE)
        self.underlay = f"10.201.{third}"
        self.bridge_subnet = f"10.201.{(third + 1) % 256}.0/24"
        self.netns: list[str] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self.add_netns(self.name)
        link = f"np{self.tag}d"
        for argv in (
            ["link", "set", "lo", "up"],
            ["link", "add", link, "type", "veth", "peer", "name", f"np{self.tag}e"],  # no dummy module everywhere
            ["addr", "add", f"{self.underlay}.2/24", "dev", link],
            ["link", "set", link, "up"],
            ["route", "add", "default", "via", f"{self.underlay}.1"],
        ):
            r = _ip("-n", self.name, *argv)
            assert r.returncode == 0, r.stderr
        self.route = self.default_route()
        assert self.route.startswith(f"default via {self.underlay}.1 dev {link}"), self.route

    def add_netns(self, name: str) -> str:
        self.netns.append(name)
        r = _ip("netns", "add", name)
        assert r.returncode == 0, r.stderr
        return f"/run/netns/{name}"

    def default_route(self, netns: str | None = None) -> str:
        """The IPv4 default route of the world, or of ``netns`` (a name or a /run/netns path)."""
        return _ip("-n", os.path.basename(netns or self.name), "-4", "route", "show", "default").stdout.strip()

    def links(self, netns: str | None = None) -> list[str]:
        out = _ip("-n", os.path.basename(netns or self.name), "-o", "link", "show").stdout
        return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]

    def argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` inside the world: its netns, and a PID namespace whose PID 1 is there too."""
        # slave: mounts the test makes later (a pod's /run/netns bind mount) are seen inside too
        pidns = ["unshare", "-p", "-f", "--mount-proc", "--propagation", "slave", "--"]
        return ["ip", "netns", "exec", self.name, *pidns, *argv]

    def run(self, argv: Sequence[str], *, env: dict[str, str], stdin: bytes = b"",
            timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(self.argv(argv), input=stdin, env=env, capture_output=True, timeout=timeout)

    def python(self, module: str, *args: str, env: dict[str, str], stdin: bytes = b"",
               timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
        return self.run([sys.executable, "-m", module, *args], env=env, stdin=stdin, timeout=timeout)

    def start(self, argv: Sequence[str], *, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        with open(log, "ab") as f:
            p = subprocess.Popen(self.argv(argv), env=env, stdin=subprocess.DEVNULL, stdout=f, stderr=f,
                                 start_new_session=True)
        self.procs.append(p)
        return p

    def close(self) -> None:
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        for name in reversed(self.netns):
            _ip("netns", "del", name)


@pytest.fixture
def world() -> Iterator[World]:
    reason = kernel_unavailable_reason()
    if reason:
        pytest.skip(reason)
    w = World()
    try:
        yield w
    finally:
        w.close()
