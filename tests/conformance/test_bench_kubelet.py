"""The bench's kubelet-cluster figure as a user runs it: ``python -m bench --quick --only kubelet``.

It brings up the conformance cluster with one node on netplugin's shipped DaemonSet and one on the CNI
v1.10 bridge conflist, runs a small Deployment on each through the kubelets, and reports both rows.
The figure itself refuses a wave whose pods landed on another node, got an address outside their
node's pod CIDR or a shared one, and a cluster where the DaemonSet reached the bridge node.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster.labnodes import cluster_unavailable_reason
from tests.support.gopeers import require

pytestmark = [pytest.mark.kernel, pytest.mark.image]

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(1500)
def test_the_kubelet_cluster_figure_times_a_deployment_on_each_network(tmp_path: Path) -> None:
    peers = require("kubelet", "kube-apiserver", "containerd", "crictl", "cni/bridge")
    reason = cluster_unavailable_reason()
    if reason:
        pytest.skip(reason)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_")}
    env.update(NETPLUGIN_PEERS=str(peers), PYTHONPATH=str(REPO))
    args = [sys.executable, "-m", "bench", "--quick", "--only", "kubelet", "--no-plots", "--out", str(tmp_path)]
    done = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=1400,
                          stdin=subprocess.DEVNULL)  # fmt: skip
    assert done.returncode == 0, done.stderr[-6000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert not results["meta"].get("problems"), results["meta"]["problems"]
    [fig] = [f for f in results["figures"] if f["id"] == "kubelet-cluster"]
    assert fig["params"]["replicas"] == 3
    # one round per row, each a makespan no shorter than its pods' slowest startup
    assert {k: len(v) for k, v in fig["samples"].items()} == {"N": 1, "A": 1}
    for row in fig["rows"]:
        values = row["values"]
        assert 0 < values["p50 startup"] <= values["p99 startup"] <= values["median"], row
    md = (tmp_path / "BENCHMARKS.md").read_text()
    assert "### Kubelet cluster: a 3-replica Deployment on one node" in md
