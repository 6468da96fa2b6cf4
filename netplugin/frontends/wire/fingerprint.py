"""Same settings? The settings that decide what an operation does (:func:`fingerprint`), compared by the daemon.

A request made under settings that differ from the daemon's (:func:`differing_settings`) is refused
with DaemonUnavailable, so the caller does the work itself with its own settings.
"""

# No `from __future__ import annotations`: it loads the __future__ module on every call (a fast path).

__all__ = ["differing_settings", "fingerprint"]

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from netplugin.core.config import Config


# Settings that do not change what an operation does, so caller and daemon may differ in them.
_NOT_BEHAVIOUR = frozenset({"config_path", "socket", "metrics_address", "use_daemon", "timeout", "timeouts"})


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
