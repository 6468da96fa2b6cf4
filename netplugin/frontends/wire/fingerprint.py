"""Same settings? The settings that decide what an operation does (:func:`fingerprint`), compared by the daemon.

A request made under settings that differ from the daemon's (:func:`differing_settings`) is refused
with DaemonUnavailable, so the caller does the work itself with its own settings. Callers that send
their raw settings (the CLI's fast path, the CNI shims) have their config built by the daemon, once
per distinct settings: :class:`BuiltSettings`.
"""

# No `from __future__ import annotations`: it loads the __future__ module on every call (a fast path).

# Imports inside this module's functions are kept for the per-call import set
# (tests/frontends/fastpath.py): each keeps a module off the calls that do not need it
# (BENCHMARKS.md rows H and Gpy: the CLI and the Python shim through the daemon).
from _thread import allocate_lock  # threading's Lock, without importing threading on the per-call path

__all__ = ["BuiltSettings", "differing_settings", "fingerprint"]

# Not typing's TYPE_CHECKING: importing typing would put the CLI's daemon path (and the Python shim's) over its target.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Hashable, Mapping
    from typing import Any

    from netplugin.core.config import Config


# Settings that do not change what an operation does, so caller and daemon may differ in them.
_NOT_BEHAVIOUR = frozenset(
    {
        "config_path",
        "socket",
        "metrics_address",
        "use_daemon",
        "timeout",
        "timeouts",
        "log_level",
        "log_format",
        "gc_interval",
    }
)


def fingerprint(config: "Config") -> "dict[str, Any]":
    """The settings that decide what an operation does, in JSON form (compared by the daemon)."""
    import json  # the callers that build a Config have paid for more than json already

    out: dict[str, Any] = {k: v for k, v in config.to_dict().items() if k not in _NOT_BEHAVIOUR}
    # The chain, however it was spelled: ``plugin: a`` and ``plugins: [a]`` are the same settings.
    del out["plugins"]
    out["plugin"] = ",".join(config.chain) or "kubernetes.io/no-op"
    # --timeout overrides the per-action limits: compare what each action really gets.
    out["timeouts"] = {a: config.timeout_for(a) for a in ("init", "setup", "teardown", "status")}
    normal: dict[str, Any] = json.loads(json.dumps(out, sort_keys=True, default=str))
    return normal


def differing_settings(mine: "Mapping[str, Any]", theirs: object) -> list[str]:
    """The fingerprint keys in which ``theirs`` differs from ``mine`` (empty: the same settings)."""
    if not isinstance(theirs, dict):
        return sorted(mine)
    return sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))


class BuiltSettings:
    """Callers' configs, each with its fingerprint, built once per distinct settings (the daemon's one
    answer to "same settings as mine?" for the calls that send their raw settings). Thread-safe.

    A key says what a config is built from (the config file's identity included, so an edited or
    replaced file is built again); the oldest of ``size`` entries goes first. Errors are never kept.
    """

    def __init__(self, size: int = 64) -> None:
        self._built: dict[Hashable, tuple[Config, dict[str, Any]]] = {}
        self._lock = allocate_lock()
        self._size = size

    def get(self, key: "Hashable", build: "Callable[[], Config]") -> "tuple[Config, dict[str, Any]]":
        """(the config ``build()`` makes, its fingerprint): built now, or as built before for ``key``."""
        with self._lock:
            hit = self._built.get(key)
        if hit is not None:
            return hit
        cfg = build()
        built = (cfg, fingerprint(cfg))
        with self._lock:
            if len(self._built) >= self._size:
                self._built.pop(next(iter(self._built)))  # the oldest
            self._built[key] = built
        return built
