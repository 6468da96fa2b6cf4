"""A PNG of a demo run: ``netplugin demo --nodes N --plot FILE`` and ``demo --chain --plot FILE``.

matplotlib is optional (the ``bench`` extra); :func:`require_matplotlib` is asked before the demo
starts, so that a missing matplotlib is an error with no side effects, not a run thrown away.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from netplugin.core.errors import InvalidArgument, SystemFailure
from netplugin.frontends.lab.demo_chain import ChainDemoReport
from netplugin.frontends.lab.demo_cluster import ClusterReport

__all__ = ["MATPLOTLIB_HINT", "check_plot_path", "plot_chain", "plot_cluster", "require_matplotlib"]

MATPLOTLIB_HINT = "pip install 'netplugin[bench]' (or: pip install matplotlib)"


def require_matplotlib() -> None:
    """SystemFailure (exit 5) when matplotlib cannot be imported, saying how to get it."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        raise SystemFailure("netplugin demo --plot", None, f"matplotlib is not installed: {MATPLOTLIB_HINT}") from e


def check_plot_path(path: str) -> Path:
    """The absolute path of the PNG to write; InvalidArgument when it cannot be one (before any work)."""
    out = Path(path).absolute()
    if out.suffix.lower() != ".png":
        raise InvalidArgument("--plot", path, "must name a .png file")
    if out.is_dir():
        raise InvalidArgument("--plot", path, "is a directory")
    if not out.parent.is_dir():
        raise InvalidArgument("--plot", path, f"its directory {out.parent} does not exist")
    if not os.access(out.parent, os.W_OK):
        raise InvalidArgument("--plot", path, f"its directory {out.parent} is not writable")
    return out


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt: Any, figure: Any, path: Path) -> None:
    figure.tight_layout()
    try:
        figure.savefig(path, dpi=100)
    except OSError as e:
        raise SystemFailure("writing the plot", str(path), e.strerror or str(e)) from e
    finally:
        plt.close(figure)


def _node_bars(ax: Any, times: dict[str, float], title: str) -> None:
    names = list(times)
    ax.bar(names, [times[n] for n in names], color="#1f77b4")
    for i, n in enumerate(names):
        ax.annotate(f"{times[n]:g}", (i, times[n]), ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("ms")
    ax.set_title(title, fontsize=9)
    ax.margins(y=0.2)


def plot_cluster(report: ClusterReport, path: Path) -> None:
    """Route convergence per node: after the last node started, and after a node was removed."""
    plt = _pyplot()
    panels = [(report.routes_after_start_ms, "routes to every node in place, after the last node started")]
    if report.routes_after_removal_ms:
        panels.append((report.routes_after_removal_ms, f"routes to {report.removed_node} gone, after its "
                                                      "Node was deleted"))
    figure, axes = plt.subplots(1, len(panels), figsize=(5.0 * len(panels), 4.0), squeeze=False)
    for ax, (times, title) in zip(axes[0], panels, strict=True):
        _node_bars(ax, times, title)
    figure.suptitle(f"netplugin demo --nodes {len(report.nodes)}: route convergence per node", fontsize=10)
    _save(plt, figure, path)


def plot_chain(report: ChainDemoReport, path: Path) -> None:
    """Each chain member's setup and teardown time per pod, and the rates measured against the limits."""
    plt = _pyplot()
    figure, (left, right) = plt.subplots(1, 2, figsize=(11.0, 4.2))
    bars = [(f"{c['pod']}\n{c['action']}", c["member"], c["ms"]) for c in report.calls]
    groups = list(dict.fromkeys(g for g, _m, _v in bars))
    members = list(dict.fromkeys(m for _g, m, _v in bars))
    width = 0.8 / max(1, len(members))
    for j, member in enumerate(members):
        values = {g: v for g, m, v in bars if m == member}
        xs = [i + j * width for i, g in enumerate(groups) if g in values]
        left.bar(xs, [values[g] for g in groups if g in values], width, label=member)
    left.set_xticks([i + width * (len(members) - 1) / 2 for i in range(len(groups))], groups, fontsize=8)
    left.set_ylabel("ms")
    left.set_title("each chain member's call, per pod", fontsize=9)
    left.legend(fontsize=8)
    names = [t.what.split(" (")[0] for t in report.transfers]
    right.barh(names, [t.measured_bps / 1e6 for t in report.transfers], color="#2ca02c", label="measured")
    for i, t in enumerate(report.transfers):
        if t.limit_bps is not None:
            right.plot([t.limit_bps / 1e6] * 2, [i - 0.4, i + 0.4], color="black", lw=2)
    right.set_xscale("log")
    right.set_xlabel("Mbit/s (log scale; black: the pod's limit)")
    right.set_title("TCP transfers", fontsize=9)
    figure.suptitle(f"netplugin demo --chain: chain {', '.join(report.chain)}", fontsize=10)
    _save(plt, figure, path)
