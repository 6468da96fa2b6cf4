"""The daemon's commands: ``serve`` (run it) and ``health`` (the DaemonSet's probe)."""

from __future__ import annotations

import click

from netplugin.frontends.cli.context import State, pass_state
from netplugin.frontends.cli.options import command

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


@command()
@click.option("--wait", type=click.FloatRange(0.1, 300), default=5.0, show_default=True, help="Seconds to wait.")
@pass_state
def health(st: State, wait: float) -> None:
    """Ask the daemon if it serves: exit 0, or 6 when nobody answers (a stale socket too).

    The DaemonSet's liveness and readiness probes run this."""
    from netplugin.frontends.wire.client import request

    h = request(st.config.socket_path, "health", timeout=wait)
    stuck = f"; {len(h['stuck'])} plugin call(s) stuck past their time limits" if h.get("stuck") else ""
    st.emit(h, f"serving: pid {h['pid']}, plugin {h['plugin'] or '-'}, up {h['uptime_seconds']:.0f} s{stuck}")
