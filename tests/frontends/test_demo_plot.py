"""``netplugin demo --nodes N --plot FILE`` and ``demo --chain --plot FILE``: a PNG of the run, or,
without matplotlib or with a FILE that cannot be written, a clear error before the demo starts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.nettest import kernel_unavailable_reason

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def without_matplotlib(tmp_path: Path) -> dict[str, str]:
    """An environment whose ``import matplotlib`` fails, as on a node without the bench extra."""
    hidden = tmp_path / "hide"
    (hidden / "matplotlib").mkdir(parents=True)
    (hidden / "matplotlib" / "__init__.py").write_text('raise ImportError("No module named \'matplotlib\'")\n')
    return {"PYTHONPATH": os.pathsep.join((str(hidden), str(REPO)))}


@pytest.mark.parametrize("mode", [["--nodes", "2"], ["--chain"]])
def test_without_matplotlib_the_demo_says_how_to_get_it_and_does_nothing(
    run_cli: Any, without_matplotlib: dict[str, str], tmp_path: Path, mode: list[str]
) -> None:
    out = tmp_path / "run.png"
    r = run_cli("demo", *mode, "--plot", str(out), env=without_matplotlib)
    assert r.returncode == 5, r.stderr  # documented in the option's help: exit 5 before the demo
    assert "matplotlib is not installed" in r.stderr and "pip install 'netplugin[bench]'" in r.stderr
    assert "Traceback" not in r.stderr
    assert r.stdout == "" and not out.exists()  # the demo never started


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["--plot", "{tmp}/run.png"], "draws a --nodes or a --chain run"),
        (["--nodes", "2", "--plot", "{tmp}/absent/run.png"], "does not exist"),
        (["--chain", "--plot", "{tmp}/run.txt"], "must name a .png file"),
        (["--chain", "--plot", "{tmp}"], "must name a .png file"),
    ],
)
def test_a_plot_file_that_cannot_be_written_is_a_usage_error(
    run_cli: Any, tmp_path: Path, args: list[str], reason: str
) -> None:
    r = run_cli("demo", *[a.format(tmp=tmp_path) for a in args])
    assert r.returncode == 2, r.stderr
    assert "--plot" in r.stderr and reason in r.stderr and "Traceback" not in r.stderr
    assert r.stdout == ""


def _kernel_or_skip() -> None:
    reason = kernel_unavailable_reason() or (None if shutil.which("nft") else "nft is not installed")
    if reason:
        pytest.skip(reason)


@pytest.mark.kernel
def test_the_cluster_demo_plots_route_convergence_per_node(tmp_path: Path) -> None:
    _kernel_or_skip()
    out = tmp_path / "routes.png"
    # the simulated cluster's daemons get their own settings: none of the test CLI's NETPLUGIN_* variables
    env = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_") and not k.lower().endswith("_proxy")}
    r = subprocess.run([sys.executable, "-m", "netplugin", "-o", "json", "demo", "--nodes", "2", "--plot", str(out)],
                       capture_output=True, text=True, timeout=180, env=env, check=False, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert doc["plot"] == str(out) and f"plot of this run: {out}" in r.stderr
    assert out.read_bytes()[:8] == PNG_MAGIC
    assert set(doc["routes_after_start_ms"]) == {"node-1", "node-2"}
    assert set(doc["routes_after_removal_ms"]) == {"node-1"}
    assert doc["route_convergence_ms"] == max(doc["routes_after_removal_ms"].values())


@pytest.mark.kernel
def test_the_chain_demo_plots_each_members_time_per_pod(run_cli: Any, tmp_path: Path) -> None:
    _kernel_or_skip()
    out = tmp_path / "chain.png"
    r = run_cli("demo", "--chain", "--plot", str(out), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"plot of this run: {out}" in r.stdout
    assert out.read_bytes()[:8] == PNG_MAGIC
    doc = json.loads(run_cli("-o", "json", "demo", "--chain", timeout=300).stdout)
    calls = {(c["pod"], c["member"], c["action"]) for c in doc["calls"]}
    # every member of the chain ran its setup and its teardown for both pods
    assert calls == {(p, m, a) for p in ("shaped", "plain") for m in ("bridge", "bandwidth")
                     for a in ("setup", "teardown")}
    assert all(c["ms"] > 0 and c["outcome"] == "ok" for c in doc["calls"])
