"""``netplugin-cni``: a CNI plugin (spec 1.1) that drives netplugin's exec plugins.

A container runtime (kubelet's CRI runtime, podman's CNI backend, cnitool)
runs this executable with ``CNI_*`` variables and the network config on stdin.
The shim maps each CNI operation onto the :class:`~netplugin.manager.Manager`,
so CNI pods get the same guarantees as netplugin's own (init once, per-pod
locks across processes, time limits, rollback of a failed setup).

Operations
    ``ADD``     setup, then status; prints a CNI result (see "Result" below).
    ``DEL``     teardown. Idempotent: it succeeds when the pod's resources or its
                network namespace are gone, and when ``CNI_NETNS`` is empty.
    ``CHECK``   status; fails when the plugin reports no address (code 3) or an
                address that is not in ``prevResult`` (code 999).
    ``VERSION`` ``{"cniVersion", "supportedVersions"}``.
    ``STATUS``  exit 0 when the plugin can be selected and initialised, else code 50.
    ``GC``      tears down every attachment this network recorded (ADD records
                ``<stateDir>/cni/<network>/<containerID>:<ifname>.json`` before setup,
                a successful DEL removes it) that is not in ``cni.dev/valid-attachments``;
                continues past errors and reports all of them. Pods that netplugin's
                CLI or daemon set up in the same state dir are never touched.

Network config (stdin), besides the CNI keys
    ``plugin``           netplugin plugin name (e.g. ``"bridge"``)
    ``pluginDir``        exec dir; ``stateDir``, ``runDir`` as netplugin's
    ``configFile``       a netplugin YAML file to load (must exist); without it the
                         default ``/etc/netplugin/netplugin.yaml`` is read if present
                         (or the file named by ``NETPLUGIN_CONFIG``)
    ``netplugin``        an object of any netplugin config keys (``timeouts``, ``host``, ...)
    ``env``              variables added to the exec plugin's environment, on top of the
                         config's ``env:`` (e.g. ``{"NETPLUGIN_BRIDGE_SUBNET": "10.201.3.0/24"}``)
    ``defaultNamespace`` the pod namespace when ``CNI_ARGS`` has none (default ``"default"``)
    ``logFile``          append one JSON line per call (command, container, outcome, time)
    Precedence, rising: defaults < config file < ``NETPLUGIN_*`` environment < ``netplugin``
    object < the top-level keys above. A bad value is error code 7 naming the key.

Pod identity
    The infra id is ``CNI_CONTAINERID``; the namespace and name come from
    ``CNI_ARGS`` ``K8S_POD_NAMESPACE`` / ``K8S_POD_NAME`` (Kubernetes runtimes send
    both; invalid values are error code 4). Runtimes that send no namespace
    (podman sends ``IgnoreUnknown=1;K8S_POD_NAME=<container name>`` only) get
    ``defaultNamespace``; their name is used when it is a valid DNS-1123
    subdomain, else (podman allows ``_`` and capitals) the name is
    ``cni-`` + the first 12 alphanumerics of the container id, lowercased.
    The derivation depends only on the call's inputs; ``DEL`` uses the identity that ``ADD``
    recorded for the attachment (see GC) when there is one, so a renamed container is
    still torn down as the pod it was set up as.

Network namespace and interface
    ``NETPLUGIN_NETNS`` is ``CNI_NETNS`` (the config's ``netns_template`` is replaced by
    that literal path for the call). When ``CNI_NETNS`` is empty (allowed for DEL and
    GC) it is ``/dev/null/no-netns``, a path that can never exist, so a plugin's
    "netns gone" branch runs. ``CNI_IFNAME`` is given to the plugin as
    ``NETPLUGIN_IFNAME`` and ``NETPLUGIN_BRIDGE_IFNAME``; the ``CNI_*`` variables
    themselves are inherited as well (unless ``inherit_env`` is false).

Result
    ``interfaces: [{name: CNI_IFNAME, mac, sandbox: CNI_NETNS}]``, ``ips: [{address,
    interface: 0, gateway?}]``. The MAC is read from the netns after setup (podman
    refuses a container interface without one); it is left out when the
    interface does not exist or cannot be read. A status reports only an address, so the prefix
    length comes from ``NETPLUGIN_BRIDGE_SUBNET`` in the plugin environment when the
    address is inside it (and the gateway from ``NETPLUGIN_BRIDGE_GATEWAY``, or the
    subnet's first host); otherwise the address is a host route, ``/32`` or ``/128``.
    A plugin that reports no address yields ``ips: []``. The result is in the config's
    ``cniVersion`` (0.3.x and 0.4.0 results carry ``ips[].version``). A ``prevResult``
    (chaining) is passed through with ours appended.

Errors
    The CNI error JSON ``{cniVersion, code, msg, details}`` on stdout and exit 1:

    ====  =================================================================
    1     ``cniVersion`` not supported
    3     CHECK: the plugin reports no address for the container
    4     a ``CNI_*`` variable is missing or invalid (command, container id,
          ifname, netns, ``CNI_ARGS``)
    5     I/O: the exec dir, a lock, state or a host lookup failed
    6     stdin is not a JSON object
    7     invalid network or netplugin config (names the key); the plugin is
          not found or not usable; CHECK without ``prevResult``
    11    try again later: the plugin timed out (its process tree was killed)
    50    STATUS: the plugin cannot be selected or initialised
    999   the plugin failed (details: its stderr tail), or an internal error
    ====  =================================================================

    No traceback ever reaches the runtime: anything unexpected is code 999.

Installing
    The runtime finds the plugin by its ``type`` in its CNI bin dirs (``CNI_PATH``;
    podman: ``cni_plugin_dirs``, on Debian ``/usr/lib/cni``; containerd: ``/opt/cni/bin``),
    so link the console script there, e.g.
    ``ln -s "$(command -v netplugin-cni)" /opt/cni/bin/netplugin-cni``, and install a
    conflist like ``etc/cni/10-netplugin.conflist`` in ``/etc/cni/net.d``. Use
    ``"cniVersion": "1.0.0"`` with podman 4.x: its libcni cannot read 1.1.0 results,
    and it never sends STATUS, GC or CHECK. ``scripts/podman-setup.sh`` prepares
    podman's CNI backend for trying this.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from .config import Config
    from .errors import NetpluginError
    from .manager import Manager
    from .names import PodRef
    from .plugin import PodNetworkStatus

__all__ = [
    "NO_NETNS",
    "SUPPORTED_VERSIONS",
    "Attachment",
    "CniError",
    "CniRequest",
    "build_config",
    "derived_pod_name",
    "error_for",
    "link_mac",
    "list_attachments",
    "main",
    "make_result",
    "parse_cni_args",
    "parse_request",
    "pod_ref_for",
    "run",
]

SUPPORTED_VERSIONS = ("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
LATEST = SUPPORTED_VERSIONS[-1]
COMMANDS = ("ADD", "DEL", "CHECK", "VERSION", "STATUS", "GC")
#: NETPLUGIN_NETNS when the runtime gives no netns: ENOTDIR for any open, so it never exists.
NO_NETNS = "/dev/null/no-netns"
DEFAULT_NAMESPACE = "default"

# CNI error codes (spec "Error", plus libcni's 999)
E_VERSION = 1
E_UNKNOWN_CONTAINER = 3
E_ENV = 4
E_IO = 5
E_DECODE = 6
E_CONFIG = 7
E_TRY_AGAIN = 11
E_UNAVAILABLE = 50
E_INTERNAL = 999

#: top-level network-config keys and the netplugin config key each sets
_TOP_KEYS = {"plugin": "plugin", "pluginDir": "plugin_dir", "stateDir": "state_dir", "runDir": "run_dir"}
_IFNAME_BAD = re.compile(r"[/:\s]")
_NETWORK_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*\Z")


class CniError(Exception):
    """An error the shim reports to the runtime as CNI error JSON."""

    def __init__(self, code: int, msg: str, details: str = "") -> None:
        super().__init__(msg)
        self.code = code
        self.msg = msg
        self.details = details

    def to_dict(self, cni_version: str) -> dict[str, Any]:
        out: dict[str, Any] = {"cniVersion": cni_version, "code": self.code, "msg": self.msg}
        if self.details:
            out["details"] = self.details
        return out


@dataclass
class CniRequest:
    """One invocation: the ``CNI_*`` variables and the parsed network config."""

    command: str
    container_id: str = ""
    netns: str = ""
    ifname: str = ""
    args: dict[str, str] = field(default_factory=dict)
    path: str = ""
    conf: dict[str, Any] = field(default_factory=dict)

    @property
    def cni_version(self) -> str:
        v = self.conf.get("cniVersion")
        return v if isinstance(v, str) and v in SUPPORTED_VERSIONS else LATEST


# --- parsing -------------------------------------------------------------------------------------------


def parse_cni_args(raw: str) -> dict[str, str]:
    """``K=V;K=V`` -> dict. Empty pieces are ignored; a piece without ``=`` is error 4."""
    out: dict[str, str] = {}
    for piece in raw.split(";"):
        if not piece:
            continue
        key, sep, value = piece.partition("=")
        if not sep or not key:
            raise CniError(E_ENV, f"invalid CNI_ARGS {raw!r}: {piece!r} is not KEY=VALUE")
        out[key] = value
    return out


def _ifname_problem(name: str) -> str | None:
    if not name:
        return "must not be empty"
    if len(name) > 15:
        return "must be at most 15 characters"
    if name in (".", ".."):
        return "must not be '.' or '..'"
    if _IFNAME_BAD.search(name):
        return "must not contain '/', ':' or whitespace"
    return None


def parse_request(environ: Mapping[str, str], stdin: bytes) -> CniRequest:
    """Read and check what the runtime gave us. Raises :class:`CniError` (codes 1, 4, 6, 7)."""
    command = environ.get("CNI_COMMAND", "")
    if command not in COMMANDS:
        if not command:
            raise CniError(E_ENV, "CNI_COMMAND is not set", f"expected one of {', '.join(COMMANDS)}")
        raise CniError(E_ENV, f"unknown CNI_COMMAND {command!r}", f"expected one of {', '.join(COMMANDS)}")
    req = CniRequest(command=command)
    text = stdin.strip()
    if text or command != "VERSION":
        try:
            conf = json.loads(text)
        except (ValueError, RecursionError) as e:
            raise CniError(E_DECODE, f"network config on stdin is not JSON: {e}") from None
        if not isinstance(conf, dict):
            raise CniError(E_DECODE, f"network config must be a JSON object, got {type(conf).__name__}")
        req.conf = conf
    version = req.conf.get("cniVersion")
    if command == "VERSION":
        return req
    if version is None:
        raise CniError(E_VERSION, "network config has no cniVersion", f"supported: {', '.join(SUPPORTED_VERSIONS)}")
    if version not in SUPPORTED_VERSIONS:
        raise CniError(
            E_VERSION, f"incompatible CNI version {version!r}", f"supported: {', '.join(SUPPORTED_VERSIONS)}"
        )
    name = req.conf.get("name")
    if name is not None and (not isinstance(name, str) or not _NETWORK_NAME.match(name)):
        raise CniError(E_CONFIG, f"invalid network name {name!r}", "must match ^[a-zA-Z0-9][a-zA-Z0-9_.-]*$")
    if command in ("STATUS", "GC"):
        req.netns = environ.get("CNI_NETNS", "")
        req.path = environ.get("CNI_PATH", "")
        req.args = parse_cni_args(environ.get("CNI_ARGS", ""))
        return req
    # ADD, DEL, CHECK
    from .errors import InvalidArgument
    from .names import validate_infra_id

    req.container_id = environ.get("CNI_CONTAINERID", "")
    try:
        validate_infra_id(req.container_id)
    except InvalidArgument as e:
        raise CniError(E_ENV, f"invalid CNI_CONTAINERID {req.container_id!r}: {e.reason}") from None
    req.ifname = environ.get("CNI_IFNAME", "")
    problem = _ifname_problem(req.ifname)
    if problem:
        raise CniError(E_ENV, f"invalid CNI_IFNAME {req.ifname!r}: {problem}")
    req.netns = environ.get("CNI_NETNS", "")
    if command != "DEL":
        if not req.netns:
            raise CniError(E_ENV, f"CNI_NETNS is required for {command}")
        if not os.path.exists(req.netns):
            raise CniError(E_ENV, f"CNI_NETNS {req.netns!r} does not exist")
    req.args = parse_cni_args(environ.get("CNI_ARGS", ""))
    req.path = environ.get("CNI_PATH", "")
    return req


# --- config ---------------------------------------------------------------------------------------------


def _flag_to_cni(where: dict[str, str]) -> Callable[[str], str]:
    def name(flag: str) -> str:
        key = flag[2:].replace("-", "_") if flag.startswith("--") else flag
        return where.get(key, flag)

    return name


def _check_env_map(value: Any, key: str) -> dict[str, str]:
    from .errors import ConfigError

    if not isinstance(value, dict):
        raise ConfigError(key, "must be an object of variable name to string value", source="CNI network config")
    out: dict[str, str] = {}
    for k, v in value.items():
        if not k or "=" in k or "\0" in k:
            raise ConfigError(f"{key}.{k}", "bad variable name", source="CNI network config")
        if isinstance(v, bool) or not isinstance(v, str | int | float):
            raise ConfigError(f"{key}.{k}", f"value must be a string (got {v!r})", source="CNI network config")
        if "\0" in str(v):
            raise ConfigError(f"{key}.{k}", "value must not contain NUL", source="CNI network config")
        out[k] = str(v)
    return out


def build_config(req: CniRequest, environ: Mapping[str, str]) -> Config:
    """The netplugin Config for this call. Raises ConfigError naming the CNI key."""
    from .config import load_config
    from .errors import ConfigError

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
    if path is not None and (not isinstance(path, str) or not path):
        raise ConfigError("configFile", "must be a non-empty path", source=src)
    top_env = _check_env_map(conf["env"], "env") if "env" in conf else {}
    default_ns = conf.get("defaultNamespace", DEFAULT_NAMESPACE)
    if "defaultNamespace" in conf:
        from .errors import InvalidArgument
        from .names import validate_namespace

        if not isinstance(default_ns, str):
            raise ConfigError("defaultNamespace", f"must be a string (got {default_ns!r})", source=src)
        try:
            validate_namespace(default_ns)
        except InvalidArgument as e:
            raise ConfigError("defaultNamespace", f"{e.reason} (got {default_ns!r})", source=src) from None
    log_file = conf.get("logFile")
    if log_file is not None and (not isinstance(log_file, str) or not log_file):
        raise ConfigError("logFile", "must be a non-empty path", source=src)
    if "netns_template" in overrides:
        raise ConfigError(where["netns_template"], "is set per call from CNI_NETNS by the CNI shim", source=src)
    # The netns is the runtime's, not a template: escape braces so format() leaves the path alone.
    netns = req.netns or NO_NETNS
    overrides["netns_template"] = netns.replace("{", "{{").replace("}", "}}")
    try:
        cfg = load_config(path, environ=environ, overrides=overrides)
    except ConfigError as e:
        if e.source == "command line":
            raise ConfigError(_flag_to_cni(where)(e.key), e.reason, source=src) from None
        if path and e.key == "config" and e.source == path:
            raise ConfigError("configFile", e.reason, source=src) from None
        raise
    env = dict(cfg.env)
    env.update(top_env)
    if req.ifname:
        env["NETPLUGIN_IFNAME"] = req.ifname
        env["NETPLUGIN_BRIDGE_IFNAME"] = req.ifname
    return replace(cfg, env=env)


def pod_ref_for(req: CniRequest) -> PodRef:
    """(namespace, name, infra id) of the call; see "Pod identity" in the module docstring."""
    from .errors import InvalidArgument
    from .names import PodRef, validate_namespace, validate_pod_name

    args = req.args
    k8s_ns = args.get("K8S_POD_NAMESPACE")
    k8s_name = args.get("K8S_POD_NAME")
    try:
        namespace = validate_namespace(k8s_ns) if k8s_ns else req.conf.get("defaultNamespace", DEFAULT_NAMESPACE)
        if k8s_ns and k8s_name is not None:
            name = validate_pod_name(k8s_name)
        elif k8s_name and _is_pod_name(k8s_name):
            name = k8s_name
        else:
            name = derived_pod_name(req.container_id)
    except InvalidArgument as e:
        which = "K8S_POD_NAMESPACE" if e.field == "namespace" else "K8S_POD_NAME"
        raise CniError(E_ENV, f"invalid CNI_ARGS {which} {e.value!r}: {e.reason}") from None
    return PodRef(namespace, name, req.container_id)


def _is_pod_name(value: str) -> bool:
    from .errors import InvalidArgument
    from .names import validate_pod_name

    try:
        validate_pod_name(value)
    except InvalidArgument:
        return False
    return True


def derived_pod_name(container_id: str) -> str:
    """``cni-`` + the first 12 alphanumerics of the container id, lowercased."""
    alnum = "".join(c for c in container_id.lower() if c.isascii() and c.isalnum())
    return "cni-" + (alnum[:12] or "0")


# --- results --------------------------------------------------------------------------------------------


def _address(ip: str, env: Mapping[str, str]) -> tuple[str, str | None]:
    """(CIDR, gateway or None) for a reported address, using the bridge settings when they fit."""
    addr = ipaddress.ip_address(ip)
    subnet_text = env.get("NETPLUGIN_BRIDGE_SUBNET", "")
    if subnet_text:
        try:
            net = ipaddress.ip_network(subnet_text, strict=False)
        except ValueError:
            net = None
        if net is not None and net.version == addr.version and addr in net:
            gw_text = env.get("NETPLUGIN_BRIDGE_GATEWAY", "")
            gateway: str | None = None
            try:
                gw = ipaddress.ip_address(gw_text) if gw_text else net.network_address + 1
                gateway = str(gw) if gw in net and gw != addr else None
            except ValueError:
                gateway = None
            return f"{addr}/{net.prefixlen}", gateway
    return f"{addr}/{addr.max_prefixlen}", None


_CLONE_NEWNET = 0x40000000
_SIOCGIFHWADDR = 0x8927


def link_mac(netns: str, ifname: str) -> str | None:
    """The MAC address of ``ifname`` inside the netns at ``netns``, or None if it cannot be read.

    A helper thread enters the netns (setns changes only the calling thread) and asks the kernel
    with SIOCGIFHWADDR on a socket created there; no process is started. /sys cannot be used:
    it shows the netns of whoever mounted it.
    """
    found: list[str] = []

    def look() -> None:
        import fcntl
        import socket
        import struct

        try:
            fd = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return
        try:
            if hasattr(os, "setns"):  # Python 3.12+
                os.setns(fd, _CLONE_NEWNET)
            else:
                import ctypes

                if ctypes.CDLL(None, use_errno=True).setns(fd, _CLONE_NEWNET) != 0:
                    return
        except OSError:
            return
        finally:
            os.close(fd)
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                ifreq = fcntl.ioctl(sock.fileno(), _SIOCGIFHWADDR, struct.pack("256s", ifname.encode()))
        except OSError:
            return
        found.append(":".join(f"{b:02x}" for b in ifreq[18:24]))

    import threading

    worker = threading.Thread(target=look, name="netplugin-cni-mac", daemon=True)
    worker.start()
    worker.join(5.0)
    return found[0] if found else None


def make_result(
    cni_version: str,
    ifname: str,
    netns: str,
    ip: str | None,
    env: Mapping[str, str],
    prev: Mapping[str, Any] | None = None,
    mac: str | None = None,
) -> dict[str, Any]:
    """The ADD result in ``cni_version``'s format; ``prev`` (a prevResult) is extended, not replaced."""
    interfaces = [dict(i) for i in (prev or {}).get("interfaces") or [] if isinstance(i, dict)]
    ips = [dict(i) for i in (prev or {}).get("ips") or [] if isinstance(i, dict)]
    index = len(interfaces)
    iface: dict[str, Any] = {"name": ifname}
    if mac:
        iface["mac"] = mac
    if netns:
        iface["sandbox"] = netns
    interfaces.append(iface)
    if ip is not None:
        cidr, gateway = _address(ip, env)
        entry: dict[str, Any] = {"address": cidr, "interface": index}
        if gateway:
            entry["gateway"] = gateway
        if not cni_version.startswith("1."):
            entry["version"] = "6" if ":" in ip else "4"
        ips.append(entry)
    result: dict[str, Any] = {"cniVersion": cni_version, "interfaces": interfaces, "ips": ips}
    for key in ("routes", "dns"):
        if prev and prev.get(key):
            result[key] = prev[key]
    return result


def _prev_ips(prev: Any) -> set[str]:
    out: set[str] = set()
    if not isinstance(prev, dict):
        return out
    for entry in prev.get("ips") or []:
        if isinstance(entry, dict) and isinstance(entry.get("address"), str):
            try:
                out.add(str(ipaddress.ip_interface(entry["address"]).ip))
            except ValueError:
                continue
    return out


# --- errors ---------------------------------------------------------------------------------------------


def error_for(err: NetpluginError, command: str) -> CniError:
    """The CNI error for a netplugin error (see the table in the module docstring)."""
    from .errors import (
        ConfigError,
        DiscoveryError,
        HostError,
        InvalidArgument,
        PluginError,
        PluginInvalid,
        PluginNotFound,
        PluginTimeout,
        StateError,
        SystemFailure,
    )

    details = ""
    if isinstance(err, PluginError):
        # The message already quotes the stderr tail; details carry it verbatim for tooling.
        details = err.stderr_tail or err.stdout_tail
        if "rollback_error" in err.details:
            details += f"\nrollback (teardown) also failed: {err.details['rollback_error']}"
    elif err.details:
        details = json.dumps(err.details, default=str, sort_keys=True)
    if command == "STATUS":
        return CniError(E_UNAVAILABLE, err.message, details)
    if isinstance(err, PluginTimeout):
        code = E_TRY_AGAIN
    elif isinstance(err, PluginError):
        code = E_INTERNAL
    elif isinstance(err, ConfigError | PluginNotFound | PluginInvalid):
        code = E_CONFIG
    elif isinstance(err, InvalidArgument):
        code = E_CONFIG if err.field == "plugin name" else E_ENV
    elif isinstance(err, HostError):
        code = E_TRY_AGAIN
    elif isinstance(err, DiscoveryError | SystemFailure | StateError):
        code = E_IO
    else:
        code = E_INTERNAL
    return CniError(code, err.message, details)


# --- operations -----------------------------------------------------------------------------------------


def _manager(cfg: Config, environ: Mapping[str, str]) -> Manager:
    from .manager import Manager

    return Manager(cfg, environ=dict(environ))


def _version(req: CniRequest) -> dict[str, Any]:
    asked = req.conf.get("cniVersion")
    version = asked if isinstance(asked, str) and asked in SUPPORTED_VERSIONS else LATEST
    return {"cniVersion": version, "supportedVersions": list(SUPPORTED_VERSIONS)}


def _network(req: CniRequest) -> str | None:
    name = req.conf.get("name")
    return name if isinstance(name, str) and name else None


def _add(req: CniRequest, cfg: Config, environ: Mapping[str, str]) -> dict[str, Any]:
    pod = pod_ref_for(req)
    m = _manager(cfg, environ)
    network = _network(req)
    if network:
        att = Attachment(req.container_id, req.ifname, req.netns, pod.namespace, pod.name)
        _record_attachment(cfg, network, att)
    # A failed setup is rolled back by the manager; a failed status after a good setup is left
    # for the DEL that the runtime must send after any failed ADD.
    status = m.setup(pod) or m.status(pod)
    prev = req.conf.get("prevResult")
    return make_result(
        req.cni_version,
        req.ifname,
        req.netns,
        status.ip if status else None,
        cfg.env,
        prev if isinstance(prev, dict) else None,
        # podman rejects a container interface without a MAC ("invalid MAC address")
        mac=link_mac(req.netns, req.ifname),
    )


def _recorded_attachment(cfg: Config, network: str, container_id: str, ifname: str) -> Attachment | None:
    from .errors import InvalidArgument

    path = _attachment_path(cfg.state_dir, network, container_id, ifname)
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read())
        att = Attachment(container_id, ifname, str(doc.get("netns", "")), doc["namespace"], doc["name"])
        _ = att.pod
    except (OSError, ValueError, KeyError, TypeError, InvalidArgument):
        return None  # no (usable) record: the pod is named from this call's arguments
    return att


def _del(req: CniRequest, cfg: Config, environ: Mapping[str, str]) -> None:
    network = _network(req)
    recorded = _recorded_attachment(cfg, network, req.container_id, req.ifname) if network else None
    # The identity ADD used, even if the arguments changed since (podman rename, say), so the
    # teardown takes the same pod lock and removes the same pod record.
    pod = recorded.pod if recorded is not None else pod_ref_for(req)
    _manager(cfg, environ).teardown(pod)
    if network:
        _forget_attachment(cfg, network, req.container_id, req.ifname)


def _check(req: CniRequest, cfg: Config, environ: Mapping[str, str]) -> None:
    prev = req.conf.get("prevResult")
    if not isinstance(prev, dict):
        raise CniError(E_CONFIG, "CHECK needs prevResult in the network config")
    pod = pod_ref_for(req)
    status: PodNetworkStatus | None = _manager(cfg, environ).status(pod)
    if status is None:
        raise CniError(
            E_UNKNOWN_CONTAINER,
            f"network plugin reports no address for container {req.container_id} (pod {pod})",
        )
    expected = _prev_ips(prev)
    if status.ip not in expected:
        raise CniError(
            E_INTERNAL,
            f"pod {pod} has address {status.ip}, but prevResult has {', '.join(sorted(expected)) or 'none'}",
        )


def _status(cfg: Config, environ: Mapping[str, str]) -> None:
    m = _manager(cfg, environ)
    _ = m.plugin
    m.init()


def _valid_attachments(conf: Mapping[str, Any]) -> set[tuple[str, str]]:
    """(containerID, ifname) of ``cni.dev/valid-attachments`` (or the legacy ``cni.dev/attachments``).

    An entry without ifname is ``(containerID, "")``: it keeps every attachment of that container.
    """
    raw = conf.get("cni.dev/valid-attachments")
    if raw is None:
        raw = conf.get("cni.dev/attachments")
    if raw is None:
        raise CniError(E_CONFIG, "GC needs cni.dev/valid-attachments in the network config")
    if not isinstance(raw, list):
        raise CniError(E_CONFIG, "cni.dev/valid-attachments must be a list")
    out: set[tuple[str, str]] = set()
    for entry in raw:
        if not isinstance(entry, dict) or not isinstance(entry.get("containerID"), str):
            raise CniError(E_CONFIG, f"cni.dev/valid-attachments: bad entry {entry!r} (needs containerID)")
        ifname = entry.get("ifname")
        out.add((entry["containerID"], ifname if isinstance(ifname, str) else ""))
    return out


# --- the attachment index: which pods this network set up -------------------------------------------
#
# The state dir's pod records (netplugin.state) do not say which CNI network, if any, made a pod,
# and the CLI and daemon may share the state dir: GC must only touch its own network's pods. So
# ADD records the attachment in <stateDir>/cni/<network>/<containerID>:<ifname>.json before the
# setup runs (an ADD that never returns is still found), and a successful DEL removes it.
# ':' occurs in neither a container id nor an interface name, so the file names are unambiguous.


@dataclass(frozen=True)
class Attachment:
    """One (container, interface) this network was asked to set up."""

    container_id: str
    ifname: str
    netns: str
    namespace: str
    name: str

    @property
    def pod(self) -> PodRef:
        from .names import PodRef

        return PodRef(self.namespace, self.name, self.container_id)

    def to_dict(self) -> dict[str, str]:
        return {
            "containerID": self.container_id,
            "ifname": self.ifname,
            "netns": self.netns,
            "namespace": self.namespace,
            "name": self.name,
        }


def attachment_dir(state_dir: str, network: str) -> str:
    return os.path.join(state_dir, "cni", network)


def _attachment_path(state_dir: str, network: str, container_id: str, ifname: str) -> str:
    return os.path.join(attachment_dir(state_dir, network), f"{container_id}:{ifname}.json")


def _record_attachment(cfg: Config, network: str, att: Attachment) -> None:
    from .fsutil import atomic_write
    from .locks import ensure_dir

    ensure_dir(attachment_dir(cfg.state_dir, network), 0o755)
    path = _attachment_path(cfg.state_dir, network, att.container_id, att.ifname)
    atomic_write(path, json.dumps(att.to_dict()).encode() + b"\n", mode=0o644)


def _forget_attachment(cfg: Config, network: str, container_id: str, ifname: str) -> None:
    from .errors import SystemFailure

    path = _attachment_path(cfg.state_dir, network, container_id, ifname)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise SystemFailure("cannot remove", path, e.strerror or str(e)) from e


def list_attachments(state_dir: str, network: str) -> tuple[list[Attachment], list[str]]:
    """The attachments recorded for ``network``, and the problems met reading them."""
    from .errors import InvalidArgument

    directory = attachment_dir(state_dir, network)
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return [], []
    except OSError as e:
        return [], [f"cannot list {directory}: {e.strerror or e}"]
    found: list[Attachment] = []
    problems: list[str] = []
    for fname in names:
        if not fname.endswith(".json") or ":" not in fname:
            continue  # temp files of a write in progress, or not ours
        path = os.path.join(directory, fname)
        try:
            with open(path, "rb") as f:
                doc = json.loads(f.read())
            att = Attachment(doc["containerID"], doc["ifname"], doc.get("netns", ""), doc["namespace"], doc["name"])
            if not all(isinstance(v, str) for v in att.to_dict().values()):
                raise TypeError("fields must be strings")
            _ = att.pod  # validates the names
        except FileNotFoundError:
            continue  # a DEL removed it meanwhile
        except (OSError, ValueError, KeyError, TypeError, InvalidArgument) as e:
            problems.append(f"{path}: unreadable attachment record ({e})")
            continue
        found.append(att)
    return found, problems


def _gc(req: CniRequest, cfg: Config, environ: Mapping[str, str]) -> None:
    from .errors import NetpluginError

    valid = _valid_attachments(req.conf)
    network = req.conf.get("name")
    if not isinstance(network, str) or not network:
        raise CniError(E_CONFIG, "GC needs the network name in the network config")
    attachments, failures = list_attachments(cfg.state_dir, network)
    for att in attachments:
        if (att.container_id, att.ifname) in valid or (att.container_id, "") in valid:
            continue
        # Tear down in the netns recorded at ADD (usually gone by now; the plugin copes).
        netns = att.netns or NO_NETNS
        sub = replace(cfg, netns_template=netns.replace("{", "{{").replace("}", "}}"))
        try:
            _manager(sub, environ).teardown(att.pod)
            _forget_attachment(cfg, network, att.container_id, att.ifname)
        except NetpluginError as e:
            failures.append(f"{att.pod} (container {att.container_id}, {att.ifname}): {e.message}")
    if failures:
        raise CniError(E_INTERNAL, f"GC: {len(failures)} problem(s); the rest was collected", "; ".join(failures))


def run(environ: Mapping[str, str], stdin: bytes) -> tuple[int, dict[str, Any] | None]:
    """One CNI call: (exit status, JSON document to print or None). Never raises."""
    req: CniRequest | None = None
    try:
        req = parse_request(environ, stdin)
        return 0, _dispatch(req, environ)
    except CniError as e:
        return 1, e.to_dict(req.cni_version if req else _version_of(stdin))
    except Exception as e:  # the runtime must get CNI JSON, never a traceback
        from .errors import NetpluginError

        version = req.cni_version if req else LATEST
        if isinstance(e, NetpluginError):
            return 1, error_for(e, req.command if req else "").to_dict(version)
        return 1, CniError(E_INTERNAL, f"internal error: {type(e).__name__}: {e}").to_dict(version)


def _version_of(stdin: bytes) -> str:
    try:
        v = json.loads(stdin).get("cniVersion")
    except (ValueError, AttributeError, RecursionError):
        return LATEST
    return v if isinstance(v, str) and v in SUPPORTED_VERSIONS else LATEST


def _dispatch(req: CniRequest, environ: Mapping[str, str]) -> dict[str, Any] | None:
    if req.command == "VERSION":
        return _version(req)
    from .errors import NetpluginError

    try:
        cfg = build_config(req, environ)
    except NetpluginError as e:
        if req.command == "STATUS":
            raise CniError(E_UNAVAILABLE, e.message) from None
        raise
    if req.command == "ADD":
        return _add(req, cfg, environ)
    if req.command == "DEL":
        _del(req, cfg, environ)
    elif req.command == "CHECK":
        _check(req, cfg, environ)
    elif req.command == "STATUS":
        _status(cfg, environ)
    else:
        _gc(req, cfg, environ)
    return None


def _log(path: str, entry: Mapping[str, Any]) -> None:
    line = json.dumps(entry, separators=(",", ":"), default=str) + "\n"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    except OSError:
        pass  # a log that cannot be written must not fail the network operation


def _log_path(stdin: bytes) -> str | None:
    try:
        conf = json.loads(stdin)
    except (ValueError, RecursionError):
        return None
    path = conf.get("logFile") if isinstance(conf, dict) else None
    return path if isinstance(path, str) and path else None


def _emit(doc: Mapping[str, Any] | None) -> None:
    if doc is not None:
        sys.stdout.write(json.dumps(doc, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def main(argv: Iterable[str] | None = None) -> NoReturn:
    """Entry point of ``netplugin-cni``: CNI_* from the environment, the config on stdin."""
    del argv  # CNI passes everything in the environment and on stdin
    start = time.monotonic()
    doc: dict[str, Any] | None
    try:
        stdin = sys.stdin.buffer.read()
    except Exception as e:
        stdin = b""
        code, doc = 1, CniError(E_IO, f"cannot read stdin: {e}").to_dict(LATEST)
    else:
        code, doc = run(os.environ, stdin)
    try:
        _emit(doc)
    except Exception:  # stdout closed: nothing left to tell the runtime
        code = code or 1
    log = _log_path(stdin) if stdin else None
    if log:
        env = os.environ
        _log(
            log,
            {
                "time": time.time(),
                "command": env.get("CNI_COMMAND", ""),
                "containerID": env.get("CNI_CONTAINERID", ""),
                "ifname": env.get("CNI_IFNAME", ""),
                "netns": env.get("CNI_NETNS", ""),
                "args": env.get("CNI_ARGS", ""),
                "pid": os.getpid(),
                "ms": round((time.monotonic() - start) * 1000, 1),
                "result": doc if code else "ok",
            },
        )
    sys.exit(code)


if __name__ == "__main__":
    main()
