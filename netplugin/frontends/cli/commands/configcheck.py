"""``netplugin config check [FILE]``: would the daemon take this config? Asked without the daemon."""

from __future__ import annotations

import click

from netplugin.core.config import load_config
from netplugin.core.errors import NetpluginError
from netplugin.frontends.cli.context import State, pass_state
from netplugin.frontends.cli.options import GLOBAL_EPILOG, OutputCommand
from netplugin.frontends.wire.codes import exit_code_for
from netplugin.manager.check import checked_manager, refusal_of

__all__ = ["config"]


@click.group(epilog=GLOBAL_EPILOG)
def config() -> None:
    """Check a config file before it is taken.

    \b
    Examples:
      netplugin config check
      netplugin config check /etc/netplugin/netplugin.yaml
    """


@config.command("check", cls=OutputCommand)
@click.argument("file", required=False, metavar="[FILE]")
@pass_state
def check(st: State, file: str | None) -> None:
    """Validate a config file as the daemon's reload does, without the daemon.

    FILE defaults to the global --config, else /etc/netplugin/netplugin.yaml. Every key must parse,
    each plugin of the chain must be found in the exec dir and trusted, and each built-in member's
    settings (NETPLUGIN_BRIDGE_*, NETPLUGIN_HOSTPORT_LOCALHOST) must be what its init accepts. Runs
    no plugin and touches nothing. The environment and the global flags apply as they would to the daemon.

    Exit 0 when the daemon would take it; else the message names the key and the reason, with the
    usual code (2 bad config, 3 plugin not found or not trusted, 5 exec dir unreadable).

    \b
    Examples:
      netplugin config check
      netplugin config check ./netplugin.yaml -o json
    """
    path = file or st.config_path
    cfg = None
    try:
        cfg = load_config(path, overrides=st.overrides)
        chain = checked_manager(cfg).chain_names
    except NetpluginError as e:
        refusal = refusal_of(e, cfg)
        where = path or (cfg.config_path if cfg else None) or "the default config"
        doc = {"ok": False, "config_path": where, "key": refusal.key, "reason": refusal.reason}
        st.emit(doc, None)
        if not st.json:
            click.echo(f"netplugin: config {where} refused: {refusal.text()}", err=True)
        raise click.exceptions.Exit(exit_code_for(e)) from None
    where = cfg.config_path or "no config file (defaults)"
    st.emit(
        {"ok": True, "config_path": cfg.config_path, "chain": list(chain)},
        f"ok: {where}: chain {', '.join(chain)} (found and trusted in {cfg.plugin_dir})",
    )
