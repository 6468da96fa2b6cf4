"""SIGHUP's settings half: what changed in the config file, and whether the daemon can take it live.

The daemon re-reads its config exactly as it was started (same file, environment and flags). Plugin
settings (the plugin, its dirs and env, time limits, permissions, rollback...) are taken at once: a
new manager serves every request from then on, while requests already running finish with the one
they started with. What the daemon holds open or keeps running from the settings it started with
(its socket, its metrics listener, its host and its node watches, routes and egress) cannot be
swapped under it: a change there keeps the running settings whole, and the log and ``health`` say
which keys need ``systemctl restart netplugin``. Either way the daemon and a caller reading the file
never silently disagree: a caller whose settings are not the daemon's is told so (the keys differ)
and runs the call itself, or fails with CNI error 11 under ``use_daemon: always``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from netplugin.core.errors import NetpluginError
from netplugin.core.plaindata import dataclass, fields
from netplugin.frontends.wire.fingerprint import fingerprint

if TYPE_CHECKING:
    from netplugin.core.config import Config
    from netplugin.manager.manager import Manager

__all__ = ["RESTART_KEYS", "Live", "Reconfig", "plan", "reload_settings"]

#: settings the running daemon cannot take live (its socket, listener, host and node machinery)
RESTART_KEYS = frozenset(
    {
        "run_dir",
        "socket",
        "metrics_address",
        "host",
        "pods_dir",
        "kubeconfig",
        "kube_timeout",
        "node_name",
        "nodes_dir",
        "node_routes",
        "node_resync",
        "cluster_cidrs",
    }
)


@dataclass(frozen=True)
class Reconfig:
    """What a reload found: the keys that changed, and those of them that need a restart."""

    changed: tuple[str, ...]
    restart: tuple[str, ...]

    @property
    def live(self) -> bool:
        """The new settings can be taken now (something changed, nothing that needs a restart)."""
        return bool(self.changed) and not self.restart

    def text(self) -> str:
        if not self.changed:
            return "settings unchanged"
        if self.restart:
            return (
                f"settings changed ({', '.join(self.changed)}), but {', '.join(self.restart)} cannot change "
                "while the daemon runs: it keeps its running settings; restart it (systemctl restart netplugin)"
            )
        return f"settings changed ({', '.join(self.changed)}): taken"


def plan(old: Config, new: Config) -> Reconfig:
    """Compare the running settings with the file's; ``config_path`` itself never differs."""
    changed = tuple(
        f.name for f in fields(old) if f.name != "config_path" and getattr(old, f.name) != getattr(new, f.name)
    )
    return Reconfig(changed, tuple(k for k in changed if k in RESTART_KEYS))


@dataclass(frozen=True)
class Live:
    """The settings the daemon serves with and what was built from them, swapped whole on reload."""

    config: Config
    manager: Manager
    fingerprint: dict[str, Any]

    @classmethod
    def of(cls, config: Config, manager: Manager) -> Live:
        return cls(config, manager, fingerprint(config))


def reload_settings(live: Live, reread: Callable[[], Config]) -> tuple[Live, str, bool]:
    """(what to serve with now, what happened, whether that is fine). Never raises a NetpluginError."""
    try:
        new = reread()
    except NetpluginError as e:
        return live, f"not reloaded: {e.message}; the daemon keeps its running settings", False
    change = plan(live.config, new)
    if not change.live:
        return live, change.text(), not change.restart
    from netplugin.manager.manager import Manager

    # The host (and so the node watches) stays: its settings are among those that need a restart.
    manager = Manager(new, host=live.manager.host)
    manager.observe = live.manager.observe  # the daemon's per-member metrics go on
    return Live.of(new, manager), change.text(), True
