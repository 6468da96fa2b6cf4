"""Whether a config can be served, checked whole before anything takes it.

The daemon's reload and ``netplugin config check`` ask the same question the same way: the
settings parse (a ConfigError names its key), the chain they name is selected (each member
found in the exec dir and trusted: owner, mode, name), and each built-in member's own settings
(``NETPLUGIN_BRIDGE_*``, ``NETPLUGIN_HOSTPORT_LOCALHOST``) are read as its ``init`` reads them.
The daemon also runs each member's ``init`` where its version or settings changed, before it
swaps; a check from the command line runs nothing. What is wrong comes back as a
:class:`Refusal`: the key to fix and the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from netplugin.core.errors import ConfigError, NetpluginError, PluginInvalid, PluginNotFound
from netplugin.core.execplugin.environ import base_env
from netplugin.manager.manager import Manager
from netplugin.plugins import check_builtin_settings

if TYPE_CHECKING:
    from netplugin.core.config import Config
    from netplugin.hosts.base import Host
    from netplugin.manager.reporting import Hooks

__all__ = ["Refusal", "checked_manager", "refusal_of"]


@dataclass(frozen=True)
class Refusal:
    """Why a config cannot be served: the key that names the problem, and the reason."""

    key: str
    reason: str

    def text(self) -> str:
        return f"{self.key}: {self.reason}"


def _chain_key(config: Config | None) -> str:
    return "plugins" if config is not None and config.plugins else "plugin"


def refusal_of(err: NetpluginError, config: Config | None) -> Refusal:
    """The key and reason of ``err``, met while building or checking ``config`` (None: not built)."""
    if isinstance(err, ConfigError):
        return Refusal(err.key, err.reason)
    if isinstance(err, PluginNotFound | PluginInvalid):
        return Refusal(_chain_key(config), err.message)
    return Refusal(_chain_key(config), f"init failed: {err.message}")


def checked_manager(
    config: Config, *, host: Host | None = None, init: bool = False, hooks: Hooks | None = None
) -> Manager:
    """A manager of ``config`` (telling ``hooks`` of its work) whose chain is selected (each member
    found and trusted) and, with ``init``, initialised where needed. Raises the NetpluginError that
    makes ``config`` unservable."""
    manager = Manager(config, host=host, hooks=hooks)
    _ = manager.plugins
    check_builtin_settings(config, manager.chain_names, base_env(config))
    if init:
        manager.init()
    return manager
