"""Configuration: a YAML file, then environment variables, then command-line flags.

Precedence rises in that order. The file is ``/etc/netplugin/netplugin.yaml``
unless ``--config`` or ``NETPLUGIN_CONFIG`` names another; a missing *default*
file is fine (built-in defaults apply), a missing *explicit* file is an error.
Unknown keys and bad values are :class:`~netplugin.core.errors.ConfigError` naming
the key and where it came from. ``etc/netplugin.yaml`` is the commented example.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

from netplugin.core.defaults import (
    ACTIONS,
    DEFAULT_CONFIG,
    DEFAULT_KILL_GRACE,
    DEFAULT_MAX_OUTPUT,
    DEFAULT_NETNS_TEMPLATE,
    DEFAULT_NODES_DIR,
    DEFAULT_PLUGIN_DIR,
    DEFAULT_PODS_DIR,
    DEFAULT_RUN_DIR,
    DEFAULT_SOCKET,
    DEFAULT_STATE_DIR,
    DEFAULT_TIMEOUTS,
    socket_path,
)
from netplugin.core.errors import ConfigError
from netplugin.core.plaindata import dataclass, field, fields, replace

__all__ = [
    "ACTIONS",
    "DEFAULT_CONFIG",
    "DEFAULT_NODES_DIR",
    "DEFAULT_PLUGIN_DIR",
    "DEFAULT_PODS_DIR",
    "DEFAULT_RUN_DIR",
    "DEFAULT_SOCKET",
    "DEFAULT_STATE_DIR",
    "ENV_VARS",
    "Config",
    "load_config",
]

HOST_KINDS = ("static", "none", "kube")
USE_DAEMON = ("auto", "never", "always")


@dataclass(frozen=True)
class Config:
    """Every setting of netplugin, already validated. Build with :func:`load_config`."""

    plugin_dir: str = DEFAULT_PLUGIN_DIR
    plugin: str | None = None
    #: an ordered chain of plugins (``plugins: [a, b]``); empty: the chain of one ``plugin``
    plugins: tuple[str, ...] = ()
    state_dir: str = DEFAULT_STATE_DIR
    run_dir: str = DEFAULT_RUN_DIR
    config_path: str | None = None
    timeout: float | None = None
    timeouts: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_TIMEOUTS))
    kill_grace: float = DEFAULT_KILL_GRACE
    netns_template: str = DEFAULT_NETNS_TEMPLATE
    inherit_env: bool = True
    env: Mapping[str, str] = field(default_factory=dict)
    check_permissions: bool = True
    rollback_on_failure: bool = True
    record_status: bool = False
    #: the cluster's pod CIDRs (all nodes'): pod traffic to anywhere else is masqueraded (egress)
    cluster_cidrs: tuple[str, ...] = ()
    max_output: int = DEFAULT_MAX_OUTPUT
    host: str = "static"
    pods_dir: str = DEFAULT_PODS_DIR
    kubeconfig: str | None = None
    kube_timeout: float = 5.0
    socket: str | None = None
    metrics_address: str = "127.0.0.1:9465"
    use_daemon: str = "auto"
    # --- the node and its cluster (issue 11) ---
    #: this node's name; None: $NODE_NAME, else the hostname (see netplugin.core.node.node_name)
    node_name: str | None = None
    #: Node manifests for the static host (clusters without an API server)
    nodes_dir: str = DEFAULT_NODES_DIR
    #: the daemon keeps routes to the other nodes' pod CIDRs (host-gw)
    node_routes: bool = True
    #: how often the daemon re-checks those routes even when no Node changed
    node_resync: float = 30.0

    @property
    def chain(self) -> tuple[str, ...]:
        """The configured chain's member names in order; () when none is named (the no-op plugin)."""
        if self.plugins:
            return self.plugins
        return (self.plugin,) if self.plugin else ()

    def timeout_for(self, action: str) -> float:
        """The time limit of one action: ``--timeout`` when given, else the per-action setting."""
        if self.timeout is not None:
            return self.timeout
        return float(self.timeouts.get(action, DEFAULT_TIMEOUTS[action]))

    @property
    def socket_path(self) -> str:
        return socket_path(self.socket, self.run_dir)

    def netns_path(self, infra_id: str) -> str:
        return self.netns_template.format(infra_id=infra_id)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = dict(v) if isinstance(v, Mapping) else v
        return out


# --- value parsers: each returns the value or raises ValueError with the reason ---------------


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
            bad.append(f"member {i + 1} {_shown(item)}: must be a non-empty string")
        elif problem := plugin_name_problem(item):
            bad.append(f"member {i + 1} {_shown(item)}: {problem}")
        elif item in items[:i]:
            bad.append(f"member {i + 1} {_shown(item)}: listed twice (a plugin is a member at most once)")
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
                f"spec (found {_shown(text)}; write a literal brace as {{{{ or }}}})"
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


_PARSERS: dict[str, Callable[[Any], Any]] = {
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
}


def _shown(value: Any) -> str:
    """A value quoted in a message: repr, at most 80 characters, never fully expanded."""
    from netplugin.core._yaml import short_repr

    return short_repr(value)


#: ``plugin`` and ``plugins`` both say which chain runs: a source names one of them, and the one a
#: higher-precedence source names replaces the other (a ``--plugin`` flag beats the file's chain).
_CHAIN_KEYS = ("plugin", "plugins")


def _apply(values: dict[str, Any], raw: Mapping[str, Any], source: str, key_name: Callable[[str], str]) -> None:
    given = [k for k in _CHAIN_KEYS if raw.get(k) not in (None, "", [])]
    if len(given) > 1:
        raise ConfigError(
            key_name("plugins"), "give either plugin (a chain of one) or plugins (a chain), not both", source=source
        )
    for key in given:
        values.update({f.name: f.default for f in fields(Config) if f.name in _CHAIN_KEYS and f.name != key})
    for key, value in raw.items():
        if key not in _PARSERS:
            shown = key if len(key) <= 80 else key[:77] + "..."
            raise ConfigError(key_name(shown), f"unknown key (known: {', '.join(sorted(_PARSERS))})", source=source)
        try:
            values[key] = _PARSERS[key](value)
        except ValueError as e:
            raise ConfigError(key_name(key), f"{e} (got {_shown(value)})", source=source) from None


#: The largest config file read (the shipped, commented example is about 3 KB).
MAX_CONFIG_BYTES = 1 << 20


def read_config_file(path: str, *, cache_in: str | None = None) -> dict[str, Any]:
    """Parse a config file into a raw mapping (not yet validated).

    ``cache_in``: a run dir whose parse cache (:mod:`netplugin.core.configcache`) may give the
    parse of these exact bytes, and gets it when it did not.
    """
    from netplugin.core import configcache
    from netplugin.core._yaml import DocumentError, load_yaml, read_document

    try:
        data = read_document(path, MAX_CONFIG_BYTES)
    except OSError as e:
        raise ConfigError("config", f"cannot read {path}: {e.strerror or e}", source=path) from e
    except DocumentError as e:
        raise ConfigError("config", f"{path} {e}", source=path) from None
    doc = configcache.lookup(cache_in, path, data) if cache_in else configcache.MISS
    if doc is configcache.MISS:
        try:
            doc = load_yaml(data)
        except DocumentError as e:
            raise ConfigError("config", f"not valid YAML: {e}", source=path) from None
        if cache_in:
            configcache.store(cache_in, path, data, doc)
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError("config", f"must be a mapping at the top level, got {type(doc).__name__}", source=path)
    # YAML keys may be written with dashes, like the flags; the two spellings of one key clash.
    out: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for k, v in doc.items():
        key = str(k).replace("-", "_")
        if key in out:
            raise ConfigError(key, f"given twice, as {_shown(spelled[key])} and {_shown(str(k))}", source=path)
        out[key], spelled[key] = v, str(k)
    return out


def load_config(
    path: str | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    base: Config | None = None,
    cache: bool = False,
) -> Config:
    """Build a Config: defaults, then the file, then ``environ`` (NETPLUGIN_*), then ``overrides``.

    ``path`` is an explicit file (must exist); None means NETPLUGIN_CONFIG from ``environ`` or
    else the default file (may be absent). Overrides with value None are ignored (unset flags).
    ``cache``: use and fill the file's parse cache in the run dir the flags or the environment
    name (else the default): what a short-lived process sets, which would import YAML for it.
    """
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    explicit = path or env.get("NETPLUGIN_CONFIG") or None
    file_path = explicit or DEFAULT_CONFIG
    if explicit or os.path.exists(file_path):
        run_dir = (overrides or {}).get("run_dir") or env.get("NETPLUGIN_RUN_DIR") or DEFAULT_RUN_DIR
        raw = read_config_file(file_path, cache_in=str(run_dir) if cache else None)
        _apply(values, raw, file_path, lambda k: k)
        values["config_path"] = file_path
    env_raw = {key: env[var] for var, key in ENV_VARS.items() if var in env}
    _apply(values, env_raw, "environment", lambda k: next(v for v, kk in ENV_VARS.items() if kk == k))
    if overrides:
        flag_raw = {k: v for k, v in overrides.items() if v is not None}
        _apply(values, flag_raw, "command line", lambda k: "--" + k.replace("_", "-"))
    return replace(base or Config(), **values)
