"""BENCHMARKS.md's generator: verdicts on the printed numbers, sentences that add up, readable headers,
and the plots' numbers taken from the printed table. No benchmark runs here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # bench/ is a top-level package of the checkout, not installed
    sys.path.insert(0, str(REPO))

from bench.plotspec import PLOTS, PlotSpec, plot_data, prune  # noqa: E402
from bench.report import (  # noqa: E402
    Figure,
    Meta,
    Row,
    evaluate_targets,
    findings,
    meets,
    part_of,
)
from bench.writer import render  # noqa: E402


def make_figure(fid: str, values: dict[str, dict[str, float | None]], **kw: object) -> Figure:
    """A figure whose rows are ``values`` (row key -> column -> value), columns in first-row order."""
    columns = list(next(iter(values.values())))
    fig = Figure(fid, kw.pop("title", f"figure {fid}"), str(kw.pop("unit", "ms")), columns, **kw)  # type: ignore[arg-type]
    fig.rows = [Row(k, f"row {k}", dict(v)) for k, v in values.items()]
    return fig


def make_meta() -> Meta:
    return Meta("quick", "2026-11-28 04:00 UTC", 60.0, {}, {}, {}, {"run tag": "np000001"})


@pytest.mark.parametrize(
    ("measured", "limit", "met"),
    [
        ("0.80x", "≤ 0.8x", True),  # equal to its limit as printed: met
        ("0.81x", "≤ 0.8x", False),
        ("0.79x", "≤ 0.8x", True),
        ("1.10x", "≤ 1.1x", True),
        ("+5.21 ms", "≤ +10 ms", True),
        ("+10.00 ms", "≤ +10 ms", True),
        ("120 ms", "≤ 120 ms", True),
        ("121 ms", "≤ 120 ms", False),
        ("64.0 ms (max)", "≤ 2000 ms", True),
        ("-0.50 ms", "≤ 2 ms", True),
    ],
)
def test_meets_compares_the_printed_numbers(measured: str, limit: str, met: bool) -> None:
    assert meets(measured, limit) is met


def _target(fig: Figure, tid: str) -> tuple[str, bool | None]:
    t = next(t for t in evaluate_targets([fig]) if t.id == tid)
    return t.measured, t.met


@pytest.mark.parametrize(
    ("g", "measured", "met"),
    [
        (53.6, "0.60x", True),  # 0.6002x unrounded: printed 0.60x, the limit is ≤ 0.6x
        (53.4, "0.60x", True),
        (54.5, "0.61x", False),
    ],
)
def test_a_ratio_printed_equal_to_its_limit_is_met(g: float, measured: str, met: bool) -> None:
    fig = make_figure("node-burst-20", {"A": {"median": 89.3}, "G": {"median": g}}, ratio_column="median")
    assert _target(fig, "node-burst-20-G") == (measured, met)


def test_node_burst_findings_state_the_printed_numbers() -> None:
    burst = make_figure("node-burst-110", {"G": {"median": 660.0, "per pod": 6.0}, "K": {"median": 220.0,
                                           "per pod": 2.0}}, params={"burst": 110})  # fmt: skip
    cores = make_figure("node-burst-cores", {"G-110": {"speedup": 1.25}, "A-110": {"speedup": 1.6}},
                        params={"low": 1, "high": 2})  # fmt: skip
    found = findings([burst, cores])
    assert "Node burst of 110, ms per pod (makespan / pods): G 6.00, K 2.00." in found
    assert "Node burst from 1 CPU to 2, speedup of the makespan: G-110 1.25x, A-110 1.60x." in found


@pytest.mark.parametrize(
    ("fid", "values", "tid", "measured", "met"),
    [
        # the burst against the kernel floor: the figure's "/ K" column is the ratio
        ("node-burst-110", {"A": {"median": 900.0, "/ K": 3.0}, "G": {"median": 450.0, "/ K": 1.5},
                            "K": {"median": 300.0, "/ K": 1.0}}, "node-burst-110-G-floor", "1.50x", True),
        ("node-burst-110", {"A": {"median": 900.0, "/ K": 3.0}, "G": {"median": 460.0, "/ K": 1.53},
                            "K": {"median": 300.0, "/ K": 1.0}}, "node-burst-110-G-floor", "1.53x", False),
        # F against the bash plugin run directly in the same burst
        ("node-burst-20", {"A": {"median": 100.0}, "F": {"median": 110.0}, "X": {"median": 100.0}},
         "node-burst-20-F", "1.10x", True),
        ("node-burst-20", {"A": {"median": 100.0}, "F": {"median": 120.0}, "X": {"median": 100.0}},
         "node-burst-20-F", "1.20x", False),
        # from 1 CPU to 2, netplugin must speed up at least as much as A: a lower limit
        ("node-burst-cores", {"A-110": {"speedup": 1.40}, "G-110": {"speedup": 1.40}}, "node-burst-cores-G",
         "1.40x", True),
        ("node-burst-cores", {"A-110": {"speedup": 1.40}, "G-110": {"speedup": 1.10}}, "node-burst-cores-G",
         "1.10x", False),
        ("node-burst-cores", {"A-110": {"speedup": 1.40}}, "node-burst-cores-G", "not measured", None),
    ],
)
def test_node_burst_targets(
    fid: str, values: dict[str, dict[str, float | None]], tid: str, measured: str, met: bool | None
) -> None:
    ratio = "median" if fid != "node-burst-cores" else None
    assert _target(make_figure(fid, values, ratio_column=ratio), tid) == (measured, met)


@pytest.mark.parametrize(
    ("part", "whole", "wanted", "unwanted"),
    [
        (6.13, 12.6, "takes 6.13 ms of W's 12.6 ms; the other 6.47 ms are rest.", "above"),
        (6.13, 6.13, "the other 0.00 ms", "above"),
        (6.13, 4.88, "P, 6.13 ms, is above W, 4.88 ms", "the other"),  # never a negative remainder
    ],
)
def test_part_of_never_prints_a_negative_remainder(part: float, whole: float, wanted: str, unwanted: str) -> None:
    text = part_of("P", part, "W", whole, "rest")
    assert wanted in text and unwanted not in text and "-" not in text


RUNTIME = {"A": 7.71, "F": 11.4, "G": 4.88, "Gpy": 12.6, "H": 11.3, "P": 6.13}


@pytest.mark.parametrize(
    ("values", "wanted", "unwanted"),
    [
        # the last report's numbers: P is above G, which starts no interpreter
        (RUNTIME, ["(G) takes 4.88 ms, 0.63x A's", "starts no interpreter",
                   "(P) takes 6.13 ms of Gpy's 12.6 ms; the other 6.47 ms", "+6.52 ms from G",
                   "(P) takes 6.13 ms of H's 11.3 ms; the other 5.17 ms"], ["of the shim's 4.88", "-1.25"]),
        ({**RUNTIME, "Gpy": 6.0}, ["(P), 6.13 ms, is above Gpy, 6.00 ms"], ["the other -"]),
        ({"A": 7.71, "G": 4.88}, ["(G) takes 4.88 ms"], ["Gpy", "(H)", "the other"]),
        ({"A": 7.71, "P": 6.13}, [], ["Runtime's view"]),
    ],
)
def test_the_runtime_finding_is_true_of_its_numbers(
    values: dict[str, float], wanted: list[str], unwanted: list[str]
) -> None:
    fig = make_figure("runtime-add", {k: {"median": v} for k, v in values.items()}, ratio_column="median")
    text = " ".join(findings([fig]))
    for w in wanted:
        assert w in text
    for u in unwanted:
        assert u not in text


BIG = {"A": {"nodes": 1.0, "first sync": 0.3012, "RSS": 42.93},
       "D-1000": {"nodes": 1000.0, "first sync": 0.862, "RSS": 66.31},
       "D-5000": {"nodes": 5000.0, "first sync": 3.521, "RSS": None}}


@pytest.mark.parametrize(
    ("fid", "values", "kw", "header", "row"),
    [
        ("cluster-size", BIG, {"unit": "s", "column_units": {"nodes": "", "RSS": "MiB"}},
         "|  | contender | nodes | first sync (s) | RSS (MiB) |", "| D-1000 | row D-1000 | 1000 | 0.86 | 66.3 |"),
        ("setup", {"A": {"median": 8.812, "p90": 10.04}}, {"ratio_column": "median"},
         "|  | contender | median (ms) | p90 (ms) | median / A |", "| A | row A | 8.81 | 10.0 | 1.00x |"),
        ("scale", {"B": {"N=10": 53.31, "growth": 1.069}}, {"unitless": ["growth"]},
         "|  | contender | N=10 (ms) | growth |", "| B | row B | 53.3 | 1.07x |"),
    ],
)
def test_table_headers_name_each_column_once_with_its_unit(
    fid: str, values: dict[str, dict[str, float | None]], kw: dict[str, object], header: str, row: str
) -> None:
    md = render(make_meta(), [make_figure(fid, values, **kw)], [], {})
    assert header in md.splitlines()
    assert row in md.splitlines()
    assert f"<!-- figure {fid} -->" in md


def test_render_embeds_each_plot_under_its_figure() -> None:
    figs = [make_figure("setup", {"A": {"median": 8.8}}), make_figure("teardown", {"A": {"median": 40.0}})]
    md = render(make_meta(), figs, [], {"setup": "bench/plots/setup.png"})
    setup, teardown = md.split("### figure teardown")
    assert "![figure setup](bench/plots/setup.png)" in setup
    assert "![" not in teardown
    assert "![" not in render(make_meta(), figs, [], {})


@pytest.mark.parametrize(
    ("fid", "values", "kw", "points"),
    [
        ("setup", {"A": {"median": 8.812, "p90": 10.04, "first": 11.9}, "B": {"median": 59.23, "p90": None,
                                                                                 "first": 80.0}}, {},
         [("A", "median", "A", 8.81), ("B", "median", "B", 59.2), ("A", "p90", "A", 10.0)]),
        ("setup", {"A": {"median": 8.812, "p90": 10.04}, "D": {"median": 4.118, "p90": 4.5}},
         {"ratio_column": "median"},  # the bars' labels: the table's ratio to A, as printed
         [("A", "median", "A", 8.81), ("D", "median", "D", 4.12), ("A", "p90", "A", 10.0), ("D", "p90", "D", 4.50),
          ("A", "median / A", "A", 1.00), ("D", "median / A", "D", 0.47)]),
        ("scale", {"D": {"N=10": 2.461, "N=1000": 3.873, "growth": 1.573}}, {"unitless": ["growth"]},
         [("D", "N=10", 10, 2.46), ("D", "N=1000", 1000, 3.87)]),
        ("cluster-size", BIG, {"unit": "s", "column_units": {"nodes": "", "RSS": "MiB"}},
         [("A", "first sync", 1.0, 0.30), ("D-1000", "first sync", 1000.0, 0.86), ("D-5000", "first sync", 5000.0,
                                                                                  3.52),
          ("A", "RSS", 1.0, 42.9), ("D-1000", "RSS", 1000.0, 66.3)]),
    ],
)
def test_plot_data_holds_the_printed_numbers(
    fid: str, values: dict[str, dict[str, float | None]], kw: dict[str, object],
    points: list[tuple[str, str, object, float]],
) -> None:
    data = plot_data(make_figure(fid, values, **kw), PLOTS[fid], "np000001", "2026-11-28 04:00 UTC")
    got = [(p["row"], p["column"], p["x"], p["y"]) for s in data["series"] for p in s["points"]]
    assert sorted(got, key=str) == sorted(points, key=str)
    assert (data["run"], data["date"], data["figure"]) == ("np000001", "2026-11-28 04:00 UTC", fid)


def test_an_unknown_plot_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="plot kind 'pie'"):
        plot_data(make_figure("setup", {"A": {"median": 1.0}}), PlotSpec("pie", ("median",)), "np1", "d")


def test_prune_removes_only_other_plots(tmp_path: Path) -> None:
    for name in ("setup.png", "setup.json", "old.png", "old.json", "README"):
        (tmp_path / name).write_text("x")
    assert prune(tmp_path, ["setup.png", "setup.json"]) == ["old.json", "old.png"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README", "setup.json", "setup.png"]
    assert prune(tmp_path / "absent", []) == []


def test_plot_all_draws_each_spec_and_removes_stale_plots(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from bench.plots import plot_all

    (tmp_path / "gone.png").write_bytes(b"old")
    figs = [
        make_figure("setup", {"A": {"median": 8.8, "p90": 10.0}, "D": {"median": 4.1, "p90": 4.5}}),
        make_figure("burst", {"A": {"median": 90.0, "min": 85.0, "max": 97.0}}),
        make_figure("scale", {"A": {"N=10": 7.2, "N=100": 7.7, "growth": 1.07}}, unitless=["growth"]),
        make_figure("cluster-size", BIG, unit="s", column_units={"nodes": "", "RSS": "MiB"}),
        make_figure("no-spec", {"A": {"median": 1.0}}),
        make_figure("teardown", {"A": {"median": None, "p90": None}}),  # nothing measured: no picture
    ]
    written = plot_all(figs, tmp_path, "np000001", "2026-11-28 04:00 UTC")
    assert written == {f: f"{f}.png" for f in ("setup", "burst", "scale", "cluster-size")}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(n for f in written for n in (f"{f}.png",
                                                                                             f"{f}.json"))
    for fid in written:
        assert (tmp_path / f"{fid}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert json.loads((tmp_path / f"{fid}.json").read_text())["figure"] == fid


@pytest.fixture
def without_matplotlib(tmp_path: Path) -> dict[str, str]:
    """An environment whose ``import matplotlib`` fails, as on a machine without the bench extra."""
    hidden = tmp_path / "hide"
    (hidden / "matplotlib").mkdir(parents=True)
    (hidden / "matplotlib" / "__init__.py").write_text('raise ImportError("No module named \'matplotlib\'")\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_") or k == "NETPLUGIN_PEERS"}
    return {**env, "PYTHONPATH": os.pathsep.join((str(hidden), str(REPO)))}


@pytest.mark.parametrize("argv", [["-m", "bench"], ["-m", "netplugin", "bench"]])
def test_a_run_that_cannot_draw_its_plots_is_refused_before_it_starts(
    without_matplotlib: dict[str, str], tmp_path: Path, argv: list[str]
) -> None:
    if os.geteuid() != 0:
        pytest.skip("the refusal checks root first")
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, *argv, "--quick", "--out", str(out)], env=without_matplotlib, cwd=REPO,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 2, done.stderr
    assert "matplotlib is not installed" in done.stderr and "--no-plots" in done.stderr
    assert "Traceback" not in done.stderr
    assert not out.exists()  # refused before anything ran or was written
