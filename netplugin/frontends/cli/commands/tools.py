"""The commands that demonstrate, measure and install: ``demo``, ``bench``, ``install-shim``, ``completion``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from click.shell_completion import get_completion_class

from netplugin.core.errors import InvalidArgument, NetpluginError, SystemFailure
from netplugin.frontends.cli.context import State, pass_state
from netplugin.frontends.cli.options import AsciiIntRange, command

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["COMPLETE_VAR", "bench", "completion", "completion_script", "demo", "install_shim"]

#: click's shell-completion variable: ``_NETPLUGIN_COMPLETE=bash_source netplugin`` prints the hook
COMPLETE_VAR = "_NETPLUGIN_COMPLETE"


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
    import signal

    from netplugin.frontends.lab.demo import run_demo

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
    from netplugin.frontends.lab.demoplot import check_plot_path, require_matplotlib

    if not plottable:
        raise InvalidArgument("--plot", plot, "draws a --nodes or a --chain run: add one of them")
    path = check_plot_path(plot)
    require_matplotlib()
    return path


def _chain_demo(
    st: State, first: str, plugin_source: str | None, subnet: str | None, say: Any, plot: Path | None
) -> None:
    from netplugin.frontends.lab.demo_chain import run_chain_demo

    report = run_chain_demo(first=first, plugin_source=plugin_source, subnet=subnet, progress=say)
    doc = report.to_dict()
    if plot is not None:
        from netplugin.frontends.lab.demoplot import plot_chain

        plot_chain(report, plot)
        doc["plot"] = str(plot)
        say(f"plot of this run: {plot}")
    st.emit(doc, None)
    if not report.ok:
        off = [f"{t.what}: {t.measured_bps / 1e6:.1f} Mbit/s" for t in report.transfers if not t.ok]
        raise NetpluginError("chain demo failed: " + "; ".join(off + report.leftovers))


def _cluster_demo(st: State, nodes: int, plugin: str, plugin_source: str | None, say: Any, plot: Path | None) -> None:
    from netplugin.frontends.lab.demo_cluster import run_cluster_demo

    report = run_cluster_demo(nodes, plugin=plugin, plugin_source=plugin_source, progress=say)
    doc = report.to_dict()
    if plot is not None and report.routes_after_start_ms:
        from netplugin.frontends.lab.demoplot import plot_cluster

        plot_cluster(report, plot)
        doc["plot"] = str(plot)
        say(f"plot of this run: {plot}")
    st.emit(doc, None)
    if not report.ok:
        failed = [f"{a} -> {b} failed" for a, b, ok in report.checks if not ok]
        raise NetpluginError("cluster demo failed: " + "; ".join(failed + report.leftovers))


@command()
@click.option("--quick", is_flag=True, help="Smoke-test sizes: a few pods, under a minute.")
@click.option(
    "--out", "out_dir", metavar="DIR", help="Write BENCHMARKS.md, results.json and plots/ here (default: the checkout)."
)
@click.option("--pods", type=AsciiIntRange(1, 250), help="Pods in the per-pod figure (default 60).")
@click.option(
    "--no-plots", is_flag=True, help="Draw no plots. Without it, a run without matplotlib is refused (exit 2)."
)
def bench(quick: bool, out_dir: str | None, pods: int | None, no_plots: bool) -> None:
    """Run the benchmarks of BENCHMARKS.md as root, from a checkout with the bench extra installed.

    \b
    Examples:
      sudo netplugin bench --quick
      sudo netplugin bench --out /tmp/bench
    """
    # bench/ is a top-level package of the checkout, beside netplugin/, not part of the installed package.
    pkg = Path(__file__).resolve().parents[4] / "bench"
    spec = importlib.util.spec_from_file_location("bench", pkg / "__init__.py", submodule_search_locations=[str(pkg)])
    if spec is None or spec.loader is None or not (pkg / "__init__.py").is_file():
        raise SystemFailure("cannot find the benchmark harness", str(pkg), "run netplugin from a checkout")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench"] = module
    spec.loader.exec_module(module)
    argv = ["--quick"] if quick else []
    argv += ["--out", out_dir] if out_dir else []
    argv += ["--pods", str(pods)] if pods else []
    argv += ["--no-plots"] if no_plots else []
    raise click.exceptions.Exit(module.main(argv))


@command("install-shim")
@click.argument("dest", metavar="DEST")
@click.option(
    "--kind",
    type=click.Choice(["cni", "cni-native", "cli"]),
    default="cni",
    show_default=True,
    help="cni: the netplugin-cni CNI plugin; cni-native: the compiled one (C); cli: the netplugin command.",
)
@click.option("--python", "python", metavar="PATH", help="Interpreter to run it with (default: this one).")
@click.option("--socket", "sock", metavar="PATH", help="cni-native: the daemon's socket (else NETPLUGIN_SOCKET).")
@click.option(
    "--fallback",
    metavar="PATH",
    default="",
    help="cni-native: the Python shim to exec when the daemon does not run a call; none: CNI error 11 (cluster).",
)
def install_shim(dest: str, kind: str, python: str | None, sock: str | None, fallback: str) -> None:
    """Write a fast entry script to DEST (a file, or a dir: DEST/netplugin-cni or DEST/netplugin).

    The script runs `python -I -S` with an explicit path instead of site hooks, so a CNI call
    that the daemon serves starts about as fast as a bare interpreter. Regenerate it after
    upgrading Python or netplugin. --kind cni-native compiles the C shim instead (a C compiler
    is needed: exit 5 without one, and the Python shim stays the one to install).

    \b
    Examples:
      netplugin install-shim /opt/cni/bin
      netplugin install-shim --kind cni-native /opt/cni/bin
    """
    if kind != "cni-native":
        from netplugin.frontends.entrypoints import install_entry

        click.echo(install_entry(kind, dest, python=python))
        return
    import subprocess

    from netplugin.frontends.cni.native import NoCompiler, build_native

    try:
        click.echo(build_native(dest, socket=sock, fallback=fallback))
    except NoCompiler as e:
        raise SystemFailure("cannot build the compiled shim", dest, str(e)) from None
    except subprocess.CalledProcessError as e:
        raise SystemFailure("cannot build the compiled shim", dest, (e.stderr or str(e)).strip()) from None
    except (OSError, ValueError) as e:
        raise SystemFailure("cannot build the compiled shim", dest, str(e)) from None


def completion_script(group: click.Group, shell: str) -> str:
    """The hook for ``shell`` (bash, zsh, fish): source it, or install it as the shell's completion file
    (for example ``netplugin completion bash > /etc/bash_completion.d/netplugin``)."""
    comp_cls = get_completion_class(shell)
    if comp_cls is None:
        raise click.BadParameter(f"no completion for {shell!r}", param_hint="SHELL")
    return comp_cls(group, {}, "netplugin", COMPLETE_VAR).source()


@command()
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
@click.pass_context
def completion(ctx: click.Context, shell: str) -> None:
    """Print the shell completion script for bash, zsh or fish.

    \b
    Examples:
      eval "$(netplugin completion bash)"
      netplugin completion bash > /etc/bash_completion.d/netplugin
    """
    root = ctx.find_root().command
    assert isinstance(root, click.Group)
    click.echo(completion_script(root, shell))
