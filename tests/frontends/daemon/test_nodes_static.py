"""A cluster without an API server: Node manifests in ``nodes_dir`` drive the daemon's routes.

The daemon runs inside a network namespace of the test's own (routes belong to a namespace),
with ``host: static``; node files are written, changed and removed while it runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.nettest import ip_in as ip
from tests.support.nettest import kernel_gate, underlay_netns
from tests.support.waits import WITHIN, wait_for

from .conftest import REPO, StaticNode, node_file

pytestmark = pytest.mark.kernel



def routes(ns: str) -> dict[str, str]:
    return {r["dst"]: r.get("gateway", "") for r in json.loads(ip(ns, "-j", "route", "show", "proto", "78") or "[]")}


@pytest.fixture
def netns(request: pytest.FixtureRequest) -> Iterator[str]:
    kernel_gate(request)
    with underlay_netns('s', ['10.206.0.11/24']) as name:
        yield name


def test_static_node_files_drive_the_routes(netns: str, static_node: Callable[..., StaticNode]) -> None:
    node = static_node(netns)
    node_file(node.nodes, "me", "10.206.129.0/24", "10.206.0.11")
    node_file(node.nodes, "peer", "10.206.130.0/24", "10.206.0.12")
    node.start()
    # the first pass is done before the socket opens, with no error on the way
    wait_for(lambda: os.path.exists(node.socket), "the socket", WITHIN, detail=node.output)
    assert routes(netns) == {"10.206.130.0/24": "10.206.0.12"}, node.output()
    assert "cannot reconcile" not in node.output() and "ERROR" not in node.output(), node.output()
    node_file(node.nodes, "peer", "10.206.130.0/24", "10.206.0.22")  # the peer moved
    node_file(node.nodes, "far", "10.206.131.0/24", "10.206.7.7")  # not on our segment
    moved = {"10.206.130.0/24": "10.206.0.22"}
    wait_for(lambda: routes(netns) == moved, "the moved route", WITHIN, detail=node.output)
    far = "no route to node far pod CIDR 10.206.131.0/24"
    wait_for(lambda: far in node.output(), "the far node's problem", WITHIN)
    (node.nodes / "peer.json").unlink()
    wait_for(lambda: routes(netns) == {}, "the removed route", WITHIN, detail=node.output)
    assert node.stop() == 0, node.output()
    assert "routes removed: 10.206.130.0/24" in node.output()


def test_nodes_command_without_a_daemon_shows_what_the_host_knows(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes"
    nodes.mkdir()
    node_file(nodes, "me", "10.206.129.0/24", "10.206.0.11")
    node_file(nodes, "peer", "10.206.130.0/24", "10.206.0.12")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_")}
    env.update(PYTHONPATH=str(REPO), NETPLUGIN_USE_DAEMON="never", NETPLUGIN_NODES_DIR=str(nodes), NODE_NAME="me")
    base = [sys.executable, "-m", "netplugin", "--state-dir", str(tmp_path / "s"), "--run-dir", str(tmp_path / "r")]
    done = subprocess.run([*base, "-o", "json", "nodes"], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert info["name"] == "me" and info["pod_cidrs"] == ["10.206.129.0/24"] and info["nodes"] == 2
    assert [n["name"] for n in info["cluster"]] == ["me", "peer"]
    text = subprocess.run([*base, "nodes"], capture_output=True, text=True, env=env, timeout=60).stdout
    assert "node me: pod CIDRs 10.206.129.0/24; InternalIPs 10.206.0.11" in text
    assert "no daemon runs" in text and "peer" in text


def test_hostile_node_files_are_refused_and_shown_everywhere(
    netns: str, static_node: Callable[..., StaticNode]
) -> None:
    """Issue 21 class 2 through a real daemon: each refusal in the log, health, `netplugin nodes`, metrics."""
    node = static_node(netns, metrics_address="127.0.0.1:0")
    nodes = node.nodes
    node_file(nodes, "me", "10.206.129.0/24", "10.206.0.11")
    node_file(nodes, "peer", "10.206.130.0/24", "10.206.0.12")
    claims = {"half": "128.0.0.0/1", "lan": "10.206.0.128/25", "addr": "10.206.0.11/32", "wider": "10.206.130.0/23"}
    for name, cidr in claims.items():
        node_file(nodes, name, cidr, "10.206.0.66")
    for name, when in (("peer", "2026-01-01T00:00:00Z"), ("wider", "2026-01-02T00:00:00Z")):
        doc = json.loads((nodes / f"{name}.json").read_text())
        doc["metadata"]["creationTimestamp"] = when
        (nodes / f"{name}.json").write_text(json.dumps(doc))
    node.start()
    cli, env = node.cli, node.env
    wait_for(lambda: routes(netns) == {"10.206.130.0/24": "10.206.0.12"}, "the route", WITHIN, detail=node.output)
    wait_for(lambda: "no route to node wider" in node.output(), "the wider node's problem", WITHIN)
    shown = subprocess.run([*cli, "-o", "json", "nodes"], capture_output=True, text=True, env=env, timeout=60)
    assert shown.returncode == 0, shown.stderr
    problems = {p["node"]: p for p in json.loads(shown.stdout)["problems"]}
    assert {n: p["kind"] for n, p in problems.items()} == {
        "half": "outside_cluster_cidrs",
        "lan": "outside_cluster_cidrs",
        "addr": "outside_cluster_cidrs",
        "wider": "node_overlap",
    }
    text = subprocess.run([*cli, "nodes"], capture_output=True, text=True, env=env, timeout=60).stdout
    assert "problems (4):" in text and "node half pod CIDR 128.0.0.0/1: not inside cluster_cidrs" in text
    health = json.loads(
        subprocess.run([*cli, "-o", "json", "health"], capture_output=True, text=True, env=env, timeout=60).stdout
    )
    url = f"http://{health['metrics_address']}/metrics"
    scrape = f"import urllib.request; print(urllib.request.urlopen({url!r}).read().decode())"
    metrics = subprocess.run(
        ["ip", "netns", "exec", netns, sys.executable, "-c", scrape], capture_output=True, text=True
    )
    assert 'netplugin_node_problems{kind="outside_cluster_cidrs"} 3.0' in metrics.stdout, metrics.stderr
    assert 'netplugin_node_problems{kind="node_overlap"} 1.0' in metrics.stdout
    said = node.output()
    for name, cidr in claims.items():
        assert said.count(f"no route to node {name} pod CIDR {cidr}") == 1, said  # once, not every pass
    assert node.stop() == 0, node.output()
    assert "128.0.0.0/1" not in ip(netns, "route", "show")
