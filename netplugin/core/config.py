"""Configuration: a YAML file, then environment variables, then command-line flags.

Precedence rises in that order. The file is ``/etc/netplugin/netplugin.yaml``
unless ``--config`` or ``NETPLUGIN_CONFIG`` names another; a missing *default*
file is fine (built-in defaults apply), a missing *explicit* file is an error.
Unknown keys and bad values are :class:`~netplugin.core.errors.ConfigError` naming
the key and where it came from. ``etc/netplugin.yaml`` is the commented example.
"""

from __future__ import annotations

# Imports inside this module's functions are kept for the per-call import set
# (tests/frontends/fastpath.py): each keeps a module off the calls that do not need it
# (BENCHMARKS.md rows B-i and B: the CLI's cold start and per-pod run without a daemon).
import itertools
import os
import re
import stat
from collections.abc import Callable, Mapping
from typing import Any

from netplugin.core.configkeys import ENV_VARS, PARSERS
from netplugin.core.defaults import (
    DEFAULT_CONFIG,
    DEFAULT_GC_INTERVAL,
    DEFAULT_KILL_GRACE,
    DEFAULT_MAX_OUTPUT,
    DEFAULT_NETNS_TEMPLATE,
    DEFAULT_NODES_DIR,
    DEFAULT_PLUGIN_DIR,
    DEFAULT_PODS_DIR,
    DEFAULT_RUN_DIR,
    DEFAULT_STATE_DIR,
    DEFAULT_TIMEOUTS,
    LIMIT_OF,
    socket_path,
)
from netplugin.core.errors import ConfigError
from netplugin.core.plaindata import dataclass, field, fields, replace

__all__ = [
    "ENV_VARS",
    "Config",
    "FileSnapshot",
    "file_identity",
    "load_config",
    "snapshot_config",
]


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
    # --- the node and its cluster ---
    #: this node's name; None: $NODE_NAME, else the hostname (see netplugin.core.node.node_name)
    node_name: str | None = None
    #: Node manifests for the static host (clusters without an API server)
    nodes_dir: str = DEFAULT_NODES_DIR
    #: the daemon keeps routes to the other nodes' pod CIDRs (host-gw)
    node_routes: bool = True
    #: how often the daemon re-checks those routes even when no Node changed
    node_resync: float = 30.0
    #: the least severe log records written (debug, info, warning, error)
    log_level: str = "info"
    #: log lines as text (timestamp, level, message, key=value fields) or one JSON object each
    log_format: str = "text"
    #: how often the daemon runs gc on its own (seconds; 0: only at start and after pod deletions)
    gc_interval: float = DEFAULT_GC_INTERVAL

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
        action = LIMIT_OF.get(action, action)
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


def _shown(value: Any) -> str:
    """A value quoted in a message: repr, at most 80 characters, never fully expanded."""
    from netplugin.core._yaml import short_repr

    return short_repr(value)


#: What an unknown key must look like to be quoted in the error: a name, not a line of a secret.
_KEY_LIKE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")

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
        if key not in PARSERS:
            known = f"(known: {', '.join(sorted(PARSERS))})"
            if not _KEY_LIKE.fullmatch(key):
                # A line of a file that is no config (a symlinked /etc/shadow) is never quoted.
                raise ConfigError("config", f"holds a key that is no config key name {known}", source=source)
            raise ConfigError(key_name(key), f"unknown key {known}", source=source)
        try:
            values[key] = PARSERS[key](value)
        except ValueError as e:
            raise ConfigError(key_name(key), f"{e} (got {_shown(value)})", source=source) from None


#: The largest config file read (the shipped, commented example is about 3 KB).
MAX_CONFIG_BYTES = 1 << 20


def config_file_problems(path: str) -> list[str]:
    """Why root may not trust the config file at ``path`` (empty: it may).

    The file chooses the exec dir and may turn ``check_permissions`` off, so it is trusted like
    the exec dir (:mod:`netplugin.core.execplugin.trust`): it and every directory and symbolic
    link on its resolved path are owned by root (or netplugin's uid) and not group/world-
    writable; a sticky directory (``/tmp``) is accepted on the way, as above netplugin's own
    directories, and a root-owned character device (``/dev/null``, the empty config) as the file.
    Nothing the file says lifts this. A path that cannot be walked (missing) is left to the read.
    """
    from netplugin.core.execplugin.trust import UntrustedPath, mode_problem, split_path, walk

    full = os.path.abspath(path)
    try:
        with walk(full, own_from=len(split_path(full)), check_last=False) as found:
            problems = list(found.problems)
            st = found.st
            # a device's mode says who may write to it, not who chooses what it reads (/dev/null)
            device = stat.S_ISCHR(st.st_mode) and st.st_uid == 0
            if not device and (p := mode_problem(found.real, st, os.geteuid())):
                problems.append(p)
    except UntrustedPath as e:
        return list(e.problems)
    return problems


def _check_trusted(path: str) -> None:
    problems = config_file_problems(path)
    if problems:
        fix = "chown root: FILE && chmod go-w FILE, and the same for the directories on its path"
        raise ConfigError("config", f"refusing config file {path}: {'; '.join(problems)} (fix: {fix})", source=path)


def read_config_file(path: str, *, cache_in: str | None = None, cache_pinned: bool = False) -> dict[str, Any]:
    """Parse a config file into a raw mapping (not yet validated).

    ``cache_in``: the run dir whose parse cache (:mod:`netplugin.core.configcache`) may hold the
    parse of these exact bytes, and gets it when it did not. The cache lives in the node's own
    run dir only: unless the caller's flags or environment fix the run dir (``cache_pinned``),
    a file that names another run dir is neither taken from nor written to ``cache_in``.
    """
    from netplugin.core import configcache
    from netplugin.core._yaml import DocumentError, load_yaml, read_document

    _check_trusted(path)
    try:
        data = read_document(path, MAX_CONFIG_BYTES)
    except OSError as e:
        raise ConfigError("config", f"cannot read {path}: {e.strerror or e}", source=path) from e
    except DocumentError as e:
        raise ConfigError("config", f"{path} {e}", source=path) from None

    def in_its_run_dir(doc: dict[str, Any]) -> bool:
        return cache_pinned or doc.get("run_dir") in (None, cache_in)

    if cache_in:
        cached = configcache.lookup(cache_in, path, data)
        if isinstance(cached, dict) and in_its_run_dir(cached):
            return cached
    try:
        doc = load_yaml(data)
    except DocumentError as e:
        raise ConfigError("config", f"not valid YAML: {e}", source=path) from None
    if doc is None:
        doc = {}
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
    if cache_in and in_its_run_dir(out):
        configcache.store(cache_in, path, data, out)
    return out


class FileSnapshot:
    """A config file as read once: the daemon's, at its last successful (re)load.

    Calls the daemon runs for others build their settings with it instead of the file on disk, so
    an edit takes effect on the node when the daemon takes it (SIGHUP), not call by call.
    ``raw`` is the file's parse (None: the default file was absent); ``serial`` tells snapshots apart
    (a cache key), as no two have the same.
    """

    __slots__ = ("path", "raw", "serial")
    _serials = itertools.count(1)

    def __init__(self, path: str, raw: Mapping[str, Any] | None) -> None:
        self.path = path
        self.raw = raw
        self.serial = next(self._serials)


def file_identity(path: str, snapshot: FileSnapshot | None) -> tuple[Any, ...] | None:
    """What tells a config file unchanged (a cache key): the daemon's snapshot when it is of ``path``,
    else the file's device, inode, size, mtime and ctime, so an edited or replaced file is read again;
    None when it cannot be stat'ed."""
    if snapshot is not None and snapshot.path == path:
        return ("snapshot", snapshot.serial)
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _file_path(path: str | None, env: Mapping[str, str]) -> tuple[str, bool]:
    """(the file load_config reads, whether it was named: then it must exist)."""
    explicit = path or env.get("NETPLUGIN_CONFIG") or None
    return explicit or DEFAULT_CONFIG, bool(explicit)


def snapshot_config(path: str | None = None, *, environ: Mapping[str, str] | None = None) -> FileSnapshot:
    """Read the file :func:`load_config` would read for ``path`` and ``environ``, once."""
    file_path, explicit = _file_path(path, os.environ if environ is None else environ)
    if not explicit and not os.path.exists(file_path):
        return FileSnapshot(file_path, None)
    return FileSnapshot(file_path, read_config_file(file_path))


def load_config(
    path: str | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    base: Config | None = None,
    cache: bool = False,
    snapshot: FileSnapshot | None = None,
) -> Config:
    """Build a Config: defaults, then the file, then ``environ`` (NETPLUGIN_*), then ``overrides``.

    ``path`` is an explicit file (must exist); None means NETPLUGIN_CONFIG from ``environ`` or
    else the default file (may be absent). Overrides with value None are ignored (unset flags).
    ``cache``: use and fill the file's parse cache in the run dir the flags or the environment
    name, else the default one unless the file names another (see :func:`read_config_file`):
    what a short-lived process sets, which would import YAML for it. ``snapshot``: the file as
    read before, taken instead of reading it again when it is the file meant here.
    """
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    file_path, explicit = _file_path(path, env)
    raw: Mapping[str, Any] | None = None
    if snapshot is not None and snapshot.path == file_path:
        raw = snapshot.raw
    elif explicit or os.path.exists(file_path):
        pinned = (overrides or {}).get("run_dir") or env.get("NETPLUGIN_RUN_DIR")
        cache_in = str(pinned or DEFAULT_RUN_DIR) if cache else None
        raw = read_config_file(file_path, cache_in=cache_in, cache_pinned=bool(pinned))
    if raw is not None:
        _apply(values, raw, file_path, lambda k: k)
        values["config_path"] = file_path
    env_raw = {key: env[var] for var, key in ENV_VARS.items() if var in env}
    _apply(values, env_raw, "environment", lambda k: next(v for v, kk in ENV_VARS.items() if kk == k))
    if overrides:
        flag_raw = {k: v for k, v in overrides.items() if v is not None}
        _apply(values, flag_raw, "command line", lambda k: "--" + k.replace("_", "-"))
    return replace(base or Config(), **values)
