"""Requests from callers that send their raw settings: the CNI shim (op ``cni``) and the CLI's fast path.

Neither caller builds a Config (that would cost it yaml and netplugin's config code on every
call), so the daemon builds it from what they send, with the same code and precedence they
would have used, and serves the request only when that config's fingerprint equals its own and
its ``use_daemon`` is not ``never``. Otherwise it raises DaemonUnavailable before doing anything,
and the caller does the work itself. A bad setting is the same ConfigError the caller would
have met alone. The config file they name is taken as the daemon read it at its last successful
(re)load when it is the daemon's own file: an edit on disk takes effect when the daemon takes it
(SIGHUP), not call by call; another file is read as it is.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from netplugin.core._yaml import short_repr
from netplugin.core.config import Config, FileSnapshot, file_identity, load_config
from netplugin.core.defaults import DEFAULT_CONFIG
from netplugin.core.errors import DaemonUnavailable, InvalidArgument
from netplugin.frontends.cni.operations import DaemonSide, Refused, run
from netplugin.frontends.cni.spec import LATEST, CniError
from netplugin.frontends.daemon.reconfig import ServedSettings
from netplugin.frontends.wire.codes import CNI_INVALID_ENV
from netplugin.frontends.wire.fingerprint import BuiltSettings, differing_settings

__all__ = ["check_settings", "environ_problem", "run_cni", "run_cni_call"]

#: what a process environment can carry as a name (a key with "=" or NUL cannot be passed on)
_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _str_map(value: Any, what: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise InvalidArgument(what, type(value).__name__, "must be an object of strings")
    return dict(value)


def check_settings(settings: Any, live: ServedSettings, socket_path: str) -> Config:
    """The caller's config from its raw ``settings``; DaemonUnavailable unless it is the daemon's."""
    if not isinstance(settings, dict):
        raise InvalidArgument("settings", type(settings).__name__, "must be an object")
    path = settings.get("config_path")
    if path is not None and not isinstance(path, str):
        raise InvalidArgument("settings.config_path", path, "must be a string")
    environ = _str_map(settings.get("environ", {}), "settings.environ")
    overrides = _str_map(settings.get("overrides", {}), "settings.overrides")
    cfg, print_ = _config_of(path or None, environ, overrides, live.snapshot)
    if cfg.use_daemon == "never":
        raise DaemonUnavailable(socket_path, "the caller's settings say use_daemon: never")
    differ = differing_settings(live.fingerprint, print_)
    if differ:
        raise DaemonUnavailable(socket_path, f"it runs with different settings ({', '.join(differ)})")
    return cfg


#: the configs built from callers' raw settings (the CLI's fast path sends them with every request,
#: a shim's call its network config): they rarely differ
BUILT = BuiltSettings()


def _config_of(
    path: str | None, environ: dict[str, str], overrides: dict[str, str], snapshot: FileSnapshot | None
) -> tuple[Config, dict[str, Any]]:
    """:func:`load_config` of these settings and its fingerprint, built once per distinct settings.

    The key holds the daemon's snapshot when it is of this file, else the file's identity (inode,
    size, mtime, ctime) as ``load_config`` would find it, so an edited or replaced file is read
    again. Errors are never cached."""

    file_path = path or environ.get("NETPLUGIN_CONFIG") or DEFAULT_CONFIG
    identity = file_identity(file_path, snapshot)
    key = ("cli", path, file_path, identity, tuple(sorted(environ.items())), tuple(sorted(overrides.items())))
    return BUILT.get(key, lambda: load_config(path, environ=environ, overrides=overrides, snapshot=snapshot))


def environ_problem(environ: Mapping[str, str]) -> str | None:
    """Why a forwarded call's environment cannot be a process's, or None."""
    for key, value in environ.items():
        if not _VAR_NAME.fullmatch(key):
            return f"environ key {short_repr(key)} is not a variable name ([A-Za-z_][A-Za-z0-9_]*)"
        if "\0" in value:
            return f"environ {key} contains NUL"
    return None


def run_cni(
    req: dict[str, Any], live: ServedSettings, socket_path: str, timed: Callable[[str, Callable[[], Any]], Any]
) -> dict[str, Any]:
    """Op ``cni``: one CNI call of the shim, run here; ``{"code": exit status, "doc": document}``."""
    environ = _str_map(req.get("environ"), "environ")
    stdin = req.get("stdin")
    if not isinstance(stdin, str):
        raise InvalidArgument("stdin", type(stdin).__name__, "must be a string")
    code, doc = run_cni_call(environ, stdin.encode(), live, socket_path, timed)
    return {"code": code, "doc": doc}


def run_cni_call(
    environ: dict[str, str],
    stdin: bytes,
    live: ServedSettings,
    socket_path: str,
    timed: Callable[[str, Callable[[], Any]], Any],
) -> tuple[int, dict[str, Any] | None]:
    """One CNI call (Python shim's op ``cni`` or the compiled shim's frame): (exit status, document).

    DaemonUnavailable, before anything ran, when the call's settings are not the daemon's.
    """
    problem = environ_problem(environ)
    if problem is not None:  # CNI error 4 before anything runs, as a bad CNI_* variable

        return 1, CniError(CNI_INVALID_ENV, problem).to_dict(LATEST)

    try:
        return run(environ, stdin, daemon=DaemonSide(live.manager, live.fingerprint, timed, BUILT, live.snapshot))
    except Refused as e:
        raise DaemonUnavailable(socket_path, str(e)) from None
