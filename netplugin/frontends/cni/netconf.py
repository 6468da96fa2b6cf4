"""The network config of a CNI call as netplugin settings, and the pod it names.

:func:`build_config` maps the network config (``plugin``, ``pluginDir``, ``stateDir``, ``runDir``,
``configFile``, ``netplugin``, ``env``) onto a :class:`~netplugin.core.config.Config`;
:func:`call_options` is what belongs to the one call (netns, interface name);
:func:`pod_ref_for` is the pod identity from ``CNI_ARGS``.
"""

from __future__ import annotations

# Imports inside this module's functions are kept for the per-call import set
# (tests/frontends/fastpath.py): each keeps a module off the calls that do not need it
# (BENCHMARKS.md rows B-i and B: the CLI's cold start and per-pod run without a daemon).
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from netplugin.core._yaml import short_repr
from netplugin.core.config import Config, FileSnapshot, file_identity, load_config
from netplugin.core.defaults import DEFAULT_CONFIG
from netplugin.core.errors import ConfigError, InvalidArgument
from netplugin.core.hostports import ENV_HOST_PORTS, from_runtime_config, localhost_enabled, to_env
from netplugin.core.names import PodRef, validate_namespace, validate_pod_name
from netplugin.core.plaindata import replace
from netplugin.frontends.cni.spec import DEFAULT_NAMESPACE, NO_NETNS, CniError, CniRequest
from netplugin.frontends.wire.codec import dumps
from netplugin.frontends.wire.codes import CNI_INVALID_CONFIG, CNI_INVALID_ENV
from netplugin.frontends.wire.fingerprint import BuiltSettings, fingerprint

if TYPE_CHECKING:
    from netplugin.manager.manager import CallOptions

__all__ = [
    "BANDWIDTH_ENV",
    "bandwidth_env",
    "build_config",
    "built_config",
    "call_options",
    "derived_pod_name",
    "host_ports_env",
    "pod_ref_for",
]

#: top-level network-config keys and the netplugin config key each sets
_TOP_KEYS = {"plugin": "plugin", "pluginDir": "plugin_dir", "stateDir": "state_dir", "runDir": "run_dir"}
_PLUGIN_REQUIRED = (
    'is required: name the netplugin plugin of this network ("plugin": "bridge", say) here, '
    'in "netplugin" (or a chain: "netplugin": {"plugins": ["bridge", "bandwidth"]}), in the config file '
    "or in NETPLUGIN_PLUGIN"
)

#: the CNI ``bandwidth`` capability (``runtimeConfig.bandwidth``, bits per second and bits) -> the
#: variables netplugin's chain gets (the shipped bandwidth plugin reads them)
BANDWIDTH_ENV = {
    "ingressRate": "NETPLUGIN_BANDWIDTH_INGRESS_RATE",
    "ingressBurst": "NETPLUGIN_BANDWIDTH_INGRESS_BURST",
    "egressRate": "NETPLUGIN_BANDWIDTH_EGRESS_RATE",
    "egressBurst": "NETPLUGIN_BANDWIDTH_EGRESS_BURST",
}


def _flag_to_cni(where: dict[str, str]) -> Callable[[str], str]:
    def name(flag: str) -> str:
        key = flag[2:].replace("-", "_") if flag.startswith("--") else flag
        return where.get(key, flag)

    return name


def _check_env_map(value: Any, key: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise ConfigError(key, "must be an object of variable name to string value", source="CNI network config")
    out: dict[str, str] = {}
    for k, v in value.items():
        if not k or "=" in k or "\0" in k:
            raise ConfigError(f"{key}.{k}", "bad variable name", source="CNI network config")
        if isinstance(v, bool) or not isinstance(v, str | int | float):
            reason = f"value must be a string (got {short_repr(v)})"
            raise ConfigError(f"{key}.{k}", reason, source="CNI network config")
        if "\0" in str(v):
            raise ConfigError(f"{key}.{k}", "value must not contain NUL", source="CNI network config")
        out[k] = str(v)
    return out


#: the network-config keys build_config reads (a cache key is made of them)
_SETTING_KEYS = ("netplugin", *_TOP_KEYS, "configFile", "env", "defaultNamespace", "logFile")


def _cache_key(
    req: CniRequest, environ: Mapping[str, str], snapshot: FileSnapshot | None
) -> tuple[Any, ...] | None:
    """What build_config's result depends on: the setting keys, NETPLUGIN_* and the config file's
    identity (the daemon's snapshot of it, else inode, size, mtime, ctime: an edited or replaced
    file is read again). None: uncachable."""
    try:
        settings = dumps({k: req.conf[k] for k in _SETTING_KEYS if k in req.conf}, sort_keys=True)
    except (TypeError, ValueError):
        return None
    path = req.conf.get("configFile") or environ.get("NETPLUGIN_CONFIG") or DEFAULT_CONFIG
    if not isinstance(path, str):
        return None
    ours = tuple(sorted((k, v) for k, v in environ.items() if k.startswith("NETPLUGIN_")))
    return "cni", settings, ours, path, file_identity(path, snapshot)


def build_config(req: CniRequest, environ: Mapping[str, str], *, snapshot: FileSnapshot | None = None) -> Config:
    """The netplugin Config of this call's settings (see :func:`call_options` for the per-call part).

    ``snapshot`` (the daemon's): its config file as it was last taken, used instead of that file.
    Raises ConfigError naming the CNI key."""
    return _build_config(req, environ, snapshot)


def built_config(
    req: CniRequest, environ: Mapping[str, str], built: BuiltSettings, snapshot: FileSnapshot | None
) -> tuple[Config, dict[str, Any]]:
    """The daemon's :func:`build_config` (it serves many calls of few settings) and the config's
    fingerprint: a config built before from the same settings, environment and unchanged config
    file is reused from ``built``. Errors are never kept."""
    key = _cache_key(req, environ, snapshot)
    if key is None:
        cfg = _build_config(req, environ, snapshot)
        return cfg, fingerprint(cfg)
    return built.get(key, lambda: _build_config(req, environ, snapshot))


def _build_config(req: CniRequest, environ: Mapping[str, str], snapshot: FileSnapshot | None) -> Config:
    conf = req.conf
    src = "CNI network config"
    overrides: dict[str, Any] = {}
    where: dict[str, str] = {}  # netplugin key -> the CNI key that set it (for error messages)
    nested = conf.get("netplugin")
    if nested is not None:
        if not isinstance(nested, dict):
            raise ConfigError("netplugin", "must be an object of netplugin config keys", source=src)
        for k, v in nested.items():
            key = str(k).replace("-", "_")
            overrides[key] = v
            where[key] = f"netplugin.{k}"
    for cni_key, key in _TOP_KEYS.items():
        if cni_key in conf:
            overrides[key] = conf[cni_key]
            where[key] = cni_key
    path = conf.get("configFile")
    if path is not None and (not isinstance(path, str) or not path or "\0" in path):
        raise ConfigError("configFile", "must be a non-empty path without NUL", source=src)
    top_env = _check_env_map(conf["env"], "env") if "env" in conf else {}
    default_ns = conf.get("defaultNamespace", DEFAULT_NAMESPACE)
    if "defaultNamespace" in conf:
        from netplugin.core.errors import InvalidArgument
        from netplugin.core.names import validate_namespace

        if not isinstance(default_ns, str):
            raise ConfigError("defaultNamespace", f"must be a string (got {short_repr(default_ns)})", source=src)
        try:
            validate_namespace(default_ns)
        except InvalidArgument as e:
            raise ConfigError("defaultNamespace", f"{e.reason} (got {short_repr(default_ns)})", source=src) from None
    log_file = conf.get("logFile")
    if log_file is not None and (not isinstance(log_file, str) or not log_file or "\0" in log_file):
        raise ConfigError("logFile", "must be a non-empty path without NUL", source=src)
    if "netns_template" in overrides:
        raise ConfigError(where["netns_template"], "is set per call from CNI_NETNS by the CNI shim", source=src)
    try:
        cfg = load_config(path, environ=environ, overrides=overrides, snapshot=snapshot)
        if not cfg.chain:  # the CLI's default, no-op, would make every ADD "succeed" with no network
            raise ConfigError("plugin", _PLUGIN_REQUIRED, source=src)
    except ConfigError as e:
        if e.source == "command line":
            raise ConfigError(_flag_to_cni(where)(e.key), e.reason, source=src) from None
        if path and e.key == "config" and e.source == path:
            raise ConfigError("configFile", e.reason, source=src) from None
        raise
    if not top_env:
        return cfg
    return replace(cfg, env={**cfg.env, **top_env})


def call_options(req: CniRequest, netns: str | None = None, settings: Mapping[str, str] | None = None) -> CallOptions:
    """The per-call part: ``CNI_NETNS`` as the netns (NO_NETNS when empty), ``CNI_IFNAME`` as
    ``NETPLUGIN_IFNAME`` and ``NETPLUGIN_BRIDGE_IFNAME``, the ``bandwidth`` capability as
    ``NETPLUGIN_BANDWIDTH_*``, the ``portMappings`` capability as ``NETPLUGIN_HOST_PORTS``. Kept out
    of the Config, so that the config of a CNI call equals the daemon's (and init's marker) when the
    settings are the same. ``settings``: the config's plugin settings (``env``), which say whether a
    loopback hostIP is mapped (``NETPLUGIN_HOSTPORT_LOCALHOST``)."""
    from netplugin.manager.manager import CallOptions

    env = {"NETPLUGIN_IFNAME": req.ifname, "NETPLUGIN_BRIDGE_IFNAME": req.ifname} if req.ifname else {}
    env.update(bandwidth_env(req.conf))
    env.update(host_ports_env(req.conf, settings or {}))
    return CallOptions(netns=netns if netns is not None else (req.netns or NO_NETNS), env=env)


def bandwidth_env(conf: Mapping[str, Any]) -> dict[str, str]:
    """``runtimeConfig.bandwidth`` (the runtime's, for a conflist declaring the capability) as variables.

    Keys in the spec's spelling (``ingressRate``) or Go's (``IngressRate``, containerd 1.6). A rate or
    burst of 0 counts as unset (CNI's bandwidth plugin reads it so); anything but a whole number from
    0 to 2^63-1 is error 7 naming the key."""
    runtime = conf.get("runtimeConfig")
    bw = runtime.get("bandwidth") if isinstance(runtime, dict) else None
    if bw is None:
        return {}
    if not isinstance(bw, dict):
        raise CniError(CNI_INVALID_CONFIG, f"runtimeConfig.bandwidth must be an object (got {short_repr(bw)})")
    out: dict[str, str] = {}
    for key, var in BANDWIDTH_ENV.items():
        # The spec's spelling, else Go's field name: containerd 1.6 (go-cni's BandWidth has no JSON
        # tags) sends {"IngressRate": 20000000, "IngressBurst": 4294967295, ...}.
        v = bw.get(key, bw.get(key[0].upper() + key[1:]))
        if v is None or v == 0:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or not 0 < v < 1 << 63:
            reason = f"must be a whole number of bits (got {short_repr(v)})"
            raise CniError(CNI_INVALID_CONFIG, f"runtimeConfig.bandwidth.{key} {reason}")
        out[var] = str(v)
    return out


def host_ports_env(conf: Mapping[str, Any], settings: Mapping[str, str] | None = None) -> dict[str, str]:
    """``runtimeConfig.portMappings`` (the runtime's, for a conflist declaring the capability) as
    ``NETPLUGIN_HOST_PORTS`` (:mod:`netplugin.core.hostports`); a bad entry is error 7 naming it,
    a loopback hostIP among them when ``settings`` turn ``NETPLUGIN_HOSTPORT_LOCALHOST`` off."""
    try:
        maps = from_runtime_config(conf, localhost_enabled(settings or {}))
    except InvalidArgument as e:
        raise CniError(CNI_INVALID_CONFIG, e.message) from None
    return {ENV_HOST_PORTS: to_env(maps)} if maps else {}


def pod_ref_for(req: CniRequest) -> PodRef:
    """(namespace, name, infra id) of the call; see "Pod identity" in the module docstring."""
    args = req.args
    k8s_ns = args.get("K8S_POD_NAMESPACE")
    k8s_name = args.get("K8S_POD_NAME")
    try:
        namespace = validate_namespace(k8s_ns) if k8s_ns else req.conf.get("defaultNamespace", DEFAULT_NAMESPACE)
        # A runtime may name a sandbox as no Kubernetes pod can be named (critest uses capitals): like
        # podman's names, such a name gives way to one derived from the container id.
        name = k8s_name if k8s_name and _is_pod_name(k8s_name) else derived_pod_name(req.container_id)
    except InvalidArgument as e:
        which = "K8S_POD_NAMESPACE" if e.field == "namespace" else "K8S_POD_NAME"
        raise CniError(CNI_INVALID_ENV, f"invalid CNI_ARGS {which} {short_repr(e.value)}: {e.reason}") from None
    return PodRef(namespace, name, req.container_id)


def _is_pod_name(value: str) -> bool:
    try:
        validate_pod_name(value)
    except InvalidArgument:
        return False
    return True


def derived_pod_name(container_id: str) -> str:
    """``cni-`` + the first 12 alphanumerics of the container id, lowercased."""
    alnum = "".join(c for c in container_id.lower() if c.isascii() and c.isalnum())
    return "cni-" + (alnum[:12] or "0")
