"""Self-repair, event-driven: what the daemon keeps on the node comes back when the kernel loses it.

The daemon runs in a network namespace of the test's own, with a static cluster (itself and a
peer) and ``cluster_cidrs``, so it keeps a ``proto 78`` route to the peer and the egress table.
The chaos is what an admin or a firewall reload does, inside that namespace only: ``nft flush
ruleset`` and ``ip route flush proto 78``. Each is put back (the test waits with a generous
bound, not a timing claim; the time taken is printed and the bench reports it), logged, and
counted in the daemon's health.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator

import pytest

from netplugin.frontends.wire.client import NotSent, exchange
from tests.support.nettest import ip_in as ip
from tests.support.nettest import kernel_gate, underlay_netns
from tests.support.waits import WITHIN, wait_for

from .conftest import StaticNode, node_file

pytestmark = pytest.mark.kernel


@pytest.fixture
def netns(request: pytest.FixtureRequest) -> Iterator[str]:
    kernel_gate(request)
    with underlay_netns("r", ["10.206.0.71/24"]) as name:
        yield name


def _nft_tables(ns: str) -> str:
    return subprocess.run(["ip", "netns", "exec", ns, "nft", "list", "tables"], capture_output=True, text=True).stdout


def _routes(ns: str) -> list[str]:
    return [r["dst"] for r in json.loads(ip(ns, "-j", "route", "show", "proto", "78") or "[]")]


def _took(check: Callable[[], bool], what: str) -> float:
    """How long until ``check`` holds (printed: a figure to look at, never asserted)."""
    start = time.monotonic()
    wait_for(check, what, WITHIN, interval=0.005)
    return time.monotonic() - start


def test_a_flushed_ruleset_and_flushed_routes_come_back(netns: str, static_node: Callable[..., StaticNode]) -> None:
    node = static_node(netns)
    node_file(node.nodes, "me", "10.206.143.0/24", "10.206.0.71")
    node_file(node.nodes, "peer", "10.206.144.0/24", "10.206.0.72")
    node.start()
    sock = node.socket
    wait_for(lambda: os.path.exists(sock), "the socket", WITHIN, detail=node.output)
    assert "table inet netplugin" in _nft_tables(netns) and _routes(netns) == ["10.206.144.0/24"]

    subprocess.run(["ip", "netns", "exec", netns, "nft", "flush", "ruleset"], check=True)
    egress = _took(lambda: "table inet netplugin" in _nft_tables(netns), "the egress table back")
    ip(netns, "route", "flush", "proto", "78")
    routes = _took(lambda: _routes(netns) == ["10.206.144.0/24"], "the route back")
    print(f"\ntime to repair: egress table {egress * 1000:.0f} ms, routes {routes * 1000:.0f} ms")

    def health() -> dict[str, object]:
        try:
            answer: dict[str, object] = exchange(sock, {"v": 1, "op": "health"}, timeout=10)["result"]
        except NotSent:
            return {}
        return answer

    repairs = {"egress": 1, "route": 1}
    wait_for(lambda: health()["node"]["repairs"] == repairs, "both repairs counted", WITHIN)  # type: ignore[index]
    text = node.output()
    assert "repair (egress)" in text and "repair (route)" in text and "routes re-added: 10.206.144.0/24" in text
    assert node.stop() == 0, node.output()
