"""Init once: each chain member's ``init`` runs once per boot, per version and per settings.

A marker under the run dir (``init/<plugin>.json``, written under a file lock beside it) says
which boot, version and settings the init ran for and which pod actions it declared; every
netplugin process on the node reads it before a member's first other action. A marker that is
missing, torn, planted (a symbolic link) or from another boot, version or settings means: run
init again (it must be idempotent). :class:`netplugin.manager.manager.Manager` holds an
:class:`InitOnce`, built with its config and the call context of an init; it names the members and the node.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from netplugin.core.chaining import ALL_POD_ACTIONS, MASK_NAMES
from netplugin.core.dirs import ensure_dir
from netplugin.core.errors import NetpluginError
from netplugin.core.fileio import atomic_write, read_small
from netplugin.core.names import escape_plugin_name
from netplugin.core.procs import boot_id
from netplugin.store.locks import flocked

if TYPE_CHECKING:
    from netplugin.core.config import Config
    from netplugin.core.node import NodeInfo
    from netplugin.core.plugin import CallContext, Plugin

__all__ = ["InitOnce"]


def _version_identity(plugin: Plugin) -> tuple[Any, ...]:
    """What changes when the plugin's code does: its ``version_key()`` (a stat) if any, else ``version()``."""
    key = plugin.version_key()
    return ("key", *key) if key is not None else ("version", plugin.version())


class InitOnce:
    """Runs chain members' inits once; keeps each member's action mask (from its init or its marker).

    Built with the config (its run dir and env) and ``context(node)``, the call context of an init.
    """

    def __init__(self, config: Config, context: Callable[[NodeInfo], CallContext]) -> None:
        self.config = config
        self._context = context
        #: each member's action mask, from its init (run, or its marker read)
        self._handles: dict[str, frozenset[str]] = {}
        #: member -> (settings, version identity) whose init is known done this boot (no marker read per action)
        self._init_known: dict[str, tuple[Any, ...]] = {}

    def handles(self, name: str) -> frozenset[str]:
        """The pod actions member ``name`` handles: all, unless its init declared fewer."""
        return self._handles.get(name, ALL_POD_ACTIONS)

    def forget(self) -> None:
        """Check every init again, marker and all (the chain was selected again)."""
        self._init_known.clear()

    def _marker_path(self, plugin: Plugin) -> str:
        return os.path.join(self.config.run_dir, "init", escape_plugin_name(plugin.name) + ".json")

    def _settings(self, node: NodeInfo) -> dict[str, str]:
        """What init prepares for: the config's env and the node (its pod CIDRs may set a bridge's address)."""
        return {**self.config.env, **node.env()}

    def _marker_ok(self, path: str, boot: str, plugin: Plugin, node: NodeInfo) -> bool:
        try:
            marker = json.loads(read_small(path))  # O_NOFOLLOW: a planted link is no marker
        except FileNotFoundError:
            return False
        except (NetpluginError, ValueError):
            return False  # unreadable or torn marker: run init again, which must be idempotent anyway
        if not isinstance(marker, dict) or marker.get("boot_id") != boot:
            return False
        if marker.get("settings") != self._settings(node):
            return False  # init prepares for these settings (a bridge name, a subnet): new ones, new init
        handles = marker.get("actions", sorted(ALL_POD_ACTIONS))
        if not isinstance(handles, list) or not set(handles) <= MASK_NAMES:
            return False
        key = plugin.version_key()
        unchanged = key is not None and marker.get("version_key") == list(key)  # no hashing needed
        if not unchanged and marker.get("version") != plugin.version():
            return False
        self._handles[plugin.name] = frozenset(handles)
        return True

    def done(self, plugin: Plugin, node: NodeInfo) -> bool:
        """Whether ``plugin``'s init already ran this boot for its version and these settings (nothing runs)."""
        return self._marker_ok(self._marker_path(plugin), boot_id(), plugin, node)

    def run(self, plugin: Plugin, node: NodeInfo, *, force: bool = False) -> bool:
        """Run one plugin's init unless it already ran this boot for this version. True if it ran."""
        known = (self._settings(node), _version_identity(plugin))
        if not force and self._init_known.get(plugin.name) == known:
            return False  # this process saw it done this boot, for these settings and this version
        path = self._marker_path(plugin)
        boot = boot_id()
        # Before the marker is read: a symlinked or foreign init/ must not vouch for an init.
        ensure_dir(os.path.dirname(path), base=self.config.run_dir)
        if not force and self._marker_ok(path, boot, plugin, node):
            self._init_known[plugin.name] = known
            return False
        with flocked(path[: -len(".json")] + ".lock", base=self.config.run_dir):
            if not force and self._marker_ok(path, boot, plugin, node):
                self._init_known[plugin.name] = known
                return False  # another process ran it while we waited
            declared = plugin.init(self._context(node))
            handles = ALL_POD_ACTIONS if declared is None else frozenset(declared)
            self._handles[plugin.name] = handles
            key = plugin.version_key()
            marker: dict[str, Any] = {
                "actions": sorted(handles),
                "plugin": plugin.name,
                "boot_id": boot,
                "version": plugin.version(),
                "version_key": list(key) if key is not None else None,
                "settings": self._settings(node),
                "time": time.time(),
                "pid": os.getpid(),
            }
            atomic_write(path, json.dumps(marker).encode(), mode=0o644)
            self._init_known[plugin.name] = known
        return True
