"""The plugin commands: ``plugins`` (every candidate, valid or not) and ``init``."""

from __future__ import annotations

import os

import click

from netplugin.core.texttable import text_table
from netplugin.frontends.cli.context import LOCAL, State, pass_state
from netplugin.frontends.cli.options import command
from netplugin.frontends.wire.protocol import init_result

__all__ = ["init", "missing_dir_warning", "plugins"]


def missing_dir_warning(plugin_dir: str) -> str | None:
    """The warning ``plugins`` prints when the exec dir does not exist (it lists the built-ins only)."""
    if os.path.lexists(plugin_dir):
        return None
    return f"netplugin: warning: exec plugin dir {plugin_dir} does not exist; only built-in plugins"


@command()
@pass_state
def plugins(st: State) -> None:
    """List every plugin candidate in the exec dir, and the built-ins, valid or not.

    \b
    Examples:
      netplugin plugins
      netplugin plugins -o wide      # every problem in full
      netplugin plugins -o yaml
    """
    cands = st.daemon("plugins")
    if cands is LOCAL:
        cands = [c.to_dict() for c in st.manager.candidates()]
    if (warning := missing_dir_warning(st.config.plugin_dir)) is not None:
        click.echo(warning, err=True)

    # text: the problem's first line; wide: all of it
    rows = [(c["name"], "ok" if c["valid"] else "INVALID", c["path"], c["problem"] or "-") for c in cands]
    short = [(*r[:3], r[3].splitlines()[0] if r[3] else "-") for r in rows]
    header = ("NAME", "STATUS", "PATH", "PROBLEM")
    st.emit(cands, text_table(header, short), wide=text_table(header, rows))


@command()
@click.option("--force", is_flag=True, help="Run init even if it already ran this boot.")
@pass_state
def init(st: State, force: bool) -> None:
    """Run the plugin's init, once per boot and plugin version unless --force is given.

    \b
    Examples:
      netplugin init
      netplugin init --force -v
    """
    result = st.daemon("init", force=force or None)
    if result is LOCAL:
        result = init_result(st.manager.chain_names, st.manager.init_members(force=force))
    st.emit(result, None)
    if st.verbose:
        click.echo(f"init {'ran' if result['ran'] else 'already done'} for {result['plugin']}", err=True)
