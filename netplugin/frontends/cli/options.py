"""Option helpers of the ``netplugin`` commands: the global options (from the package's table),
``-o`` after any command, the pod triple, ASCII-only integers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from netplugin.core.configkeys import PARSERS
from netplugin.core.logs import configure
from netplugin.frontends.cli import GLOBAL_VALUE_OPTIONS, OUTPUTS, Flag
from netplugin.frontends.cli.completion import complete_infra_id, complete_namespace, complete_plugin, complete_pod
from netplugin.frontends.cli.context import State

__all__ = [
    "GLOBAL_EPILOG",
    "AsciiIntRange",
    "OutputCommand",
    "cni_bin_dirs",
    "command",
    "configure_logging",
    "global_options",
    "pod_arguments",
]

F = TypeVar("F", bound=Callable[..., Any])


class AsciiIntRange(click.IntRange):
    """An integer option written in ASCII digits: Python's int() also reads other scripts' digits."""

    name = "integer range"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value.strip().lstrip("+-").isascii():
            self.fail(f"{value!r} is not an integer written in ASCII digits", param, ctx)
        return super().convert(value, param, ctx)


def _state(ctx: click.Context) -> Any:
    # The root context's object is the CLI's State (made by the group's callback, which click runs
    # before it parses the subcommand); absent while completing.

    state = ctx.find_root().obj
    return state if isinstance(state, State) else None


def _set_global(flag: Flag) -> Callable[[click.Context, click.Parameter, Any], None]:
    """The callback of a global option given after the command: as if given before it."""

    def store(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        state = _state(ctx)
        if value is None or state is None:
            return
        if flag.dest == "output":
            state.output = value
        elif flag.dest == "config_path":
            state.config_path = value
        elif flag.config_key is not None:
            state.overrides[flag.config_key] = value
        if flag.config_key in ("log_level", "log_format"):
            configure_logging(state.verbose, state.overrides.get("log_level"), state.overrides.get("log_format"))

    return store


def _more_verbose(ctx: click.Context, param: click.Parameter, value: int) -> None:
    state = _state(ctx)
    if value and state is not None:
        state.verbose += value
        configure_logging(state.verbose, state.overrides.get("log_level"), state.overrides.get("log_format"))


def configure_logging(verbose: int, log_level: str | None, log_format: str | None) -> None:
    """The CLI's own log lines (-v, --log-level, --log-format; the daemon reads its config's too)."""
    level = log_level or ("debug" if verbose > 1 else "info")
    for option, key, value in (("--log-level", "log_level", level), ("--log-format", "log_format", log_format)):
        try:
            PARSERS[key](value if value is not None else "text")
        except ValueError as e:
            raise click.BadParameter(f"{value!r} {e}", param_hint=option) from None
    configure(level, log_format or "text")


#: what every command's help says of the global options it takes without listing them
GLOBAL_EPILOG = "Global options (netplugin --help) work here too, before or after the command."


class OutputCommand(click.Command):
    """A command that also takes the global options after its name (``netplugin pods -o json``,
    ``netplugin doctor --config F``); ``-o`` is listed in its help, the others are not."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("epilog", GLOBAL_EPILOG)
        super().__init__(*args, **kwargs)
        own = {opt for p in self.params for opt in p.opts}
        added: list[click.Parameter] = []
        for flag in GLOBAL_VALUE_OPTIONS:
            names = [n for n in flag.names if n not in own]
            if names != list(flag.names):
                continue  # the command has an option of that name (serve's --config): its own wins
            output = flag.dest == "output"
            added.append(
                click.Option(
                    names,
                    type=click.Choice(OUTPUTS) if output else None,
                    metavar=None if output else flag.metavar,
                    default=None,
                    expose_value=False,
                    # Eager: set before any other parameter of the command can fail, so that its
                    # usage error is reported in the asked format too.
                    is_eager=True,
                    callback=_set_global(flag),
                    shell_complete=_completer(flag),
                    hidden=not output,
                    help="Output format (the global -o, accepted here too)." if output else flag.help,
                )
            )
        if "-v" not in own:
            added.append(
                click.Option(
                    ["-v", "--verbose"], count=True, expose_value=False, hidden=True, callback=_more_verbose
                )
            )
        self.params[:0] = added

    def get_short_help_str(self, limit: int = 45) -> str:
        """The summary's whole first sentence: click would cut it at ``limit`` characters."""
        if self.short_help:
            return self.short_help
        first = (self.help or "").strip().split("\n\n")[0]
        return " ".join(first.split())


def command(name: str | None = None) -> Callable[[Callable[..., Any]], OutputCommand]:
    """``click.command`` for every netplugin command (it takes ``-o`` too)."""
    return click.command(name, cls=OutputCommand)


def _completer(flag: Flag) -> Any:
    """What completes a global option's value: plugin names for --plugin; else click's default."""
    if flag.dest != "plugin":
        return None

    return complete_plugin


def global_options(fn: F) -> F:
    """The group's value options, from the table the fast path reads too."""
    for flag in reversed(GLOBAL_VALUE_OPTIONS):
        if flag.dest == "output":
            option = click.option(
                *flag.names,
                type=click.Choice(OUTPUTS),
                default="text",
                envvar="NETPLUGIN_OUTPUT",
                show_default=True,
                help=flag.help,
            )
        else:
            option = click.option(
                *flag.names, flag.dest, metavar=flag.metavar, help=flag.help, shell_complete=_completer(flag)
            )
        fn = option(fn)
    return fn


def pod_arguments(fn: F) -> F:
    """NAMESPACE POD INFRA_ID, completed from the recorded pods."""
    for name, complete in (("infra_id", complete_infra_id), ("pod", complete_pod), ("namespace", complete_namespace)):
        fn = click.argument(name, shell_complete=complete)(fn)
    return fn


def cni_bin_dirs(fn: F) -> F:
    """``--cni-bin-dir`` (repeatable), as ``bin_dirs``: where the runtime finds CNI plugins (doctor, version)."""
    return click.option(
        "--cni-bin-dir",
        "bin_dirs",
        metavar="DIR",
        multiple=True,
        help="Where the runtime finds CNI plugins (repeatable) [/opt/cni/bin, /usr/lib/cni].",
    )(fn)
