"""``netplugin demo --nodes N``: the cluster demo end to end (real namespaces, daemons, nft)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.support.nettest import kernel_unavailable_reason

pytestmark = pytest.mark.kernel


def _netns() -> set[str]:
    """The simulated cluster's namespaces (np<tag>u, np<tag>n<i>, np<tag>p<..>); others run tests too."""
    names = os.listdir("/var/run/netns") if os.path.isdir("/var/run/netns") else []
    return {n for n in names if re.fullmatch(r"np[0-9a-f]{6}[unp][0-9a-f]*", n)}


def test_two_node_demo_talks_masquerades_removes_and_leaves_nothing() -> None:
    reason = kernel_unavailable_reason() or (None if shutil.which("nft") else "nft is not installed")
    if reason:
        pytest.skip(reason)
    before = _netns()
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    done = subprocess.run(
        [sys.executable, "-m", "netplugin", "-o", "json", "demo", "--nodes", "2"],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["ok"] and report["leftovers"] == []
    assert [n["name"] for n in report["nodes"]] == ["node-1", "node-2"]
    assert all(len(p["ips"]) == 2 for p in report["pods"])  # dual stack
    # 2 pods x 1 peer x 2 families, 2 pods x 2 outside addresses, 1 route removal
    assert len(report["checks"]) == 9 and all(c["ok"] for c in report["checks"])
    assert report["removed_node"] == "node-2" and report["route_convergence_ms"] < 2000
    assert "masqueraded to their node's address" in done.stderr  # progress goes to stderr with -o json
    # Only this run's namespaces (its tag, from its progress): other tests and runs make their own meanwhile.
    tag = re.search(r"a network namespace np([0-9a-f]{6})n<i>", done.stderr)
    assert tag is not None, done.stderr[-3000:]
    assert {ns for ns in _netns() - before if ns.startswith(f"np{tag.group(1)}")} == set()


def test_nodes_out_of_range_is_a_usage_error() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "netplugin", "demo", "--nodes", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and "--nodes" in done.stderr
