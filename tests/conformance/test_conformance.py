"""Kubernetes' own verdict: ``scripts/conformance.sh`` runs ``e2e.test`` on a 2-node cluster where the
kubelet runs netplugin's shipped DaemonSet (tests/conformance/cluster.py).

The focus is checked against ``e2e.test --ginkgo.dry-run`` first (it selects exactly the specs meant),
then the script runs as a user runs it, with the small focus (the four Pods granular checks and
HostPort) and ``--disruption``: its JUnit report (``e2e.test``'s own) says each passed, and its
disruption report that the DaemonSet's rolling update lost no request and that neither it nor a node
reboot leaked anything.
"""

from __future__ import annotations

import json
import subprocess
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cluster.labnodes import cluster_unavailable_reason
from tests.conformance.run import DEFAULT_FOCUS, DEFAULT_SKIP, SMALL_FOCUS, joined, read_junit, selected_specs
from tests.support.gopeers import require

pytestmark = [pytest.mark.kernel, pytest.mark.image]

REPO = Path(__file__).resolve().parents[2]
#: what the small focus means: these five specs and no other
SMALL_SET = sorted(
    [
        "[sig-network] Networking Granular Checks: Pods should function for intra-pod communication: http "
        "[NodeConformance] [Conformance]",
        "[sig-network] Networking Granular Checks: Pods should function for intra-pod communication: udp "
        "[NodeConformance] [Conformance]",
        "[sig-network] Networking Granular Checks: Pods should function for node-pod communication: http "
        "[LinuxOnly] [NodeConformance] [Conformance]",
        "[sig-network] Networking Granular Checks: Pods should function for node-pod communication: udp "
        "[LinuxOnly] [NodeConformance] [Conformance]",
        "[sig-network] HostPort validates that there is no conflict between pods with same hostPort but different "
        "hostIP and protocol [LinuxOnly] [Conformance]",
    ]
)
#: the default set, spec by spec (docs/conformance.md explains each group)
DEFAULT_SET = Path(__file__).with_name("default-set.txt")


def _normal(name: str) -> str:
    """A name with its bracketed tags sorted: their order is not part of what a spec is."""
    tags = sorted(t for t in name.split() if t.startswith("[") and t.endswith("]") and not t.startswith("[sig-"))
    words = [w for w in name.split() if w not in tags]
    return " ".join([*words, *tags])


@pytest.fixture(scope="module")
def e2e_test() -> Path:
    return require("e2e.test") / "e2e.test"


def test_the_small_focus_selects_the_four_pods_checks_and_hostport(e2e_test: Path, tmp_path: Path) -> None:
    specs = selected_specs(e2e_test, joined(SMALL_FOCUS), joined(DEFAULT_SKIP), tmp_path)
    assert sorted(map(_normal, specs)) == sorted(map(_normal, SMALL_SET))


def test_the_default_focus_selects_exactly_the_default_set(e2e_test: Path, tmp_path: Path) -> None:
    specs = selected_specs(e2e_test, joined(DEFAULT_FOCUS), joined(DEFAULT_SKIP), tmp_path)
    meant = [line for line in DEFAULT_SET.read_text().splitlines() if line and not line.startswith("#")]
    assert sorted(map(_normal, specs)) == sorted(map(_normal, meant))
    # every sig-network conformance spec is in it
    assert sum(1 for s in specs if s.startswith("[sig-network]") and "[Conformance]" in s) == 47


@dataclass
class SmallRun:
    """``scripts/conformance.sh --small`` as a user runs it: its exit, output and report."""

    returncode: int
    stdout: str
    stderr: str
    report: Path


@pytest.fixture(scope="module")
def small_run(e2e_test: Path, tmp_path_factory: pytest.TempPathFactory) -> SmallRun:
    reason = cluster_unavailable_reason()
    if reason:
        pytest.skip(reason)
    report = tmp_path_factory.mktemp("conformance") / "report"
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "conformance.sh"), "--small", "--disruption", "--report-dir", str(report)],
        capture_output=True, text=True, timeout=3300, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    print(done.stderr[-20000:])
    return SmallRun(done.returncode, done.stdout, done.stderr, report)


def _passed(run: SmallRun) -> set[str]:
    assert (run.report / "junit_01.xml").exists(), run.stderr[-8000:]
    assert ET.parse(run.report / "junit_01.xml").getroot().tag in ("testsuites", "testsuite")
    return {_normal(n) for n, _ in read_junit(run.report / "junit_01.xml").passed}


@pytest.mark.timeout(3600)
def test_the_four_pods_granular_checks_pass_on_a_cluster_running_the_shipped_daemonset(small_run: SmallRun) -> None:
    # the report is e2e.test's own: each of the four Pods checks ran and passed
    pods_checks = {_normal(n) for n in SMALL_SET if "Granular Checks: Pods" in n}
    assert pods_checks <= _passed(small_run), small_run.stderr[-8000:]
    assert (small_run.report / "e2e.log").stat().st_size > 0
    # The kubelets ran the DaemonSet's pod: its init container installed the node, then the daemon served it.
    for node in ("node-1", "node-2"):
        kubelet = (small_run.report / "logs" / f"{node}-kubelet.log").read_text(errors="replace")
        assert "kube-system/netplugin-" in kubelet
        pods = small_run.report / "logs" / f"{node}-pods"
        logs = {p.parent.name for p in pods.rglob("*.log") if "kube-system_netplugin-" in str(p)}
        assert logs >= {"install", "netplugin"}, logs


@pytest.mark.timeout(3600)
def test_a_rolling_update_and_a_node_reboot_under_traffic_lose_no_request_and_leak_nothing(small_run: SmallRun) -> None:
    path = small_run.report / "disruption.json"
    assert path.exists(), small_run.stderr[-8000:]
    report = json.loads(path.read_text())
    rollout = report["rollout"]
    # The dataplane never depends on the daemon being up: replacing it loses no request.
    assert rollout["sent"] > 0 and rollout["failed"] == 0, rollout["failures"]
    assert report["new_pods_started"], small_run.stderr[-8000:]
    assert report["leaks_after_rollout"] == {}
    # After the reboot the kubelet's new sandboxes talk again, and the old ones' records and leases are
    # gone without anyone running netplugin gc.
    assert report["reboot_talks_again"], small_run.stderr[-8000:]
    assert report["reboot_leaks"] == {}


@pytest.mark.timeout(3600)
def test_the_hostport_conformance_spec_passes(small_run: SmallRun) -> None:
    hostport = {_normal(n) for n in SMALL_SET if "HostPort" in n}
    assert hostport <= _passed(small_run)
    assert small_run.returncode == 0 and small_run.stdout.strip().splitlines()[-1] == "5 passed, 0 failed, 0 skipped"
