"""Built-in plugins: in-process implementations of the plugin contract, and their registry.

The contract (:mod:`netplugin.core.plugin`) knows no implementation; this package registers
each built-in explicitly in :data:`BUILTINS`, which the manager consults before the exec dir.
Implementations are imported only when selected: the native bridge pulls in pyroute2 for its
init, which must stay off every other path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from netplugin.core.names import validate_plugin_name
from netplugin.core.plugin import NOOP_NAME, Plugin, PluginFactory
from netplugin.plugins.noop import NoopPlugin

if TYPE_CHECKING:
    from netplugin.core.config import Config

__all__ = ["BRIDGE_NAME", "BUILTINS", "register_builtin"]

BRIDGE_NAME = "netplugin.io/bridge"

#: Built-in plugins by name; looked up before the exec dir.
BUILTINS: dict[str, PluginFactory] = {}


def register_builtin(name: str, factory: PluginFactory) -> None:
    """Add an in-process plugin under ``name`` (a qualified name). Names are unique."""
    validate_plugin_name(name)
    if name in BUILTINS:
        raise ValueError(f"built-in plugin {name!r} is already registered")
    BUILTINS[name] = factory


def _native_bridge(config: Config) -> Plugin:
    # Imported only when selected: pyroute2 must stay off every other path.
    from netplugin.plugins.bridge.bridge_plugin import NativeBridgePlugin

    plugin: Plugin = NativeBridgePlugin.from_config(config)
    return plugin


register_builtin(NOOP_NAME, lambda config: NoopPlugin())
register_builtin(BRIDGE_NAME, _native_bridge)
