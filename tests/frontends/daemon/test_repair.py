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
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from netplugin.frontends.wire.client import NotSent, exchange
from tests.nettest import ip_in as ip
from tests.nettest import kernel_gate, underlay_netns

pytestmark = pytest.mark.kernel

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def netns(request: pytest.FixtureRequest) -> Iterator[str]:
    kernel_gate(request)
    with underlay_netns("r", ["10.206.0.71/24"]) as name:
        yield name


def _nft_tables(ns: str) -> str:
    return subprocess.run(["ip", "netns", "exec", ns, "nft", "list", "tables"], capture_output=True, text=True).stdout


def _routes(ns: str) -> list[str]:
    return [r["dst"] for r in json.loads(ip(ns, "-j", "route", "show", "proto", "78") or "[]")]


def _until(pred: Callable[[], bool], within: float = 10.0) -> float:
    start = time.monotonic()
    while not pred():
        assert time.monotonic() - start < within, "not repaired"
        time.sleep(0.005)
    return time.monotonic() - start


def test_a_flushed_ruleset_and_flushed_routes_come_back(netns: str, tmp_path: Path) -> None:
    nodes = tmp_path / "nodes"
    nodes.mkdir()
    for name, cidr, addr in (("me", "10.206.143.0/24", "10.206.0.71"), ("peer", "10.206.144.0/24", "10.206.0.72")):
        doc = {"kind": "Node", "metadata": {"name": name}, "spec": {"podCIDRs": [cidr]},
               "status": {"addresses": [{"type": "InternalIP", "address": addr}]}}  # fmt: skip
        (nodes / f"{name}.json").write_text(json.dumps(doc))
    cfg = tmp_path / "netplugin.yaml"
    cfg.write_text(
        f"state_dir: {tmp_path}/state\nrun_dir: {tmp_path}/run\nplugin_dir: {tmp_path}\nhost: static\n"
        f"pods_dir: {tmp_path}/pods\nnodes_dir: {nodes}\nnode_name: me\nmetrics_address: none\n"
        "cluster_cidrs: [10.206.128.0/17]\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_")}
    env.update(PYTHONPATH=str(REPO))
    log = tmp_path / "daemon.log"
    sock = str(tmp_path / "run" / "netplugin.sock")
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", netns, sys.executable, "-m", "netplugin", "serve", "--config", str(cfg)],
            env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        _until(lambda: os.path.exists(sock), within=60)
        assert "table inet netplugin" in _nft_tables(netns) and _routes(netns) == ["10.206.144.0/24"]

        subprocess.run(["ip", "netns", "exec", netns, "nft", "flush", "ruleset"], check=True)
        egress = _until(lambda: "table inet netplugin" in _nft_tables(netns))
        ip(netns, "route", "flush", "proto", "78")
        routes = _until(lambda: _routes(netns) == ["10.206.144.0/24"])
        print(f"\ntime to repair: egress table {egress * 1000:.0f} ms, routes {routes * 1000:.0f} ms")

        def health() -> dict[str, object]:
            try:
                answer: dict[str, object] = exchange(sock, {"v": 1, "op": "health"}, timeout=10)["result"]
            except NotSent:
                return {}
            return answer

        _until(lambda: health()["node"]["repairs"] == {"egress": 1, "route": 1})  # type: ignore[index]
        text = log.read_text()
        assert "repair (egress)" in text and "repair (route)" in text and "routes re-added: 10.206.144.0/24" in text
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()
