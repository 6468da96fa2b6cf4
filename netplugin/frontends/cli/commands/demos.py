"""``demo``: pods on a real bridge (or a simulated cluster, or a chain), proved to talk and then
to leave nothing behind. The only CLI module that imports the lab."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import click

from netplugin.core.errors import InvalidArgument, NetpluginError
from netplugin.frontends.cli.context import State, pass_state
from netplugin.frontends.cli.options import AsciiIntRange, command
from netplugin.frontends.lab.demo import run_demo
from netplugin.frontends.lab.demo_chain import run_chain_demo
from netplugin.frontends.lab.demo_cluster import run_cluster_demo
from netplugin.frontends.lab.demoplot import check_plot_path, plot_chain, plot_cluster, require_matplotlib

__all__ = ["demo"]


@command()
@click.option("--pods", "count", type=AsciiIntRange(1, 200), default=3, show_default=True, help="How many pods.")
@click.option("--native", is_flag=True, help="Use the in-process netplugin.io/bridge plugin instead of the exec one.")
@click.option("--plugin-source", metavar="DIR", help="Where the shipped exec plugins are (default: found).")
@click.option("--subnet", metavar="CIDR", help="Pod subnet (default: a random /24 in 10.207.0.0/16).")
@click.option(
    "--nodes",
    type=AsciiIntRange(2, 8),
    help="Simulate a cluster of N nodes instead (each a netns with its own daemon; one pod per node).",
)
@click.option(
    "--chain",
    is_flag=True,
    help="Run the chain [bridge, bandwidth] instead: two pods, one shaped by its annotations; rates measured.",
)
@click.option(
    "--plot",
    metavar="FILE",
    help="With --nodes or --chain: write a PNG of the run to FILE (route convergence per node; each chain "
    "member's time per pod). Needs matplotlib (pip install 'netplugin[bench]'); without it, exit 5 before the demo.",
)
@pass_state
def demo(
    st: State,
    count: int,
    native: bool,
    plugin_source: str | None,
    subnet: str | None,
    nodes: int | None,
    chain: bool,
    plot: str | None,
) -> None:
    """Set up pods on a real bridge, prove they talk, tear them down and prove nothing is left (as root).

    \b
    Examples:
      sudo netplugin demo
      sudo netplugin demo --pods 6 --native
      sudo netplugin demo --nodes 3
      sudo netplugin demo --nodes 3 --plot routes.png
      sudo netplugin demo --chain --plot chain.png
    """

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    say = (lambda msg: click.echo(msg, err=True)) if st.json else click.echo
    plot_path = _plot_path(plot, nodes is not None or chain)
    if nodes is not None:
        _cluster_demo(st, nodes, "netplugin.io/bridge" if native else "bridge", plugin_source, say, plot_path)
        return
    if chain:
        _chain_demo(st, "netplugin.io/bridge" if native else "bridge", plugin_source, subnet, say, plot_path)
        return
    report = run_demo(
        count,
        plugin="netplugin.io/bridge" if native else "bridge",
        plugin_source=plugin_source,
        subnet=subnet,
        progress=say,
    )
    st.emit(report.to_dict(), None)
    if not report.ok:
        raise NetpluginError(
            "demo failed: "
            + "; ".join([f"{a} -> {b} unreachable" for a, b, ok in report.checks if not ok] + report.leftovers)
        )


def _plot_path(plot: str | None, plottable: bool) -> Path | None:
    """Where --plot writes, checked (and matplotlib found) before the demo does anything."""
    if plot is None:
        return None
    if not plottable:
        raise InvalidArgument("--plot", plot, "draws a --nodes or a --chain run: add one of them")
    path = check_plot_path(plot)
    require_matplotlib()
    return path


def _chain_demo(
    st: State, first: str, plugin_source: str | None, subnet: str | None, say: Any, plot: Path | None
) -> None:
    report = run_chain_demo(first=first, plugin_source=plugin_source, subnet=subnet, progress=say)
    doc = report.to_dict()
    if plot is not None:
        plot_chain(report, plot)
        doc["plot"] = str(plot)
        say(f"plot of this run: {plot}")
    st.emit(doc, None)
    if not report.ok:
        off = [f"{t.what}: {t.measured_bps / 1e6:.1f} Mbit/s" for t in report.transfers if not t.ok]
        raise NetpluginError("chain demo failed: " + "; ".join(off + report.leftovers))


def _cluster_demo(st: State, nodes: int, plugin: str, plugin_source: str | None, say: Any, plot: Path | None) -> None:
    report = run_cluster_demo(nodes, plugin=plugin, plugin_source=plugin_source, progress=say)
    doc = report.to_dict()
    if plot is not None and report.routes_after_start_ms:
        plot_cluster(report, plot)
        doc["plot"] = str(plot)
        say(f"plot of this run: {plot}")
    st.emit(doc, None)
    if not report.ok:
        failed = [f"{a} -> {b} failed" for a, b, ok in report.checks if not ok]
        raise NetpluginError("cluster demo failed: " + "; ".join(failed + report.leftovers))
