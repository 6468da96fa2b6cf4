"""Which figures get a plot, of what kind, over which columns, and the numbers each plot shows.

The table :data:`PLOTS` is the one place a figure gets its plot: one entry. The numbers a plot
draws are the figure's table cells as BENCHMARKS.md prints them (same rounding), written beside
the PNG as JSON with the run's tag and date, so a test can check picture against table without
running the benchmark (tests/test_bench_plots.py). Drawing is :mod:`bench.plots` (matplotlib).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .report import Figure, cell, ratio_cell

__all__ = ["KINDS", "PLOTS", "PlotSpec", "plot_data", "prune", "write_data"]

#: bars: one bar per row, the first column its height, the others its whiskers (p90; min and max; max);
#: the ratio to A of the first column, where the table has one, labels each bar.
#: lines: one line per row over the columns named with the prefix (``N=10``: x = 10).
#: panels: one panel per column, each row a point at x = the row's value of ``x``.
KINDS = ("bars", "lines", "panels")


@dataclass(frozen=True)
class PlotSpec:
    kind: str
    #: bars and panels: the columns drawn; lines: one prefix, the x value following it in each column's name
    columns: tuple[str, ...]
    #: panels: the column on the x axis
    x: str = ""


_BAR_P90 = PlotSpec("bars", ("median", "p90"))
_BAR_RANGE = PlotSpec("bars", ("median", "min", "max"))

#: figure id -> its plot (a new figure gets a plot by one entry here)
PLOTS: dict[str, PlotSpec] = {
    "setup": _BAR_P90,
    "teardown": _BAR_P90,
    "burst": _BAR_RANGE,
    "drain": _BAR_RANGE,
    "overhead": _BAR_P90,
    "coldstart": _BAR_P90,
    "scale": PlotSpec("lines", ("N=",)),
    "rss": PlotSpec("lines", ("N=",)),
    "runtime-add": _BAR_P90,
    "runtime-del": _BAR_P90,
    "runtime-burst": _BAR_RANGE,  # the 20-process burst of reports before the node-burst figures
    "node-burst-20": _BAR_RANGE,
    "node-burst-110": _BAR_RANGE,
    "node-burst-cores": PlotSpec("bars", ("speedup",)),
    "containerd-run": _BAR_P90,
    "containerd-stop": _BAR_P90,
    "containerd2-run": _BAR_P90,
    "containerd2-stop": _BAR_P90,
    "containerd2-burst": _BAR_RANGE,
    "kubelet-cluster": _BAR_RANGE,
    "cluster-routes": PlotSpec("bars", ("median", "max")),
    "cluster-size": PlotSpec("panels", ("first sync", "RSS"), x="nodes"),
    "chain-setup": _BAR_P90,
    "chain-teardown": _BAR_P90,
    "hostport-setup": _BAR_P90,
    "hostport-teardown": _BAR_P90,
    "repair": _BAR_P90,
}


def _printed(fig: Figure, key: str, column: str) -> float | None:
    text = cell(fig, key, column)
    return None if text == "-" else float(text.rstrip("x"))


def _point(fig: Figure, key: str, column: str, x: float | str) -> dict[str, Any] | None:
    y = _printed(fig, key, column)
    return None if y is None else {"row": key, "column": column, "x": x, "y": y}


def _ratios(fig: Figure, column: str) -> list[dict[str, Any]]:
    """The bars' ratio to A (the table's "<column> / A"), when the figure has one for that column."""
    if fig.ratio_column != column:
        return []
    name = f"{column} / A"
    points = [{"row": r.key, "column": name, "x": r.key, "y": float(ratio_cell(fig, r.key).rstrip("x"))}
              for r in fig.rows if ratio_cell(fig, r.key) != "-"]
    return [_series(name, "x", points)] if points else []


def _series(name: str, unit: str, points: Iterable[dict[str, Any] | None], label: str = "") -> dict[str, Any]:
    return {"name": name, "label": label, "unit": unit, "points": [p for p in points if p is not None]}


def plot_data(fig: Figure, spec: PlotSpec, run: str, date: str) -> dict[str, Any]:
    """The numbers the figure's plot draws, each with the table cell (row, column) it is."""
    if spec.kind == "bars":
        series = [_series(c, fig.unit_of(c), (_point(fig, r.key, c, r.key) for r in fig.rows))
                  for c in spec.columns if c in fig.columns] + _ratios(fig, spec.columns[0])
    elif spec.kind == "lines":
        prefix = spec.columns[0]
        cols = [c for c in fig.columns if c.startswith(prefix)]
        series = [_series(r.key, fig.unit, (_point(fig, r.key, c, int(c[len(prefix):])) for c in cols), r.label)
                  for r in fig.rows]
    elif spec.kind == "panels":
        xs = {r.key: _printed(fig, r.key, spec.x) for r in fig.rows}
        series = [_series(c, fig.unit_of(c), (_point(fig, k, c, x) for k, x in xs.items() if x is not None))
                  for c in spec.columns]
    else:
        raise ValueError(f"figure {fig.id}: plot kind {spec.kind!r} is not one of {', '.join(KINDS)}")
    return {"figure": fig.id, "title": fig.title, "kind": spec.kind, "x": spec.x or "contender",
            "run": run, "date": date, "series": series}


def write_data(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=1) + "\n")


def prune(out: Path, keep: Iterable[str]) -> list[str]:
    """Remove the plots (PNG and JSON) in ``out`` that this run did not write; returns their names."""
    if not out.is_dir():
        return []
    kept = set(keep)
    gone = sorted(p.name for p in out.iterdir() if p.suffix in (".png", ".json") and p.name not in kept)
    for name in gone:
        (out / name).unlink()
    return gone
