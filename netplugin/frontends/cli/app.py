"""The ``netplugin`` click group, its lazy registry of command modules, and :func:`main`:

In detail: ``ARCHITECTURE.md``, "Module notes".
the one place where errors become exit codes and text.

Data goes to stdout, messages to stderr. A command's module is imported only when that
command runs (or ``--help`` lists them), so a ``setup`` loads click, :mod:`.commands.pods` and
netplugin's small modules, nothing heavy.
"""

from __future__ import annotations

import importlib
import json
import os
import platform
import sys
import traceback
from typing import Any, NoReturn

import click

from netplugin import __version__
from netplugin.core.errors import NetpluginError
from netplugin.core.extras import MissingExtra, extra_for
from netplugin.frontends.cli.completion import COMPLETE_VAR
from netplugin.frontends.cli.context import State
from netplugin.frontends.cli.options import configure_logging, global_options
from netplugin.frontends.wire.codes import (
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_SYSTEM,
    EXIT_USAGE,
    exit_code_for,
)

__all__ = ["COMMANDS", "cli", "json_wanted", "main", "usage_error_doc"]

#: command name -> the module (in this package) that defines it, named by its job
COMMANDS = {
    "setup": "pods",
    "teardown": "pods",
    "status": "pods",
    "pods": "recorded",
    "gc": "recorded",
    "plugins": "plugins",
    "init": "plugins",
    "serve": "service",
    "health": "service",
    "nodes": "nodes",
    "demo": "demos",
    "bench": "tools",
    "install-shim": "tools",
    "completion": "tools",
    "doctor": "doctor",
    "version": "version",
    "config": "configcheck",
}


class LazyGroup(click.Group):
    """The commands of :data:`COMMANDS`, each imported when first asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = COMMANDS.get(cmd_name)
        if module is None:
            return None
        commands = importlib.import_module(f"netplugin.frontends.cli.commands.{module}")
        found = getattr(commands, cmd_name.replace("-", "_"))
        assert isinstance(found, click.Command)
        return found


def version_info() -> tuple[dict[str, str], str]:
    """``--version``: the JSON document and the text line."""
    return {"version": __version__, "python": platform.python_version()}, f"netplugin {__version__}"


@click.group(
    cls=LazyGroup,
    invoke_without_command=True,
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@global_options
@click.option("-v", "--verbose", count=True, envvar="NETPLUGIN_VERBOSE", help="More detail on stderr.")
@click.option("--version", is_flag=True, help="Print the version (JSON with -o json) and exit.")
@click.pass_context
def cli(
    ctx: click.Context,
    plugin_dir: str | None,
    plugin: str | None,
    state_dir: str | None,
    run_dir: str | None,
    config_path: str | None,
    timeout: str | None,
    output: str,
    log_level: str | None,
    log_format: str | None,
    verbose: int,
    version: bool,
) -> None:
    """Manage kubelet exec network plugins on this node.

    \b
    Examples:
      netplugin doctor                          # is this node set up right?
      netplugin plugins                         # the plugins it can run
      netplugin setup default web-0 4f2a9c      # what the kubelet does at pod start
      netplugin pods -o wide
      netplugin version -o yaml
    """
    overrides = {
        "plugin_dir": plugin_dir,
        "plugin": plugin,
        "state_dir": state_dir,
        "run_dir": run_dir,
        "timeout": timeout,
        "log_level": log_level,
        "log_format": log_format,
    }
    ctx.obj = st = State(overrides, config_path, output, verbose)
    if version:
        st.emit(*version_info())
        ctx.exit(EXIT_OK)
    if ctx.invoked_subcommand is None:
        raise click.UsageError("Missing command.", ctx)
    if verbose or log_level or log_format:
        configure_logging(verbose, log_level, log_format)


# --- errors -> exit codes and text (here only) ------------------------------------------------------


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


def _fail(message: str, code: int, st: State | None, data: dict[str, Any] | None = None) -> NoReturn:
    if st is not None and st.json and data is not None:
        click.echo(json.dumps(data, default=str, sort_keys=True), err=True)
    else:
        click.echo(f"netplugin: error: {message}", err=True)
    sys.exit(code)


def main(argv: list[str] | None = None) -> NoReturn:
    """Entry point: run the CLI, turning every error into a message and an exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if COMPLETE_VAR in os.environ:
        # Shell completion (`netplugin completion SHELL` prints the hook that sets this): click's own
        # main answers it and exits.
        cli.main(args, prog_name="netplugin", complete_var=COMPLETE_VAR)
    ctx: click.Context | None = None

    def state() -> State | None:
        return ctx.obj if ctx is not None and isinstance(ctx.obj, State) else None

    try:
        ctx = cli.make_context("netplugin", list(args))  # click consumes the list it is given
        with ctx:
            cli.invoke(ctx)
        sys.exit(EXIT_OK)
    except NetpluginError as e:
        _fail(e.message, exit_code_for(e), state(), {"exit_code": exit_code_for(e), **e.to_dict()})
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.ClickException as e:
        code = EXIT_USAGE if e.exit_code == 2 else e.exit_code
        if (st.json if (st := state()) is not None else False) or json_wanted(args):
            click.echo(json.dumps(usage_error_doc(e, code)), err=True)
        else:
            e.show()
        sys.exit(code)
    except (KeyboardInterrupt, click.Abort):
        click.echo("netplugin: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except BrokenPipeError:
        sys.exit(EXIT_OK)
    except Exception as e:
        st = state()
        missing = missing_extra(e, ctx.invoked_subcommand if ctx is not None else None)
        if missing is not None:
            _fail(missing.message, EXIT_SYSTEM, st, {"exit_code": EXIT_SYSTEM, **missing.to_dict()})
        if st is not None and st.verbose:
            traceback.print_exc()
        _fail(
            f"internal error: {type(e).__name__}: {e} (run with -v for details)",
            EXIT_INTERNAL,
            st,
            {"error": "InternalError", "message": str(e), "exit_code": EXIT_INTERNAL},
        )
