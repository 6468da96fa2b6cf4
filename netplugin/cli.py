"""The ``netplugin`` command line: a thin layer over the library.

This is the only module that turns errors into exit codes and text. Data goes
to stdout, messages to stderr. Imports are lazy: a ``setup`` with an exec plugin
loads click and netplugin's small modules, nothing heavy.

Exit codes (stable, documented in the README):

====  ==================================================================
0     success
1     the plugin failed (non-zero exit, signal, bad status output)
2     bad input or usage: an argument, an option or the config is wrong
3     the plugin was not found or is invalid (permissions, not executable)
4     the plugin timed out (its process tree was killed)
5     a system error: exec dir unreadable, lock, state, host lookup, I/O
6     the daemon was required (``use_daemon: always``) but did not answer
70    an internal error (a bug: please report it, run with -v for details)
130   interrupted (Ctrl-C)
====  ==================================================================
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any, NoReturn

import click

if TYPE_CHECKING:
    from .config import Config
    from .errors import NetpluginError
    from .manager import Manager
    from .names import PodRef

__all__ = ["EXIT_CODES", "cli", "exit_code_for", "main"]

EXIT_OK = 0
EXIT_PLUGIN_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_TIMEOUT = 4
EXIT_SYSTEM = 5
EXIT_DAEMON = 6
EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130

#: error class name -> exit code; subclasses are matched through the MRO
EXIT_CODES = {
    "PluginTimeout": EXIT_TIMEOUT,
    "PluginError": EXIT_PLUGIN_FAILED,
    "InvalidArgument": EXIT_USAGE,
    "ConfigError": EXIT_USAGE,
    "PluginNotFound": EXIT_NOT_FOUND,
    "PluginInvalid": EXIT_NOT_FOUND,
    "DaemonUnavailable": EXIT_DAEMON,
    "NetpluginError": EXIT_SYSTEM,
}


def exit_code_for(err: NetpluginError) -> int:
    for cls in type(err).__mro__:
        if cls.__name__ in EXIT_CODES:
            return EXIT_CODES[cls.__name__]
    return EXIT_SYSTEM


class State:
    """What the global options decided, and the objects built from them (lazily)."""

    def __init__(self, overrides: dict[str, Any], config_path: str | None, output: str, verbose: int) -> None:
        self.overrides = overrides
        self.config_path = config_path
        self.output = output
        self.verbose = verbose
        self._config: Config | None = None
        self._manager: Manager | None = None

    @property
    def json(self) -> bool:
        return self.output == "json"

    @property
    def config(self) -> Config:
        if self._config is None:
            from .config import load_config

            self._config = load_config(self.config_path, overrides=self.overrides)
        return self._config

    @property
    def manager(self) -> Manager:
        if self._manager is None:
            from .manager import Manager

            self._manager = Manager(self.config)
        return self._manager

    def emit(self, data: Any, text: str | None) -> None:
        """Print data: JSON in json mode, else ``text`` (nothing when None)."""
        if self.json:
            click.echo(json.dumps(data, indent=None, sort_keys=True))
        elif text is not None:
            click.echo(text)


pass_state = click.make_pass_decorator(State)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--plugin-dir", metavar="DIR", help="Exec plugin dir [NETPLUGIN_PLUGIN_DIR].")
@click.option("--plugin", metavar="NAME", help="Plugin to use; none selects kubernetes.io/no-op [NETPLUGIN_PLUGIN].")
@click.option("--state-dir", metavar="DIR", help="Durable state [NETPLUGIN_STATE_DIR; /var/lib/netplugin].")
@click.option("--run-dir", metavar="DIR", help="Locks, markers, socket [NETPLUGIN_RUN_DIR; /run/netplugin].")
@click.option("--config", "config_path", metavar="FILE", help="Config file [NETPLUGIN_CONFIG].")
@click.option("--timeout", metavar="SECONDS", help="Time limit for every action [NETPLUGIN_TIMEOUT].")
@click.option(
    "-o", "--output", type=click.Choice(["text", "json"]), default="text", envvar="NETPLUGIN_OUTPUT",
    show_default=True, help="Output format [NETPLUGIN_OUTPUT].",
)
@click.option("-v", "--verbose", count=True, envvar="NETPLUGIN_VERBOSE", help="More detail on stderr.")
@click.version_option(package_name="netplugin", message="netplugin %(version)s")
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
    verbose: int,
) -> None:
    """Manage kubelet exec network plugins on this node."""
    overrides = {
        "plugin_dir": plugin_dir,
        "plugin": plugin,
        "state_dir": state_dir,
        "run_dir": run_dir,
        "timeout": timeout,
    }
    ctx.obj = State(overrides, config_path, output, verbose)
    if verbose:
        import logging

        logging.basicConfig(level=logging.DEBUG if verbose > 1 else logging.INFO, stream=sys.stderr,
                            format="netplugin: %(levelname)s: %(message)s")


def _pod(namespace: str, pod: str, infra_id: str) -> PodRef:
    from .names import PodRef

    return PodRef(namespace, pod, infra_id)


_POD_ARGS = [
    click.argument("namespace"),
    click.argument("pod"),
    click.argument("infra_id"),
]


def pod_command(fn: Any) -> Any:
    for arg in reversed(_POD_ARGS):
        fn = arg(fn)
    return fn


@cli.command()
@pass_state
def plugins(st: State) -> None:
    """List every plugin candidate, valid or not."""
    cands = st.manager.candidates()
    if st.json:
        st.emit([c.to_dict() for c in cands], None)
        return
    for c in cands:
        mark = "ok" if c.valid else "INVALID"
        line = f"{c.name}\t{mark}\t{c.path}"
        if c.problem:
            line += f"\t{c.problem}"
        click.echo(line)


@cli.command()
@click.option("--force", is_flag=True, help="Run init even if it already ran this boot.")
@pass_state
def init(st: State, force: bool) -> None:
    """Run the plugin's init (once per boot and plugin version, unless --force)."""
    ran = st.manager.init(force=force)
    plugin = st.manager.plugin
    st.emit({"plugin": plugin.name, "ran": ran}, None)
    if st.verbose:
        click.echo(f"init {'ran' if ran else 'already done'} for {plugin.name}", err=True)


@cli.command()
@pod_command
@pass_state
def setup(st: State, namespace: str, pod: str, infra_id: str) -> None:
    """Set up the network of a pod."""
    ref = _pod(namespace, pod, infra_id)
    status = st.manager.setup(ref)
    st.emit({"namespace": namespace, "pod": pod, "infra_id": infra_id, "ip": status.ip if status else None}, None)


@cli.command()
@pod_command
@pass_state
def teardown(st: State, namespace: str, pod: str, infra_id: str) -> None:
    """Tear down the network of a pod (idempotent)."""
    ref = _pod(namespace, pod, infra_id)
    st.manager.teardown(ref)
    st.emit({"namespace": namespace, "pod": pod, "infra_id": infra_id}, None)


@cli.command()
@pod_command
@pass_state
def status(st: State, namespace: str, pod: str, infra_id: str) -> None:
    """Print the pod's IP (text) or its PodNetworkStatus (json); nothing if unknown."""
    ref = _pod(namespace, pod, infra_id)
    result = st.manager.status(ref)
    if st.json:
        st.emit(result.to_dict() if result else None, None)
    elif result is not None:
        click.echo(result.ip)


@cli.command()
@click.option("--pods", "count", type=click.IntRange(1, 200), default=3, show_default=True, help="How many pods.")
@click.option("--native", is_flag=True, help="Use the in-process netplugin.io/bridge plugin instead of the exec one.")
@click.option("--plugin-source", metavar="DIR", help="Where the shipped exec plugins are (default: found).")
@click.option("--subnet", metavar="CIDR", help="Pod subnet (default: a random /24 in 10.207.0.0/16).")
@pass_state
def demo(st: State, count: int, native: bool, plugin_source: str | None, subnet: str | None) -> None:
    """Set up pods on a real bridge, prove they talk, tear down, prove nothing is left (root)."""
    import signal

    from .demo import run_demo

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    say = (lambda msg: click.echo(msg, err=True)) if st.json else click.echo
    report = run_demo(
        count,
        plugin="netplugin.io/bridge" if native else "bridge",
        plugin_source=plugin_source,
        subnet=subnet,
        progress=say,
    )
    st.emit(report.to_dict(), None)
    if not report.ok:
        from .errors import NetpluginError

        raise NetpluginError("demo failed: " + "; ".join(
            [f"{a} -> {b} unreachable" for a, b, ok in report.checks if not ok] + report.leftovers))


def _fail(message: str, code: int, st: State | None, data: dict[str, Any] | None = None) -> NoReturn:
    if st is not None and st.json and data is not None:
        click.echo(json.dumps(data, default=str, sort_keys=True), err=True)
    else:
        click.echo(f"netplugin: error: {message}", err=True)
    sys.exit(code)


def main(argv: list[str] | None = None) -> NoReturn:
    """Entry point: run the CLI, turning every error into a message and an exit code."""
    from .errors import NetpluginError

    ctx: click.Context | None = None

    def state() -> State | None:
        return ctx.obj if ctx is not None and isinstance(ctx.obj, State) else None

    try:
        ctx = cli.make_context("netplugin", list(sys.argv[1:] if argv is None else argv))
        with ctx:
            cli.invoke(ctx)
        sys.exit(EXIT_OK)
    except NetpluginError as e:
        st = state()
        _fail(e.message, exit_code_for(e), st, {"exit_code": exit_code_for(e), **e.to_dict()})
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.ClickException as e:
        e.show()
        sys.exit(EXIT_USAGE if e.exit_code == 2 else e.exit_code)
    except (KeyboardInterrupt, click.Abort):
        click.echo("netplugin: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except BrokenPipeError:
        sys.exit(EXIT_OK)
    except Exception as e:  # noqa: BLE001 - the one place a bug becomes a message, not a traceback
        st = state()
        if st is not None and st.verbose:
            import traceback

            traceback.print_exc()
        _fail(f"internal error: {type(e).__name__}: {e} (run with -v for details)", EXIT_INTERNAL, st,
              {"error": "InternalError", "message": str(e), "exit_code": EXIT_INTERNAL})


if __name__ == "__main__":
    main()
