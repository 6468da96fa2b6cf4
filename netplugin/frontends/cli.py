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

from netplugin.frontends import _cliconv as conv
from netplugin.frontends import _clitools as tools
from netplugin.frontends._clidoctor import doctor
from netplugin.frontends.exitcodes import (
    EXIT_CODES,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_SYSTEM,
    EXIT_USAGE,
    exit_code_for_classes,
)

if TYPE_CHECKING:
    from netplugin.core.config import Config
    from netplugin.core.errors import NetpluginError
    from netplugin.core.names import PodRef
    from netplugin.manager.manager import Manager

__all__ = ["EXIT_CODES", "cli", "exit_code_for", "main"]

#: State.daemon()'s answer when the command must run in this process
LOCAL: Any = object()


def exit_code_for(err: NetpluginError) -> int:
    # An error the daemon reported in a class unknown here (RemoteError) carries its remote MRO.
    return exit_code_for_classes([*getattr(err, "remote_classes", ()), *(cls.__name__ for cls in type(err).__mro__)])


class State:
    """What the global options decided, and the objects built from them (lazily)."""

    #: what :meth:`daemon` returns when the operation must run here (no daemon, or not the same settings)
    LOCAL = LOCAL

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
            from netplugin.core.config import load_config

            self._config = load_config(self.config_path, overrides=self.overrides)
        return self._config

    @property
    def manager(self) -> Manager:
        if self._manager is None:
            from netplugin.manager.manager import Manager

            self._manager = Manager(self.config)
        return self._manager

    def daemon(self, op: str, **args: Any) -> Any:
        """The daemon's result for ``op``, or LOCAL when this process must do the work itself.

        ``use_daemon``: never -> LOCAL; auto -> the daemon when its socket answers (and it runs
        with our settings), else LOCAL; always -> the daemon or DaemonUnavailable (exit 6).
        Only the thin client is imported on this path: no manager, no plugin machinery.
        """
        import os

        cfg = self.config
        if cfg.use_daemon == "never" or (cfg.use_daemon == "auto" and not os.path.exists(cfg.socket_path)):
            return LOCAL
        from netplugin.core.errors import DaemonUnavailable
        from netplugin.frontends.client import request

        try:
            return request(cfg.socket_path, op, config=cfg, **args)
        except DaemonUnavailable as e:
            if cfg.use_daemon == "always":
                raise
            if self.verbose:
                click.echo(f"netplugin: {e.message}; working alone", err=True)
            return LOCAL

    def emit(self, data: Any, text: str | None) -> None:
        """Print data: JSON in json mode, else ``text`` (nothing when None)."""
        if self.json:
            click.echo(json.dumps(data, indent=None, sort_keys=True))
        elif text is not None:
            click.echo(text)


pass_state = click.make_pass_decorator(State)


@click.group(
    cls=conv.OutputOptionGroup,
    invoke_without_command=True,
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.option("--plugin-dir", metavar="DIR", help="Exec plugin dir [NETPLUGIN_PLUGIN_DIR].")
@click.option("--plugin", metavar="NAME", help="Plugin to use; none selects kubernetes.io/no-op [NETPLUGIN_PLUGIN].")
@click.option("--state-dir", metavar="DIR", help="Durable state [NETPLUGIN_STATE_DIR; /var/lib/netplugin].")
@click.option("--run-dir", metavar="DIR", help="Locks, markers, socket [NETPLUGIN_RUN_DIR; /run/netplugin].")
@click.option("--config", "config_path", metavar="FILE", help="Config file [NETPLUGIN_CONFIG].")
@click.option("--timeout", metavar="SECONDS", help="Time limit for every action [NETPLUGIN_TIMEOUT].")
@click.option(
    "-o",
    "--output",
    type=click.Choice(conv.OUTPUTS),
    default="text",
    envvar="NETPLUGIN_OUTPUT",
    show_default=True,
    help="Output format [NETPLUGIN_OUTPUT].",
)
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
    verbose: int,
    version: bool,
) -> None:
    """Manage kubelet exec network plugins on this node."""
    overrides = {
        "plugin_dir": plugin_dir,
        "plugin": plugin,
        "state_dir": state_dir,
        "run_dir": run_dir,
        "timeout": timeout,
    }
    ctx.obj = st = State(overrides, config_path, output, verbose)
    if version:
        st.emit(*conv.version_info())
        ctx.exit(EXIT_OK)
    if ctx.invoked_subcommand is None:
        raise click.UsageError("Missing command.", ctx)
    if verbose:
        import logging

        logging.basicConfig(
            level=logging.DEBUG if verbose > 1 else logging.INFO,
            stream=sys.stderr,
            format="netplugin: %(levelname)s: %(message)s",
        )


def _pod(namespace: str, pod: str, infra_id: str) -> PodRef:
    from netplugin.core.names import PodRef

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
    cands = st.daemon("plugins")
    if cands is LOCAL:
        cands = [c.to_dict() for c in st.manager.candidates()]
    if (warning := conv.missing_dir_warning(st.config.plugin_dir)) is not None:
        click.echo(warning, err=True)
    if st.json:
        st.emit(cands, None)
        return
    for c in cands:
        mark = "ok" if c["valid"] else "INVALID"
        line = f"{c['name']}\t{mark}\t{c['path']}"
        if c["problem"]:
            line += f"\t{c['problem']}"
        click.echo(line)


@cli.command()
@click.option("--force", is_flag=True, help="Run init even if it already ran this boot.")
@pass_state
def init(st: State, force: bool) -> None:
    """Run the plugin's init (once per boot and plugin version, unless --force)."""
    result = st.daemon("init", force=force or None)
    if result is LOCAL:
        ran = st.manager.init(force=force)
        result = {"plugin": st.manager.plugin.name, "ran": ran}
    st.emit(result, None)
    if st.verbose:
        click.echo(f"init {'ran' if result['ran'] else 'already done'} for {result['plugin']}", err=True)


@cli.command()
@pod_command
@pass_state
def setup(st: State, namespace: str, pod: str, infra_id: str) -> None:
    """Set up the network of a pod."""
    ref = _pod(namespace, pod, infra_id)
    result = st.daemon("setup", namespace=namespace, pod=pod, infra_id=infra_id)
    if result is LOCAL:
        status = st.manager.setup(ref)
        result = {"ip": status.ip if status else None}
    st.emit({"namespace": namespace, "pod": pod, "infra_id": infra_id, "ip": result["ip"]}, None)


@cli.command()
@pod_command
@pass_state
def teardown(st: State, namespace: str, pod: str, infra_id: str) -> None:
    """Tear down the network of a pod (idempotent)."""
    ref = _pod(namespace, pod, infra_id)
    if st.daemon("teardown", namespace=namespace, pod=pod, infra_id=infra_id) is LOCAL:
        st.manager.teardown(ref)
    st.emit({"namespace": namespace, "pod": pod, "infra_id": infra_id}, None)


@cli.command()
@pod_command
@pass_state
def status(st: State, namespace: str, pod: str, infra_id: str) -> None:
    """Print the pod's IP (text) or its PodNetworkStatus (json); nothing if unknown."""
    ref = _pod(namespace, pod, infra_id)
    result = st.daemon("status", namespace=namespace, pod=pod, infra_id=infra_id)
    if result is LOCAL:
        local = st.manager.status(ref)
        result = local.to_dict() if local is not None else None
    if st.json:
        st.emit(result, None)
    elif result is not None:
        click.echo(result["ip"])


@cli.command()
@pass_state
def pods(st: State) -> None:
    """List the pods netplugin has recorded, and their state."""
    remote = st.daemon("pods")
    if remote is not LOCAL:
        st.emit(remote["listing"], remote["table"])
        for c in remote["listing"]["corrupt"]:
            click.echo(
                f"netplugin: warning: corrupt pod record {c['path']}: {c['reason']} (`netplugin gc` sets it aside)",
                err=True,
            )
        return
    from netplugin.store.listing import list_pods

    listing = list_pods(st.config.state_dir, st.config.run_dir)
    if st.json:
        st.emit(listing.to_dict(), None)
    elif listing.rows:
        click.echo(listing.table())
    for c in listing.corrupt:
        click.echo(
            f"netplugin: warning: corrupt pod record {c.path}: {c.reason} (`netplugin gc` sets it aside)", err=True
        )


@cli.command()
@click.option("--dry-run", is_flag=True, help="Only show what would be done.")
@click.option("--no-host-check", is_flag=True, help="Do not ask the host whether recorded pods still exist.")
@pass_state
def gc(st: State, dry_run: bool, no_host_check: bool) -> None:
    """Tear down recorded pods that are gone or whose setup/teardown was interrupted."""
    remote = st.daemon("gc", dry_run=dry_run or None, check_host=False if no_host_check else None)
    if remote is not LOCAL:
        st.emit(remote["report"], remote["text"])
        if remote["error"] is not None:
            from netplugin.core.errors import error_from_dict

            raise error_from_dict(remote["error"], remote["classes"])
        return
    from netplugin.manager.gc import GcIncomplete, run_gc

    report = run_gc(st.manager, dry_run=dry_run, check_host=not no_host_check)
    st.emit(report.to_dict(), report.text())
    if report.failed:
        raise GcIncomplete(report.failed)


@cli.command()
@click.option(
    "--socket", "socket_path", metavar="PATH", help="Unix socket to serve [NETPLUGIN_SOCKET; RUN_DIR/netplugin.sock]."
)
@click.option(
    "--metrics-address",
    metavar="HOST:PORT",
    help="Prometheus metrics address, port 0 for any, 'none' to disable [NETPLUGIN_METRICS_ADDRESS; 127.0.0.1:9465].",
)
@click.option("--config", "serve_config", metavar="FILE", help="The node's config file (as the global --config).")
@pass_state
def serve(st: State, socket_path: str | None, metrics_address: str | None, serve_config: str | None) -> None:
    """Run the daemon in the foreground (systemd: etc/systemd/netplugin.service).

    Other commands use it while its socket answers (see use_daemon). SIGHUP re-reads the
    config file (as it was started: same file, environment and flags) and rescans the
    plugins; SIGTERM finishes the operations in flight, then exits 0.
    """
    from netplugin.core.extras import require

    require("netplugin serve", "prometheus_client")
    if serve_config is not None:
        st.config_path = serve_config
    st.overrides.update(socket=socket_path, metrics_address=metrics_address)
    from netplugin.core.config import load_config
    from netplugin.frontends.daemon.server import serve as run_daemon

    overrides, path = dict(st.overrides), st.config_path
    raise click.exceptions.Exit(run_daemon(st.config, reread=lambda: load_config(path, overrides=overrides)))


for command in (tools.demo, tools.nodes, tools.bench, tools.install_shim, conv.health, conv.completion, doctor):
    cli.add_command(command)


def _fail(message: str, code: int, st: State | None, data: dict[str, Any] | None = None) -> NoReturn:
    if st is not None and st.json and data is not None:
        click.echo(json.dumps(data, default=str, sort_keys=True), err=True)
    else:
        click.echo(f"netplugin: error: {message}", err=True)
    sys.exit(code)


def main(argv: list[str] | None = None) -> NoReturn:
    """Entry point: run the CLI, turning every error into a message and an exit code."""
    import os

    from netplugin.core.errors import NetpluginError

    args = list(sys.argv[1:] if argv is None else argv)
    if conv.COMPLETE_VAR in os.environ:
        # Shell completion (`netplugin completion SHELL` prints the hook that sets this): click's own
        # main answers it and exits.
        cli.main(args, prog_name="netplugin", complete_var=conv.COMPLETE_VAR)
    ctx: click.Context | None = None

    def state() -> State | None:
        return ctx.obj if ctx is not None and isinstance(ctx.obj, State) else None

    try:
        ctx = cli.make_context("netplugin", list(args))  # click consumes the list it is given
        with ctx:
            cli.invoke(ctx)
        sys.exit(EXIT_OK)
    except NetpluginError as e:
        st = state()
        _fail(e.message, exit_code_for(e), st, {"exit_code": exit_code_for(e), **e.to_dict()})
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.ClickException as e:
        code = EXIT_USAGE if e.exit_code == 2 else e.exit_code
        if (st.json if (st := state()) is not None else False) or conv.json_wanted(args):
            click.echo(json.dumps(conv.usage_error_doc(e, code)), err=True)
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
        missing = conv.missing_extra(e, ctx.invoked_subcommand if ctx is not None else None)
        if missing is not None:
            _fail(missing.message, EXIT_SYSTEM, st, {"exit_code": EXIT_SYSTEM, **missing.to_dict()})
        if st is not None and st.verbose:
            import traceback

            traceback.print_exc()
        _fail(
            f"internal error: {type(e).__name__}: {e} (run with -v for details)",
            EXIT_INTERNAL,
            st,
            {"error": "InternalError", "message": str(e), "exit_code": EXIT_INTERNAL},
        )


if __name__ == "__main__":
    main()
