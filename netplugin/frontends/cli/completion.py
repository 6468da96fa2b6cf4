"""Shell completion of what only this node knows: plugin names (the built-ins and the exec dir)
and pods (namespaces, names and infra ids from the state dir's records).

Completion runs before any command: the settings are read here from what the command line gave
before the word being completed (and the environment, and the config file). Anything unreadable
completes nothing rather than failing the shell.
"""

from __future__ import annotations

from typing import Any

import click
from click.shell_completion import CompletionItem, get_completion_class

from netplugin.core.config import Config, load_config
from netplugin.core.errors import NetpluginError
from netplugin.manager.manager import Manager
from netplugin.store.state import StateStore

__all__ = [
    "COMPLETE_VAR",
    "complete_infra_id",
    "complete_namespace",
    "complete_plugin",
    "complete_pod",
    "completion_script",
]

#: click's shell-completion variable: ``_NETPLUGIN_COMPLETE=bash_source netplugin`` prints the hook
COMPLETE_VAR = "_NETPLUGIN_COMPLETE"


def completion_script(group: click.Group, shell: str) -> str:
    """The hook for ``shell`` (bash, zsh, fish): source it, or install it as the shell's completion file
    (for example ``netplugin completion bash > /etc/bash_completion.d/netplugin``)."""
    comp_cls = get_completion_class(shell)
    if comp_cls is None:
        raise click.BadParameter(f"no completion for {shell!r}", param_hint="SHELL")
    return comp_cls(group, {}, "netplugin", COMPLETE_VAR).source()


def _config(ctx: click.Context) -> Config | None:
    given = ctx.find_root().params
    overrides = {k: given.get(k) for k in ("plugin_dir", "state_dir", "run_dir")}
    try:
        return load_config(given.get("config_path"), overrides=overrides)
    except NetpluginError:
        return None


def _matching(words: Any, incomplete: str) -> list[CompletionItem]:
    return [CompletionItem(w) for w in sorted(set(words)) if w.startswith(incomplete)]


def complete_plugin(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """The valid plugins: the built-ins and the exec dir's."""
    cfg = _config(ctx)
    if cfg is None:
        return []
    try:
        names = [c.name for c in Manager(cfg, state=False).candidates() if c.valid]
    except (NetpluginError, OSError):
        return []
    return _matching(names, incomplete)


def _records(ctx: click.Context) -> list[Any]:
    cfg = _config(ctx)
    if cfg is None:
        return []
    try:
        return list(StateStore(cfg.state_dir).scan().records)
    except (NetpluginError, OSError):
        return []


def complete_namespace(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """The namespaces of the recorded pods."""
    return _matching((r.ref.namespace for r in _records(ctx)), incomplete)


def complete_pod(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """The recorded pods' names, in the namespace already given."""
    ns = ctx.params.get("namespace")
    return _matching((r.ref.name for r in _records(ctx) if ns in (None, r.ref.namespace)), incomplete)


def complete_infra_id(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """The infra id recorded for the pod already given."""
    ns, pod = ctx.params.get("namespace"), ctx.params.get("pod")
    ids = (r.ref.infra_id for r in _records(ctx) if (r.ref.namespace, r.ref.name) == (ns, pod))
    return _matching(ids, incomplete)
