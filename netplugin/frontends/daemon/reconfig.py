"""SIGHUP's settings half: what changed in the config file, and whether the daemon can take it live.

The daemon re-reads its config exactly as it was started (same file, environment and flags). Plugin
settings (the plugin, its dirs and env, time limits, permissions, rollback...) are checked whole
first (:mod:`netplugin.manager.check`: the file parses, each chain member is found and trusted, its
init ran where its version or settings changed); then a new manager serves every request, while
requests already running finish with the one they started with. A check that fails keeps the
running settings and manager, and ``health`` says "config on disk refused at <time>: <key>: <reason>"
until a reload is taken. What the daemon holds open or keeps running from the settings it started with
(its socket, its metrics listener, its host and its node watches, routes and egress) cannot be
swapped under it: a change there keeps the running settings whole, and the log and ``health`` say
which keys need ``systemctl restart netplugin``. Either way the daemon and a caller reading the file
never silently disagree: a caller whose settings are not the daemon's is told so (the keys differ)
and runs the call itself, or fails with CNI error 11 under ``use_daemon: always``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from netplugin.core.errors import NetpluginError
from netplugin.frontends.wire.fingerprint import fingerprint
from netplugin.manager.check import Refusal, checked_manager, refusal_of

if TYPE_CHECKING:
    from netplugin.core.config import Config, FileSnapshot
    from netplugin.manager.manager import Manager

__all__ = [
    "RESTART_KEYS",
    "Reconfig",
    "Refusal",
    "Reloaded",
    "Reread",
    "ServedSettings",
    "plan",
    "refused_text",
    "reload_settings",
]

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
        k for k in old.to_dict() if k != "config_path" and getattr(old, k) != getattr(new, k)
    )
    return Reconfig(changed, tuple(k for k in changed if k in RESTART_KEYS))


#: re-reads the daemon's settings as it was started: (the config, the file it was built from)
Reread = Callable[[], "tuple[Config, FileSnapshot | None]"]


@dataclass(frozen=True)
class ServedSettings:
    """The settings the daemon serves with and what was built from them, swapped whole on reload.

    ``snapshot`` is the config file as read for them: calls forwarded by a shim or the CLI build
    their settings on it, not on the file as it is now (None: they read the file)."""

    config: Config
    manager: Manager
    fingerprint: dict[str, Any]
    snapshot: FileSnapshot | None = None

    @classmethod
    def of(cls, config: Config, manager: Manager, snapshot: FileSnapshot | None = None) -> ServedSettings:
        return cls(config, manager, fingerprint(config), snapshot)


@dataclass(frozen=True)
class Reloaded:
    """What a reload did: what to serve with now, what to log, whether that is fine, and the
    refusal of the config on disk (None: it was taken, or needs only a restart)."""

    live: ServedSettings
    text: str
    ok: bool
    refused: Refusal | None = None


def _refused(live: ServedSettings, refusal: Refusal) -> Reloaded:
    return Reloaded(live, f"not reloaded: {refusal.text()}; the daemon keeps its running settings", False, refusal)


def reload_settings(live: ServedSettings, reread: Reread | None) -> Reloaded:
    """Re-read the file, then select and initialise its chain on a new manager; swap only when all
    of it worked. ``reread`` None: the settings as started, the exec dir scanned again. Never raises
    a NetpluginError: a failure keeps ``live`` whole and says which key and why."""
    new, snapshot = live.config, live.snapshot
    text = "settings unchanged"
    if reread is not None:
        try:
            new, read = reread()
        except NetpluginError as e:
            return _refused(live, refusal_of(e, None))
        change = plan(live.config, new)
        text = change.text()
        if change.restart:
            return Reloaded(live, text, False)
        if change.live:
            snapshot = read
        else:
            new = live.config
    try:
        # The host (and so the node watches) stays: its settings are among those that need a restart.
        # The daemon's per-member metrics and its log of pod actions go on (the hooks).
        manager = checked_manager(new, host=live.manager.host, init=True, hooks=live.manager.hooks)
    except NetpluginError as e:
        return _refused(live, refusal_of(e, new))
    return Reloaded(ServedSettings.of(new, manager, snapshot), text, True)


def refused_text(refusal: Refusal, at: float | None = None) -> str:
    """What ``health`` and ``doctor`` say of a refused reload (``at``: its wall time, default now)."""
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if at is None else at))
    return f"config on disk refused at {when}: {refusal.text()}"
