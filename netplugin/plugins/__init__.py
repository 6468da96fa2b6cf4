"""Built-in plugins: in-process implementations of the plugin contract, and their registry.

The contract (``docs/plugin-contract.md``; its types: :mod:`netplugin.core.plugin`) knows no
implementation; this package registers each built-in explicitly in :data:`BUILTINS`, which the
manager consults before the exec dir. Implementations are imported only when selected: the native
bridge pulls in pyroute2 for its init, which must stay off every other path.
"""

from __future__ import annotations

# Imports inside this module's functions are kept for the per-call import set
# (tests/frontends/fastpath.py): each keeps a module off the calls that do not need it
# (BENCHMARKS.md rows B-i and B: the CLI's cold start and per-pod run without a daemon).
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from netplugin.core.errors import ConfigError, NetpluginError
from netplugin.core.names import validate_plugin_name
from netplugin.core.plugin import NOOP_NAME, Plugin, PluginFactory
from netplugin.plugins.noop import NoopPlugin

if TYPE_CHECKING:
    from netplugin.core.config import Config

__all__ = ["BRIDGE_NAME", "BUILTINS", "SETTINGS_CHECKS", "check_builtin_settings", "register_builtin"]

BRIDGE_NAME = "netplugin.io/bridge"

#: Built-in plugins by name; looked up before the exec dir.
BUILTINS: dict[str, PluginFactory] = {}

#: (config, the environment its calls get) -> None: a built-in's settings read as its ``init`` reads
#: them, raising what ``init`` would raise for them; touches nothing (no kernel, no file written)
SettingsCheck = Callable[["Config", Mapping[str, str]], None]
#: each built-in's settings check, by name (a built-in without settings has none)
SETTINGS_CHECKS: dict[str, SettingsCheck] = {}


def register_builtin(name: str, factory: PluginFactory, *, check: SettingsCheck | None = None) -> None:
    """Add an in-process plugin under ``name`` (a qualified name), with its settings check. Names are unique."""
    validate_plugin_name(name)
    if name in BUILTINS:
        raise ValueError(f"built-in plugin {name!r} is already registered")
    BUILTINS[name] = factory
    if check is not None:
        SETTINGS_CHECKS[name] = check


def check_builtin_settings(config: Config, chain: Iterable[str], env: Mapping[str, str]) -> None:
    """Every built-in member's settings in ``env`` checked as its ``init`` will read them: a bad one
    is a ConfigError of the ``env`` key whose reason names the variable (the reload and ``netplugin
    config check`` refuse it before any init runs)."""
    for name in chain:
        check = SETTINGS_CHECKS.get(name)
        if check is None:
            continue
        try:
            check(config, env)
        except ConfigError:
            raise
        except NetpluginError as e:
            raise ConfigError("env", f"{name}: {e.message}", source=config.config_path) from None


def _native_bridge(config: Config) -> Plugin:
    # Imported only when selected: pyroute2 must stay off every other path.
    from netplugin.plugins.bridge.bridge_plugin import NativeBridgePlugin

    plugin: Plugin = NativeBridgePlugin.from_config(config)
    return plugin


register_builtin(NOOP_NAME, lambda config: NoopPlugin())


def _bridge_settings(config: Config, env: Mapping[str, str]) -> None:
    from netplugin.plugins.bridge.bridge_plugin import NativeBridgePlugin

    # The node's pod CIDRs (SUBNET=node) are the node's, known at init: not required here.
    NativeBridgePlugin.from_config(config).settings(env, config.state_dir, subnets_optional=True)


def _hostport_settings(config: Config, env: Mapping[str, str]) -> None:
    from netplugin.core.hostports import localhost_enabled

    localhost_enabled(env)


def _hostport(config: Config) -> Plugin:
    from netplugin.plugins.hostport import HostPortPlugin

    plugin: Plugin = HostPortPlugin()
    return plugin


register_builtin(BRIDGE_NAME, _native_bridge, check=_bridge_settings)
register_builtin("netplugin.io/hostport", _hostport, check=_hostport_settings)
