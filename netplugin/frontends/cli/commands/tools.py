"""The commands that measure and install: ``bench``, ``install-shim``, ``completion``."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import click

from netplugin.core.errors import SystemFailure
from netplugin.frontends.cli.completion import completion_script
from netplugin.frontends.cli.options import AsciiIntRange, command
from netplugin.frontends.cni.native import NoCompiler, build_native
from netplugin.frontends.entrypoints import install_entry

__all__ = ["bench", "completion", "install_shim"]


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
        click.echo(install_entry(kind, dest, python=python))
        return
    try:
        click.echo(build_native(dest, socket=sock, fallback=fallback))
    except NoCompiler as e:
        raise SystemFailure("cannot build the compiled shim", dest, str(e)) from None
    except subprocess.CalledProcessError as e:
        raise SystemFailure("cannot build the compiled shim", dest, (e.stderr or str(e)).strip()) from None
    except (OSError, ValueError) as e:
        raise SystemFailure("cannot build the compiled shim", dest, str(e)) from None


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
