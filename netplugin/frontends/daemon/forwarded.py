"""Requests from callers that send their raw settings: the CNI shim (op ``cni``) and the CLI's fast path.

Neither caller builds a Config (that would cost it yaml and netplugin's config code on every
call), so the daemon builds it from what they send, with the same code and precedence they
would have used, and serves the request only when that config's fingerprint equals its own and
its ``use_daemon`` is not ``never``. Otherwise it raises DaemonUnavailable before doing anything,
and the caller does the work itself. A bad setting is the same ConfigError the caller would
have met alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from netplugin.core.config import Config, load_config
from netplugin.core.errors import DaemonUnavailable, InvalidArgument
from netplugin.frontends.rpc import differing_settings, fingerprint
from netplugin.manager.manager import Manager

__all__ = ["check_settings", "run_cni", "run_cni_call"]


def _str_map(value: Any, what: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise InvalidArgument(what, type(value).__name__, "must be an object of strings")
    return dict(value)


def check_settings(settings: Any, own: dict[str, Any], socket_path: str) -> Config:
    """The caller's config from its raw ``settings``; DaemonUnavailable unless it is the daemon's."""
    if not isinstance(settings, dict):
        raise InvalidArgument("settings", type(settings).__name__, "must be an object")
    path = settings.get("config_path")
    if path is not None and not isinstance(path, str):
        raise InvalidArgument("settings.config_path", path, "must be a string")
    environ = _str_map(settings.get("environ", {}), "settings.environ")
    overrides = _str_map(settings.get("overrides", {}), "settings.overrides")
    cfg = load_config(path or None, environ=environ, overrides=overrides)
    if cfg.use_daemon == "never":
        raise DaemonUnavailable(socket_path, "the caller's settings say use_daemon: never")
    differ = differing_settings(own, fingerprint(cfg))
    if differ:
        raise DaemonUnavailable(socket_path, f"it runs with different settings ({', '.join(differ)})")
    return cfg


def run_cni(
    req: dict[str, Any],
    manager: Manager,
    own: dict[str, Any],
    socket_path: str,
    timed: Callable[[str, Callable[[], Any]], Any],
) -> dict[str, Any]:
    """Op ``cni``: one CNI call of the shim, run here; ``{"code": exit status, "doc": document}``."""
    environ = _str_map(req.get("environ"), "environ")
    stdin = req.get("stdin")
    if not isinstance(stdin, str):
        raise InvalidArgument("stdin", type(stdin).__name__, "must be a string")
    code, doc = run_cni_call(environ, stdin.encode(), manager, own, socket_path, timed)
    return {"code": code, "doc": doc}


def run_cni_call(
    environ: dict[str, str],
    stdin: bytes,
    manager: Manager,
    own: dict[str, Any],
    socket_path: str,
    timed: Callable[[str, Callable[[], Any]], Any],
) -> tuple[int, dict[str, Any] | None]:
    """One CNI call (Python shim's op ``cni`` or the compiled shim's frame): (exit status, document).

    DaemonUnavailable, before anything ran, when the call's settings are not the daemon's.
    """
    from netplugin.frontends.cni.shim import DaemonSide, Refused, run

    try:
        return run(environ, stdin, daemon=DaemonSide(manager, own, timed))
    except Refused as e:
        raise DaemonUnavailable(socket_path, str(e)) from None
