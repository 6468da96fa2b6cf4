"""Command-line conventions of ``netplugin``: ``-o`` after a subcommand, how a usage error knows it
must be JSON, which extra a missing module belongs to, shell completion (the ``completion`` command
and its variable), and the ``health`` probe. :mod:`netplugin.frontends.cli` registers the commands
and still turns every error into its exit code and message.
"""

from __future__ import annotations

import os
from typing import Any

import click

from netplugin.core.extras import MissingExtra, extra_for

__all__ = [
    "COMPLETE_VAR",
    "OUTPUTS",
    "AsciiIntRange",
    "OutputOptionGroup",
    "completion",
    "completion_script",
    "health",
    "json_wanted",
    "missing_dir_warning",
    "missing_extra",
    "usage_error_doc",
    "version_info",
]

#: click's shell-completion variable: ``_NETPLUGIN_COMPLETE=bash_source netplugin`` prints the hook
COMPLETE_VAR = "_NETPLUGIN_COMPLETE"
OUTPUTS = ["text", "json"]


class AsciiIntRange(click.IntRange):
    """An integer option written in ASCII digits: Python's int() also reads other scripts' digits."""

    name = "integer range"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value.strip().lstrip("+-").isascii():
            self.fail(f"{value!r} is not an integer written in ASCII digits", param, ctx)
        return super().convert(value, param, ctx)


def _set_output(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    # The root context's object is the CLI's State (made by the group's callback, which click runs
    # before it parses the subcommand); absent while completing.
    state: Any = ctx.find_root().obj
    if value is not None and state is not None:
        state.output = value


class OutputOptionGroup(click.Group):
    """Every command also takes ``-o/--output`` after its name (``netplugin pods -o json``)."""

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        cmd.params.insert(
            0,
            click.Option(
                ["-o", "--output"],
                type=click.Choice(OUTPUTS),
                default=None,
                expose_value=False,
                # Eager: set before any other parameter of the command can fail, so that its
                # usage error is reported as JSON too.
                is_eager=True,
                callback=_set_output,
                help="Output format (the global -o, accepted here too).",
            ),
        )
        super().add_command(cmd, name)


def json_wanted(argv: list[str]) -> bool:
    """Whether ``-o json`` was asked for, read from argv itself (and NETPLUGIN_OUTPUT): a usage
    error can come before click processed the option, or from the option itself."""
    wanted = os.environ.get("NETPLUGIN_OUTPUT") == "json"
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        if arg in ("-o", "--output") and i + 1 < len(argv):
            wanted = argv[i + 1] == "json"
        elif arg.startswith("--output="):
            wanted = arg.partition("=")[2] == "json"
        elif arg.startswith("-o") and len(arg) > 2:
            wanted = arg[2:] == "json"
    return wanted


def missing_extra(err: BaseException, command: str | None) -> MissingExtra | None:
    """A MissingExtra for an ImportError of a module that an extra provides, else None."""
    if not isinstance(err, ModuleNotFoundError):
        return None
    extra = extra_for(err.name)
    if extra is None:
        return None
    return MissingExtra(f"netplugin {command}" if command else "netplugin", err.name or "", extra)


def usage_error_doc(err: click.ClickException, code: int) -> dict[str, Any]:
    """A usage error as the JSON document errors have under ``-o json``."""
    kind = "UsageError" if isinstance(err, click.UsageError) else type(err).__name__
    return {"error": kind, "message": err.format_message(), "exit_code": code}


def completion_script(group: click.Group, shell: str) -> str:
    """The hook for ``shell`` (bash, zsh, fish): source it, or install it as the shell's completion file
    (for example ``netplugin completion bash > /etc/bash_completion.d/netplugin``)."""
    from click.shell_completion import get_completion_class

    comp_cls = get_completion_class(shell)
    if comp_cls is None:
        raise click.BadParameter(f"no completion for {shell!r}", param_hint="SHELL")
    return comp_cls(group, {}, "netplugin", COMPLETE_VAR).source()


def version_info() -> tuple[dict[str, str], str]:
    """``--version``: the JSON document and the text line."""
    import platform

    from netplugin import __version__

    return {"version": __version__, "python": platform.python_version()}, f"netplugin {__version__}"


def missing_dir_warning(plugin_dir: str) -> str | None:
    """The warning ``plugins`` prints when the exec dir does not exist (it lists the built-ins only)."""
    if os.path.lexists(plugin_dir):
        return None
    return f"netplugin: warning: exec plugin dir {plugin_dir} does not exist; only built-in plugins"


@click.command()
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
@click.pass_context
def completion(ctx: click.Context, shell: str) -> None:
    """Print the shell completion script: eval "$(netplugin completion bash)"."""
    root = ctx.find_root().command
    assert isinstance(root, click.Group)
    click.echo(completion_script(root, shell))


@click.command()
@click.option("--wait", type=click.FloatRange(0.1, 300), default=5.0, show_default=True, help="Seconds to wait.")
@click.pass_context
def health(ctx: click.Context, wait: float) -> None:
    """Ask the daemon if it serves: exit 0, or 6 when nobody answers (a stale socket too).

    The DaemonSet's liveness and readiness probes run this."""
    from netplugin.frontends.client import request

    state: Any = ctx.find_root().obj  # the CLI's State: its config and output format
    h = request(state.config.socket_path, "health", timeout=wait)
    stuck = f"; {len(h['stuck'])} plugin call(s) stuck past their time limits" if h.get("stuck") else ""
    state.emit(h, f"serving: pid {h['pid']}, plugin {h['plugin'] or '-'}, up {h['uptime_seconds']:.0f} s{stuck}")
