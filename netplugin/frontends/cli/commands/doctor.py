"""``netplugin doctor``: does this node work as installed? (Its checks, as data: :mod:`netplugin.frontends.checks`.)"""

from __future__ import annotations

import json
from typing import Any

import click

from netplugin.core.errors import ConfigError
from netplugin.frontends.checks import Check, run_checks
from netplugin.frontends.cli.context import State, pass_state
from netplugin.frontends.cli.options import cni_bin_dirs, command
from netplugin.frontends.cni.installed import CNI_BIN_DIRS
from netplugin.frontends.wire.codes import EXIT_DOCTOR_PROBLEMS, EXIT_OK

__all__ = ["doctor"]

_DEFAULT_CONF_DIR = "/etc/cni/net.d"


def _line(check: dict[str, Any]) -> str:
    if check["ok"]:
        return f"ok       {check['name']:<9} {check['found']}"
    text = f"problem  {check['name']:<9} {check['problem']}"
    if check["found"]:
        text += f" [{check['found']}]"
    if check["fix"]:
        text += f"\n         {'':<9} fix: {check['fix']}"
    return text


@command()
@click.option(
    "--cni-conf-dir",
    metavar="DIR",
    default=_DEFAULT_CONF_DIR,
    show_default=True,
    help="The container runtime's CNI conf dir.",
)
@cni_bin_dirs
@pass_state
def doctor(st: State, cni_conf_dir: str, bin_dirs: tuple[str, ...]) -> None:
    """Check that this node works as installed, one line per check with the fix of each problem.

    Checks the CNI conflist the runtime picks, the shim, whether calls reach the daemon (and why
    not), the settings (conflist vs config file vs daemon), the plugin and its init, the node's
    pod CIDRs and routes, the egress table, and the state and run dirs. The config is the global
    --config (default /etc/netplugin/netplugin.yaml). Exit status: 0 every check passed,
    7 at least one problem (a daemon that does not answer is one), 2 bad usage.

    \b
    Examples:
      netplugin doctor
      netplugin doctor --config /etc/netplugin/netplugin.yaml
      netplugin doctor -o json
    """
    try:
        checks = run_checks(st.config, cni_conf_dir, bin_dirs or CNI_BIN_DIRS)
    except ConfigError as e:
        checks = [Check("config", st.config_path or "the default config file", e.message, "fix the config file")]
    docs = [c.to_dict() for c in checks]
    ok = all(c.ok for c in checks)
    if st.json:
        click.echo(json.dumps({"ok": ok, "checks": docs}, sort_keys=True))
    else:
        for d in docs:
            click.echo(_line(d))
    raise click.exceptions.Exit(EXIT_OK if ok else EXIT_DOCTOR_PROBLEMS)
