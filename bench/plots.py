"""PNG plots of the figures (matplotlib, installed only for benchmarking: ``pip install .[bench]``).

Each plot is drawn from the numbers :func:`bench.plotspec.plot_data` takes from the figure's
printed table, and those numbers are written beside it as JSON: picture, JSON and table agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .plotspec import PLOTS, plot_data, prune, write_data
from .report import Figure

__all__ = ["HINT", "available", "plot_all"]

#: how to get matplotlib, for the refusal of a run that cannot draw its plots
HINT = "pip install '.[bench]' (scripts/install-deps.sh --test installs it), or pass --no-plots"

_COLORS = {"A": "#7f7f7f", "O": "#bcbd22", "B": "#1f77b4", "C": "#2ca02c", "D": "#d62728", "E": "#9467bd",
           "F": "#17becf", "G": "#e377c2", "H": "#8c564b", "N": "#d62728", "P": "#c7c7c7",
           "K": "#000000", "X": "#ff7f0e"}


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _color(key: str) -> str:
    return _COLORS.get(key[:1], "#bcbd22")


def _bars(ax: Any, data: dict[str, Any]) -> None:
    bars, *whiskers = data["series"]
    ratio = next(({p["row"]: p["y"] for p in w["points"]} for w in whiskers if w["unit"] == "x"), {})
    whiskers = [w for w in whiskers if w["unit"] != "x"]
    keys = [p["row"] for p in bars["points"]]
    vals = [p["y"] for p in bars["points"]]
    xs = list(range(len(keys)))
    ax.bar(xs, vals, color=[_color(k) for k in keys])
    by = {w["name"]: {p["row"]: p["y"] for p in w["points"]} for w in whiskers}
    lo = [v - by["min"].get(k, v) for k, v in zip(keys, vals, strict=True)] if "min" in by else [0.0] * len(vals)
    top = by.get("p90") or by.get("max") or {}
    hi = [max(0.0, top.get(k, v) - v) for k, v in zip(keys, vals, strict=True)]
    if whiskers:
        ax.errorbar(xs, vals, yerr=[lo, hi], fmt="none", ecolor="black", capsize=4, lw=1)
    for x, k, v, h in zip(xs, keys, vals, hi, strict=True):
        text = f"{v:g}" + (f"\n{ratio[k]:.2f}x A" if k in ratio and k != "A" else "")
        ax.annotate(text, (x, v + h), ha="center", va="bottom", fontsize=8, xytext=(0, 3),
                    textcoords="offset points")
    ax.set_xticks(xs, keys)
    positive = [v for v in vals if v > 0]
    log = bool(positive) and max(positive) / min(positive) > 20  # one slow row would flatten all the others
    if log:
        ax.set_yscale("log")
    whisk = f", whiskers {'/'.join(w['name'] for w in whiskers)}" if whiskers else ""
    unit = f" ({bars['unit']})" if bars["unit"] else ""
    ax.set_ylabel(f"{bars['name']}{unit}{whisk}" + (", log scale" if log else ""))
    ax.margins(y=0.2)


def _lines(ax: Any, data: dict[str, Any]) -> None:
    levels: set[int] = set()
    for s in data["series"]:
        xs = [p["x"] for p in s["points"]]
        levels.update(xs)
        ax.plot(xs, [p["y"] for p in s["points"]], marker="o", color=_color(s["name"]),
                label=f"{s['name']}: {s['label']}" if s["label"] else s["name"])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ticks = sorted(levels)
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("N")
    unit = data["series"][0]["unit"] if data["series"] else ""
    ax.set_ylabel(f"median ({unit}, log scale)" if unit != "MiB" else "RSS (MiB, log scale)")
    ax.legend(fontsize=7)


def _panels(axes: Sequence[Any], data: dict[str, Any]) -> None:
    for ax, s in zip(axes, data["series"], strict=True):
        pts = sorted(s["points"], key=lambda p: p["x"])
        ax.plot([p["x"] for p in pts], [p["y"] for p in pts], marker="o", color="#d62728")
        for p in pts:
            ax.annotate(f"{p['y']:g}", (p["x"], p["y"]), fontsize=8, xytext=(4, 4), textcoords="offset points")
        ax.set_xscale("log")
        ax.set_xlabel(data["x"])
        ax.set_ylabel(f"{s['name']} ({s['unit']})" if s["unit"] else s["name"])
        ax.margins(y=0.2)


def _draw(plt: Any, data: dict[str, Any], path: Path) -> None:
    kind = data["kind"]
    count = len(data["series"]) if kind == "panels" else 1
    width = 9.0 if kind != "bars" else max(5.0, 1.1 * len(data["series"][0]["points"]) + 2)
    f, axes = plt.subplots(1, count, figsize=(width * (1 if count == 1 else 0.7 * count), 4.4), squeeze=False)
    row = list(axes[0])
    if kind == "bars":
        _bars(row[0], data)
    elif kind == "lines":
        _lines(row[0], data)
    else:
        _panels(row, data)
    f.suptitle(f"{data['title']}\nrun {data['run']}, {data['date']}", fontsize=9)
    f.tight_layout()
    f.savefig(path, dpi=100)
    plt.close(f)


def plot_all(figures: Sequence[Figure], out: Path, run: str, date: str) -> dict[str, str]:
    """One PNG and its JSON per figure with a plot spec, into ``out``; the others there are removed.

    Returns figure id -> PNG file name. Raises ImportError without matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, str] = {}
    for fig in figures:
        spec = PLOTS.get(fig.id)
        if spec is None:
            continue
        data = plot_data(fig, spec, run, date)
        if not any(s["points"] for s in data["series"]):
            continue  # nothing measured: the table says so, a blank picture would not
        _draw(plt, data, out / f"{fig.id}.png")
        write_data(out / f"{fig.id}.json", data)
        written[fig.id] = f"{fig.id}.png"
    prune(out, [n for fid, png in written.items() for n in (png, f"{fid}.json")])
    return written
