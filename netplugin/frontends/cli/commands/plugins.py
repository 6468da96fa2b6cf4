"""The plugin commands: ``plugins`` (every candidate, valid or not) and ``init``."""

from __future__ import annotations

import os

import click

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
    """List every plugin candidate, valid or not."""
    cands = st.daemon("plugins")
    if cands is LOCAL:
        cands = [c.to_dict() for c in st.manager.candidates()]
    if (warning := missing_dir_warning(st.config.plugin_dir)) is not None:
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


@command()
@click.option("--force", is_flag=True, help="Run init even if it already ran this boot.")
@pass_state
def init(st: State, force: bool) -> None:
    """Run the plugin's init (once per boot and plugin version, unless --force)."""
    result = st.daemon("init", force=force or None)
    if result is LOCAL:
        result = init_result(st.manager.chain_names, st.manager.init_members(force=force))
    st.emit(result, None)
    if st.verbose:
        click.echo(f"init {'ran' if result['ran'] else 'already done'} for {result['plugin']}", err=True)
