"""Option helpers of the ``netplugin`` commands: the global options (from the package's table),
``-o`` after any command, the pod triple, ASCII-only integers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from netplugin.frontends.cli import GLOBAL_VALUE_OPTIONS, OUTPUTS

__all__ = ["AsciiIntRange", "OutputCommand", "command", "global_options", "pod_arguments"]

F = TypeVar("F", bound=Callable[..., Any])


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
    from netplugin.frontends.cli.context import State

    state = ctx.find_root().obj
    if value is not None and isinstance(state, State):
        state.output = value


class OutputCommand(click.Command):
    """A command that also takes ``-o/--output`` after its name (``netplugin pods -o json``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.params.insert(
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


def command(name: str | None = None) -> Callable[[Callable[..., Any]], OutputCommand]:
    """``click.command`` for every netplugin command (it takes ``-o`` too)."""
    return click.command(name, cls=OutputCommand)


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
            option = click.option(*flag.names, flag.dest, metavar=flag.metavar, help=flag.help)
        fn = option(fn)
    return fn


def pod_arguments(fn: F) -> F:
    """NAMESPACE POD INFRA_ID."""
    for name in ("infra_id", "pod", "namespace"):
        fn = click.argument(name)(fn)
    return fn
