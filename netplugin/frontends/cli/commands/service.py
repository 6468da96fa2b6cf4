"""The daemon's commands: ``serve`` (run it) and ``health`` (the DaemonSet's probe)."""

from __future__ import annotations

import click

from netplugin.core.config import Config, FileSnapshot, load_config, snapshot_config
from netplugin.core.extras import require
from netplugin.frontends.cli.context import State, pass_state
from netplugin.frontends.cli.options import command
from netplugin.frontends.wire.client import request
from netplugin.frontends.wire.codes import EXIT_DOCTOR_PROBLEMS

__all__ = ["health", "serve"]


@command()
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
    """Run the daemon in the foreground, as the systemd unit netplugin.service does.

    Other commands use it while its socket answers (see use_daemon). SIGHUP re-reads the
    config file (as it was started: same file, environment and flags) and rescans the
    plugins; SIGTERM finishes the operations in flight, then exits 0.

    \b
    Examples:
      netplugin serve --config /etc/netplugin/netplugin.yaml
      netplugin serve --log-level debug --log-format json
    """
    require("netplugin serve", "prometheus_client")
    if serve_config is not None:
        st.config_path = serve_config
    st.overrides.update(socket=socket_path, metrics_address=metrics_address)
    if st.verbose > 1 and not st.overrides.get("log_level"):
        st.overrides["log_level"] = "debug"  # -vv, unless --log-level says otherwise
    # The daemon's own modules need the daemon extra (pyroute2): imported once require() has named it.
    from netplugin.frontends.daemon.server import serve as run_daemon

    overrides, path = dict(st.overrides), st.config_path

    def reread() -> tuple[Config, FileSnapshot]:
        # The file read once: the settings, and what the calls the daemon runs for others build on.
        snapshot = snapshot_config(path)
        return load_config(path, overrides=overrides, snapshot=snapshot), snapshot

    config, snapshot = reread()
    raise click.exceptions.Exit(run_daemon(config, reread=reread, snapshot=snapshot))


@command()
@click.option("--wait", type=click.FloatRange(0.1, 300), default=5.0, show_default=True, help="Seconds to wait.")
@pass_state
def health(st: State, wait: float) -> None:
    """Ask the daemon whether it serves: exit 0 if it does, 6 when nobody answers (a stale socket too).

    Exit 7 when it serves but refused the config on disk at its last reload (it keeps its running
    settings), or when one of its keepers (the node keeper, the pod repairer, the gc keeper, the
    kernel watch) is not running or has not completed a pass within its interval.

    The DaemonSet's liveness and readiness probes run this.

    \b
    Examples:
      netplugin health
      netplugin health --wait 2 -o json
    """
    h = request(st.config.socket_path, "health", timeout=wait)
    stuck = f"; {len(h['stuck'])} plugin call(s) stuck past their time limits" if h.get("stuck") else ""
    refused = f"; {h['refused']}" if h.get("refused") else ""
    # A broken pod is reported, not a reason for the probe to restart the daemon (it cannot mend it).
    n = len((h.get("node") or {}).get("broken") or {})
    broken = f"; {n} pod(s) broken, their host interface gone (see netplugin doctor)" if n else ""
    keepers = "".join(f"; {p}" for p in h.get("keeper_problems") or [])
    up = f"serving: pid {h['pid']}, plugin {h['plugin'] or '-'}, up {h['uptime_seconds']:.0f} s"
    st.emit(h, f"{up}{stuck}{broken}{refused}{keepers}")
    if refused or keepers:
        raise click.exceptions.Exit(EXIT_DOCTOR_PROBLEMS)
