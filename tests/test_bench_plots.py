"""The committed plots match the committed BENCHMARKS.md: same run, same numbers, every plot embedded.

No benchmark runs here: the test reads BENCHMARKS.md's tables and the JSON written beside each
PNG in bench/plots/ (the numbers the PNG was drawn from), and compares them cell by cell.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # bench/ is a top-level package of the checkout, not installed
    sys.path.insert(0, str(REPO))

from bench.plotspec import KINDS, PLOTS, PlotSpec  # noqa: E402

PLOTS_DIR = REPO / "bench" / "plots"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_UNIT = re.compile(r"^(.*?) \([^)]*\)$")


def _column(header: str) -> str:
    """A column's name from its header cell, without the unit: "median (ms)" -> "median"."""
    m = _UNIT.match(header)
    return m.group(1) if m else header


def parse_report(md: str) -> tuple[str, str, dict[str, dict[str, Any]]]:
    """(run tag, run date, figure id -> {title, table: {row: {column: cell}}, text})."""
    date = re.search(r"Run: (.+?), (?:quick|full) mode", md)
    tag = re.search(r"^- run tag: (\S+)$", md, re.M)
    assert date and tag, "BENCHMARKS.md names no run date or run tag"
    figures: dict[str, dict[str, Any]] = {}
    for section in md.split("\n### ")[1:]:
        found = re.search(r"<!-- figure (\S+) -->", section)
        if found is None:
            continue
        lines = [ln for ln in section.splitlines() if ln.startswith("|")]
        header = [c.strip() for c in lines[0].strip("|").split("|")]
        columns = [_column(h) for h in header]
        table = {}
        for ln in lines[2:]:
            cells = [c.strip() for c in ln.strip("|").split("|")]
            table[cells[0]] = dict(zip(columns[2:], cells[2:], strict=True))
        figures[found.group(1)] = {"title": section.splitlines()[0], "table": table, "text": section}
    return tag.group(1), date.group(1), figures


def _number(text: str) -> float:
    return float(text.rstrip("x"))


def _plotted(spec: PlotSpec, table: dict[str, dict[str, str]]) -> set[tuple[str, str]]:
    """The table cells (row, column) the plot of ``spec`` must draw: every measured one of its columns."""
    if spec.kind == "lines":
        columns = {c for cells in table.values() for c in cells if c.startswith(spec.columns[0])}
        columns -= {c for c in columns if c.endswith(" / A")}
    else:  # bars are labelled with their ratio to A where the table has one
        columns = {*spec.columns, f"{spec.columns[0]} / A"} if spec.kind == "bars" else set(spec.columns)
    return {(row, c) for row, cells in table.items() for c, text in cells.items() if c in columns and text != "-"}


def check_plot(fid: str, figure: dict[str, Any], data: dict[str, Any], tag: str, date: str) -> None:
    spec = PLOTS[fid]
    assert (data["figure"], data["kind"], data["title"]) == (fid, spec.kind, figure["title"])
    assert (data["run"], data["date"]) == (tag, date), f"{fid}: the plot is of another run than BENCHMARKS.md"
    table = figure["table"]
    drawn = set()
    for series in data["series"]:
        for p in series["points"]:
            cell = table[p["row"]][p["column"]]
            assert _number(cell) == p["y"], f"{fid}: {p['row']}/{p['column']} plotted {p['y']}, table {cell}"
            if spec.kind == "panels":
                assert _number(table[p["row"]][spec.x]) == p["x"], f"{fid}: {p['row']} x"
            drawn.add((p["row"], p["column"]))
    assert drawn == _plotted(spec, table), f"{fid}: plotted cells differ from the table's"


def test_every_plot_spec_is_well_formed() -> None:
    for fid, spec in PLOTS.items():
        assert spec.kind in KINDS, fid
        assert spec.columns, fid
        assert (spec.kind == "panels") == bool(spec.x), fid


def test_committed_plots_match_benchmarks_md() -> None:
    tag, date, figures = parse_report((REPO / "BENCHMARKS.md").read_text())
    with_plot = [fid for fid in figures if fid in PLOTS]
    assert with_plot, "BENCHMARKS.md has no figure with a plot spec"
    for fid in with_plot:
        png, js = PLOTS_DIR / f"{fid}.png", PLOTS_DIR / f"{fid}.json"
        assert png.read_bytes()[:8] == PNG_MAGIC, f"{png} is missing or not a PNG"
        assert f"](bench/plots/{fid}.png)" in figures[fid]["text"], f"BENCHMARKS.md does not embed {fid}.png"
        check_plot(fid, figures[fid], json.loads(js.read_text()), tag, date)
    stale = sorted(p.name for p in PLOTS_DIR.iterdir() if p.stem not in with_plot)
    assert stale == [], "plots of figures BENCHMARKS.md does not have"


def _report(rows: dict[str, dict[str, str]], title: str = "Per-pod setup (3 pods)") -> str:
    cols = list(next(iter(rows.values())))
    lines = ["# Benchmarks", "", "Run: 2026-11-28 04:00 UTC, quick mode, 60 s.", "", f"### {title}", "",
             "<!-- figure setup -->", "", "|  | contender | " + " | ".join(f"{c} (ms)" for c in cols) + " |",
             "|" + "---|" * (len(cols) + 2)]
    lines += [f"| {k} | x | " + " | ".join(v.values()) + " |" for k, v in rows.items()]
    return "\n".join([*lines, "", "## Settings", "", "- run tag: np000001", ""])


def _data(points: list[tuple[str, str, float]], run: str = "np000001") -> dict[str, Any]:
    series: dict[str, list[dict[str, Any]]] = {}
    for row, col, y in points:
        series.setdefault(col, []).append({"row": row, "column": col, "x": row, "y": y})
    return {"figure": "setup", "kind": "bars", "title": "Per-pod setup (3 pods)", "run": run,
            "date": "2026-11-28 04:00 UTC", "series": [{"name": c, "points": p} for c, p in series.items()]}


GOOD = [("A", "median", 8.81), ("A", "p90", 10.0), ("D", "median", 4.12), ("D", "p90", 4.54)]


@pytest.mark.parametrize(
    ("points", "run", "error"),
    [
        (GOOD, "np000001", None),
        ([("A", "median", 13.2), *GOOD[1:]], "np000001", "plotted 13.2, table 8.81"),  # a stale number
        (GOOD, "np999999", "another run"),
        (GOOD[:3], "np000001", "plotted cells differ"),  # a cell of the table not drawn
    ],
)
def test_the_check_catches_a_plot_that_disagrees(
    points: list[tuple[str, str, float]], run: str, error: str | None
) -> None:
    tag, date, figures = parse_report(_report({"A": {"median": "8.81", "p90": "10.0"},
                                               "D": {"median": "4.12", "p90": "4.54"}}))
    if error is None:
        check_plot("setup", figures["setup"], _data(points, run), tag, date)
        return
    with pytest.raises(AssertionError, match=error):
        check_plot("setup", figures["setup"], _data(points, run), tag, date)
