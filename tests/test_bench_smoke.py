"""A quick smoke run of the benchmark harness: it runs end to end, writes its report, leaves nothing.

Benchmarks are not tests; this only proves the harness works (tiny sizes, every contender that
is available on this machine) so that a full run does not fail an hour in.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the benchmark creates network namespaces and bridges"),
]

SECTIONS = [
    "## Machine",
    "## Contenders",
    "## Targets",
    "## Figures",
    "### Per-pod setup (",
    "### Per-pod teardown",
    "### Burst:",
    "### Drain:",
    "### netplugin's overhead",
    "### CLI cold start",
    "### Per-pod setup with N pods already present",
    "### The runtime's view: ADD / setup as a process",
    "### The runtime's view: DEL / teardown as a process",
    "### containerd RunPodSandbox",
    "### The runtime's view:",
    "### Node burst: 3 ADD processes at once",
    "### Node burst: 1 CPU against",
]


def _table(md: str, heading: str) -> list[list[str]]:
    """The rows (cells) of the first table after ``heading``."""
    part = md.split(heading, 1)[1]
    rows = []
    for line in part.splitlines()[2:]:
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if all(c and set(c) <= {"-"} for c in cells):
            continue  # the |---| line
        rows.append(cells)
    return rows[1:]  # without the header


def _leftovers(tag: str) -> list[str]:
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    netns = os.listdir("/var/run/netns") if os.path.isdir("/var/run/netns") else []
    return re.findall(rf"\b{tag}\S*", links) + [n for n in netns if n.startswith(tag)]


@pytest.mark.timeout(660)  # past the run's own limit (600 s): a loaded machine gets the run's own error
def test_quick_run_writes_a_complete_report(tmp_path: Path) -> None:
    # the peer build's directory stays: contender A is the CNI plugins v1.10 built there
    env = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_") or k == "NETPLUGIN_PEERS"}
    env["PYTHONPATH"] = str(REPO)
    args = [sys.executable, "-m", "bench", "--quick", "--pods", "3", "--out", str(tmp_path)]
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        args.append("--no-plots")
    done = subprocess.run(
        args, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL
    )
    assert done.returncode == 0, done.stderr[-3000:]

    md = (tmp_path / "BENCHMARKS.md").read_text()
    for section in SECTIONS:
        assert section in md, f"missing {section!r}"
    results = json.loads((tmp_path / "results.json").read_text())
    available = results["meta"]["available"]
    assert "B" in available, results["meta"]["unavailable"]

    # Every target is stated as met, missed or not measured; none is silently dropped.
    targets = _table(md, "## Targets")
    # issue 18 added: shim DEL, containerd, D's growth against E's; issue 29: hostPort chain; issue 38: node bursts
    assert len(targets) == 27
    assert all(t[3] in ("**met**", "**MISSED**", "not measured") for t in targets)

    # Each available contender has a per-pod setup and teardown row whose numbers parse and are positive.
    for heading in ("### Per-pod setup (", "### Per-pod teardown"):
        rows = {r[0]: r for r in _table(md, heading)}
        for key in available:
            median, p90 = float(rows[key][2]), float(rows[key][3])
            assert 0 < median <= p90 < 60_000
        if "A" in available:
            assert rows["A"][-1] == "1.00x"
            assert all(r[-1].endswith("x") and float(r[-1][:-1]) > 0 for r in rows.values())

    # The JSON holds the raw samples; every value is a finite number.
    for fig in results["figures"]:
        for row in fig["rows"]:
            for v in row["values"].values():
                assert v is None or math.isfinite(v)
    by_id = {f["id"]: f for f in results["figures"]}
    assert len(by_id["setup"]["samples"]["B"]) == 3
    # The runtime's view: every row measured (the shim and the CLI served by their daemons).
    for fid in ("runtime-add", "runtime-del"):
        want = dict.fromkeys(("A", "O", "F", "G", "Fpy", "Gpy", "H", "P"), 3)
        assert {k: len(v) for k, v in by_id[fid]["samples"].items()} == want, fid
    # A node's pods at once: every contender and the kernel floor measured, on 1 CPU and on all.
    assert {k: len(v) for k, v in by_id["node-burst-3"]["samples"].items()} == dict.fromkeys(
        ("A", "F", "G", "X", "K", "K-seq"), 1
    )
    assert all(r["values"]["speedup"] for r in by_id["node-burst-cores"]["rows"])
    # The containerd figure: every row measured, netplugin's calls served by its daemon.
    assert {k: len(v) for k, v in by_id["containerd-run"]["samples"].items()} == dict.fromkeys(("A", "N", "HOST"), 4)
    measured = {t[0]: t[3] for t in targets}
    # the node-burst targets are of 20 and 110 at once, sizes a quick run does not reach
    burst_targets = [k for k in measured if "concurrent" in k]
    assert len(burst_targets) == 4 and all(measured[k] == "not measured" for k in burst_targets), measured
    assert all(measured[k] != "not measured" for k in measured if ("shim" in k or "CLI setup" in k)
               and k not in burst_targets), measured  # fmt: skip
    assert by_id["coldstart"]["rows"][0]["values"]["median"] > 0
    # The simulated cluster's figures: a warm daemon asks the API nothing per pod, the CLI alone does.
    api = {r["key"]: r["values"]["per pod"] for r in by_id["cluster-api"]["rows"]}
    assert api["D-warm"] == 0 and api["B-cli"] >= 1
    changes = {r["key"] for r in by_id["cluster-routes"]["rows"]}
    assert changes == {"join-all", "join-1", "change-1", "leave-1", "leave-all"}

    plots = tmp_path / "plots"
    if "--no-plots" not in args:
        for name in ("setup.png", "teardown.png", "burst.png", "drain.png", "scale.png", "coldstart.png"):
            assert (plots / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert "](plots/setup.png)" in md
        # Every figure with a plot spec got its PNG, its JSON (the table's numbers, this run) and its embed.
        from tests.test_bench_plots import PLOTS, check_plot, parse_report  # it puts the checkout's bench/ in reach

        run, date, figures = parse_report(md)
        plotted = [fid for fid in figures if fid in PLOTS]
        assert {"runtime-add", "containerd-run", "cluster-routes", "cluster-size", "chain-setup"} <= set(plotted)
        for fid in plotted:
            assert (plots / f"{fid}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", fid
            assert f"](plots/{fid}.png)" in figures[fid]["text"], fid
            check_plot(fid, figures[fid], json.loads((plots / f"{fid}.json").read_text()), run, date)
        assert sorted(p.stem for p in plots.iterdir()) == sorted(n for fid in plotted for n in (fid, fid))

    # Nothing of the run is left: no netns, veth or bridge with its tag, no daemon.
    tag = results["meta"]["settings"]["run tag"]
    assert re.fullmatch(r"np[0-9a-f]{6}", tag)
    assert _leftovers(tag) == []
    import psutil

    scratch = f"netplugin-bench-{tag}-"
    for proc in psutil.process_iter():
        try:
            environ = proc.environ()
        except psutil.Error:
            continue
        assert scratch not in environ.get("NETPLUGIN_RUN_DIR", ""), f"daemon {proc.pid} still running"
