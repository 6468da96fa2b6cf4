"""How each config key's raw value is read and checked, and which environment variable sets which key.

A raw value comes from YAML, an environment variable or a flag, so it may be a string where a
number is meant (``"30"``, ``"yes"``); each parser takes any of those spellings and returns the
typed value or raises ValueError with the reason, which :mod:`netplugin.core.config` words with
the key's name and the value's source.
"""

from __future__ import annotations

# Imports inside this module's functions are kept for the per-call import set
# (tests/frontends/fastpath.py): each keeps a module off the calls that do not need it
# (BENCHMARKS.md rows B-i and B: the CLI's cold start and per-pod run without a daemon).
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from netplugin.core.defaults import ACTIONS, DEFAULT_TIMEOUTS
from netplugin.core.errors import short_repr

__all__ = [
    "ENV_VARS",
    "HOST_KINDS",
    "LOG_FORMATS",
    "LOG_LEVELS",
    "MAX_CHAIN", "MAX_SECONDS", "MIN_SECONDS", "PARSERS", "USE_DAEMON"]

HOST_KINDS = ("static", "none", "kube")
USE_DAEMON = ("auto", "never", "always")
#: ``log_level`` values, most verbose first
LOG_LEVELS = ("debug", "info", "warning", "error")
#: ``log_format`` values
LOG_FORMATS = ("text", "json")


def _str(v: Any) -> str:
    if not isinstance(v, str) or not v:
        raise ValueError("must be a non-empty string")
    return v


def _opt_str(v: Any) -> str | None:
    if v is None or v == "":
        return None
    return _str(v)


def _path(v: Any) -> str:
    s = _str(v)
    if "\0" in s:
        raise ValueError("must not contain NUL")
    return s


def _opt_path(v: Any) -> str | None:
    return None if v is None or v == "" else _path(v)


# Numbers in text (environment, flags, YAML strings): ASCII only. float() and int() also take
# other scripts' digits ("٣"), "1_000", "nan" and "infinity", which no one means as a setting.
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z", re.ASCII)
_INTEGER = re.compile(r"[0-9]+\Z", re.ASCII)
#: The shortest time limit: below a millisecond no plugin can even start (and 1e-320 is no setting).
MIN_SECONDS = 0.001
MAX_SECONDS = 86400.0


def _non_ascii_number(text: str) -> str:
    """What to add to "must be a number" when Python alone would have read ``text`` as one."""
    try:
        float(text)
    except ValueError:
        return ""
    return " written in ASCII digits"


def _seconds(v: Any) -> float:
    if isinstance(v, str):
        v = v.strip()
        if not _DECIMAL.match(v):
            raise ValueError("must be a number of seconds" + _non_ascii_number(v))
    elif isinstance(v, bool) or not isinstance(v, int | float):
        raise ValueError("must be a number of seconds")
    try:
        f = float(v)
    except (OverflowError, ValueError):
        raise ValueError("must be a number of seconds") from None
    if not math.isfinite(f) or f <= 0:
        raise ValueError("must be a positive, finite number of seconds")
    if f < MIN_SECONDS:
        raise ValueError(f"must be at least {MIN_SECONDS} seconds")
    if f > MAX_SECONDS:
        raise ValueError(f"must be at most {MAX_SECONDS:.0f} seconds")
    return f


def _opt_seconds(v: Any) -> float | None:
    return None if v is None or v == "" else _seconds(v)


def _nonneg_seconds(v: Any) -> float:
    if v == 0 or v == "0":
        return 0.0
    return _seconds(v)


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in _TRUE | _FALSE:
        return v.lower() in _TRUE
    raise ValueError("must be true or false")


def _size(v: Any) -> int:
    if isinstance(v, str) and not _INTEGER.match(v.strip()):
        raise ValueError("must be a number of bytes" + _non_ascii_number(v))
    if isinstance(v, bool) or not isinstance(v, int | str):
        raise ValueError("must be a number of bytes")
    n = int(v)
    if n < 4096 or n > 1 << 30:
        raise ValueError("must be between 4096 and 1073741824 bytes")
    return n


def _choice(options: tuple[str, ...]) -> Callable[[Any], str]:
    def parse(v: Any) -> str:
        if v not in options:
            raise ValueError(f"must be one of {', '.join(options)}")
        return str(v)

    return parse


def _plugin(v: Any) -> str | None:
    if v is None or v == "":
        return None
    from netplugin.core.names import plugin_name_problem

    s = _str(v)
    problem = plugin_name_problem(s)
    if problem:
        raise ValueError(f"is not a valid plugin name: {problem}")
    return s


#: The longest chain: each member costs at least a process per action on the pod-start path.
MAX_CHAIN = 16


def _plugins(v: Any) -> tuple[str, ...]:
    """A chain: a YAML list of plugin names, or a comma-separated string (environment, flag)."""
    from netplugin.core.names import plugin_name_problem

    if v is None or v == "" or v == []:
        return ()
    items = [s.strip() for s in v.split(",")] if isinstance(v, str) else v
    if not isinstance(items, list | tuple):
        raise ValueError("must be a list of plugin names, or a comma-separated string")
    if len(items) > MAX_CHAIN:
        raise ValueError(f"has {len(items)} members, at most {MAX_CHAIN} are allowed")
    bad: list[str] = []
    for i, item in enumerate(items):
        if not isinstance(item, str) or not item:
            bad.append(f"member {i + 1} {short_repr(item)}: must be a non-empty string")
        elif problem := plugin_name_problem(item):
            bad.append(f"member {i + 1} {short_repr(item)}: {problem}")
        elif item in items[:i]:
            bad.append(f"member {i + 1} {short_repr(item)}: listed twice (a plugin is a member at most once)")
    if bad:
        raise ValueError("is not a valid chain: " + "; ".join(bad))
    return tuple(items)


def _netns_template(v: Any) -> str:
    """Checked by parsing its fields only: formatting it would run any width it names ({x:>999999999})."""
    import string

    s = _path(v)
    try:
        fields = [f for _, *f in string.Formatter().parse(s) if f[0] is not None]
    except ValueError as e:
        raise ValueError(f"must be a format string whose only field is {{infra_id}} ({e})") from None
    for name, spec, conversion in fields:
        if name != "infra_id" or spec or conversion:
            text = "{" + str(name) + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
            raise ValueError(
                f"must be a format string whose only field is {{infra_id}}, with no conversion or format "
                f"spec (found {short_repr(text)}; write a literal brace as {{{{ or }}}})"
            )
    return s


def _cidrs(v: Any) -> tuple[str, ...]:
    """A YAML list or a comma-separated string of networks, each given exactly (no host bits)."""
    import ipaddress

    if v is None:
        return ()
    items = (v.split(",") if v.strip() else []) if isinstance(v, str) else v
    if not isinstance(items, list | tuple):
        raise ValueError("must be a list of networks like 10.244.0.0/16, or a comma-separated string")
    out: list[str] = []
    for item in items:
        if not isinstance(item, str) or not item.strip():
            raise ValueError(f"{item!r} is not a network in CIDR form")
        try:
            out.append(str(ipaddress.ip_network(item.strip(), strict=True)))
        except ValueError as e:
            raise ValueError(f"{item.strip()!r} is not a network in CIDR form ({e})") from None
    return tuple(out)


def _timeouts(v: Any) -> dict[str, float]:
    if not isinstance(v, Mapping):
        raise ValueError("must be a mapping of action to seconds")
    out = dict(DEFAULT_TIMEOUTS)
    for k, sec in v.items():
        if k not in ACTIONS:
            raise ValueError(f"unknown action {k!r} (known: {', '.join(ACTIONS)})")
        try:
            out[k] = _seconds(sec)
        except ValueError as e:
            raise ValueError(f"{k}: {e}") from None
    return out


def _env(v: Any) -> dict[str, str]:
    if not isinstance(v, Mapping):
        raise ValueError("must be a mapping of variable name to string value")
    out: dict[str, str] = {}
    for k, val in v.items():
        if not isinstance(k, str) or not k or "=" in k or "\0" in k:
            raise ValueError(f"bad variable name {k!r}")
        if isinstance(val, bool) or not isinstance(val, str | int | float):
            raise ValueError(f"{k}: value must be a string")
        sval = str(val)
        if "\0" in sval:
            raise ValueError(f"{k}: value must not contain NUL")
        out[k] = sval
    return out


def _node_name(v: Any) -> str | None:
    if v is None or v == "":
        return None
    from netplugin.core.names import node_name_problem

    problem = node_name_problem(_str(v))
    if problem:
        raise ValueError(f"must be a node name: {problem}")
    return str(v)


def _address(v: Any) -> str:
    if v is None or v is False or (isinstance(v, str) and v.lower() in ("", "none", "off")):
        return "none"  # metrics disabled (YAML reads a bare `off` as False)
    s = _str(v)
    host, sep, port = s.rpartition(":")
    if not sep or not host or not _INTEGER.match(port) or not 0 <= int(port) <= 65535:
        raise ValueError("must be HOST:PORT, or none to disable")
    return s


PARSERS: dict[str, Callable[[Any], Any]] = {
    "plugin_dir": _path,
    "plugin": _plugin,
    "plugins": _plugins,
    "state_dir": _path,
    "run_dir": _path,
    "timeout": _opt_seconds,
    "timeouts": _timeouts,
    "kill_grace": _nonneg_seconds,
    "netns_template": _netns_template,
    "inherit_env": _bool,
    "env": _env,
    "check_permissions": _bool,
    "rollback_on_failure": _bool,
    "record_status": _bool,
    "cluster_cidrs": _cidrs,
    "max_output": _size,
    "host": _choice(HOST_KINDS),
    "pods_dir": _path,
    "kubeconfig": _opt_path,
    "kube_timeout": _seconds,
    "socket": _opt_path,
    "metrics_address": _address,
    "use_daemon": _choice(USE_DAEMON),
    "node_name": _node_name,
    "nodes_dir": _path,
    "node_routes": _bool,
    "node_resync": _seconds,
    "log_level": _choice(LOG_LEVELS),
    "log_format": _choice(LOG_FORMATS),
    "gc_interval": _nonneg_seconds,
}

#: Environment variables and the keys they set. Mappings (timeouts, env) are file-only.
ENV_VARS: dict[str, str] = {
    "NETPLUGIN_PLUGIN_DIR": "plugin_dir",
    "NETPLUGIN_PLUGIN": "plugin",
    "NETPLUGIN_PLUGINS": "plugins",
    "NETPLUGIN_STATE_DIR": "state_dir",
    "NETPLUGIN_RUN_DIR": "run_dir",
    "NETPLUGIN_TIMEOUT": "timeout",
    "NETPLUGIN_KILL_GRACE": "kill_grace",
    "NETPLUGIN_NETNS_TEMPLATE": "netns_template",
    "NETPLUGIN_INHERIT_ENV": "inherit_env",
    "NETPLUGIN_CHECK_PERMISSIONS": "check_permissions",
    "NETPLUGIN_ROLLBACK": "rollback_on_failure",
    "NETPLUGIN_RECORD_STATUS": "record_status",
    "NETPLUGIN_CLUSTER_CIDRS": "cluster_cidrs",
    "NETPLUGIN_HOST": "host",
    "NETPLUGIN_PODS_DIR": "pods_dir",
    "NETPLUGIN_KUBECONFIG": "kubeconfig",
    "NETPLUGIN_SOCKET": "socket",
    "NETPLUGIN_METRICS_ADDRESS": "metrics_address",
    "NETPLUGIN_USE_DAEMON": "use_daemon",
    # NODE_NAME (the Downward API's usual name) is read where the name is resolved, not here:
    # it is not netplugin's variable, and the node name from the config file must win over it.
    "NETPLUGIN_NODES_DIR": "nodes_dir",
    "NETPLUGIN_LOG_LEVEL": "log_level",
    "NETPLUGIN_LOG_FORMAT": "log_format",
    "NETPLUGIN_GC_INTERVAL": "gc_interval",
}
