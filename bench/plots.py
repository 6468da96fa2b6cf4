"""PNG plots of the figures (matplotlib, installed only for benchmarking: ``pip install .[bench]``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .report import Figure

__all__ = ["available", "plot_all"]

_COLORS = {"A": "#7f7f7f", "O": "#bcbd22", "B": "#1f77b4", "C": "#2ca02c", "D": "#d62728", "E": "#9467bd"}


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _color(key: str) -> str:
    return _COLORS.get(key[:1], "#bcbd22")


def _bars(plt: Any, fig: Figure, path: Path) -> None:
    col = fig.ratio_column or fig.columns[0]
    rows = [r for r in fig.rows if r.values.get(col) is not None]
    if not rows:
        return
    f, ax = plt.subplots(figsize=(max(5.0, 1.3 * len(rows) + 2), 4.2))
    xs = range(len(rows))
    vals = [float(r.values[col] or 0.0) for r in rows]
    ax.bar(xs, vals, color=[_color(r.key) for r in rows])
    if "p90" in fig.columns:
        up = [max(0.0, float(r.values.get("p90") or v) - v) for r, v in zip(rows, vals, strict=True)]
        ax.errorbar(xs, vals, yerr=[[0.0] * len(vals), up], fmt="none", ecolor="black", capsize=4, lw=1)
    elif "min" in fig.columns and "max" in fig.columns:
        lo = [v - float(r.values.get("min") or v) for r, v in zip(rows, vals, strict=True)]
        hi = [float(r.values.get("max") or v) - v for r, v in zip(rows, vals, strict=True)]
        ax.errorbar(xs, vals, yerr=[lo, hi], fmt="none", ecolor="black", capsize=4, lw=1)
    for x, r, v in zip(xs, rows, vals, strict=True):
        ratio = fig.ratio(r.key)
        text = f"{v:.1f}" + (f"\n{ratio:.2f}x A" if ratio is not None and r.key != "A" else "")
        top = max(v, float(r.values.get("p90") or r.values.get("max") or v))
        ax.annotate(text, (x, top), ha="center", va="bottom", fontsize=8, xytext=(0, 3), textcoords="offset points")
    ax.set_xticks(list(xs), [r.key for r in rows])
    positive = [v for v in vals if v > 0]
    if positive and max(positive) / min(positive) > 20:
        ax.set_yscale("log")  # one slow contender would flatten all the others
    ax.set_ylabel(f"{col} ({fig.unit})" + (", log scale" if ax.get_yscale() == "log" else "")
                  if fig.unit else col)
    ax.set_title(fig.title, fontsize=10)
    ax.margins(y=0.2)
    f.tight_layout()
    f.savefig(path, dpi=110)
    plt.close(f)


def _scale(plt: Any, fig: Figure, path: Path) -> None:
    from matplotlib.ticker import NullFormatter

    cols = [c for c in fig.columns if c.startswith("N=")]
    levels = [int(c[2:]) for c in cols]
    f, (ax, rel) = plt.subplots(1, 2, figsize=(11, 4.4))
    for r in fig.rows:
        ys = [r.values.get(c) for c in cols]
        ax.plot(levels, ys, marker="o", label=f"{r.key}: {r.label}", color=_color(r.key))
        if ys[0]:
            rel.plot(levels, [None if y is None else y / ys[0] for y in ys], marker="o", label=r.key,
                     color=_color(r.key))
    for a in (ax, rel):
        a.set_xscale("log")
        a.set_xticks(levels, [str(lv) for lv in levels])
        a.xaxis.set_minor_formatter(NullFormatter())
        a.set_xlabel("pods already present on the network")
    ax.set_yscale("log")
    ax.set_ylabel("per-pod setup, median (ms, log scale)")
    ax.set_title(fig.title, fontsize=10)
    ax.legend(fontsize=7)
    rel.axhline(1.1, color="black", ls="--", lw=1, label="target 1.1x")
    rel.set_ylabel(f"relative to N={levels[0]}")
    rel.set_title("growth (the target: at most 1.1x for B, C, D)", fontsize=10)
    rel.legend(fontsize=7)
    f.tight_layout()
    f.savefig(path, dpi=110)
    plt.close(f)


def plot_all(figures: Sequence[Figure], out: Path) -> list[str]:
    """Write one PNG per figure into ``out``; returns the file names. Figures keep their ``plot``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for fig in figures:
        if not fig.plot:
            continue
        path = out / fig.plot
        if fig.id == "scale":
            _scale(plt, fig, path)
        else:
            _bars(plt, fig, path)
        if path.exists():
            written.append(fig.plot)
    return written
