"""The CNI protocol as the shim speaks it: requests, versions and their rules, error codes.

Version rules, as libcni applies them (``libcni`` only sends a command to a plugin whose
config version supports it): ``CHECK`` needs a config ``cniVersion`` >= 0.4.0, ``STATUS``
and ``GC`` >= 1.1.0; an older version gets error code 1 (incompatible version).
:func:`check_version_rules` enforces them after :func:`parse_request`.
"""

from __future__ import annotations

# Imports inside this module's functions are kept for the per-call import set
# (tests/frontends/fastpath.py): each keeps a module off the calls that do not need it
# (BENCHMARKS.md rows B-i and B: the CLI's cold start and per-pod run without a daemon).
import json
import os
import re
from collections.abc import Mapping
from typing import Any

from netplugin.core._yaml import DocumentError, load_json, short_repr
from netplugin.core.errors import ConfigError, InvalidArgument, NetpluginError, PluginError
from netplugin.core.names import validate_infra_id
from netplugin.core.plaindata import dataclass, field
from netplugin.frontends.wire.codes import (
    CNI_DECODE_FAILURE,
    CNI_INCOMPATIBLE_VERSION,
    CNI_INVALID_CONFIG,
    CNI_INVALID_ENV,
    CNI_IO_FAILURE,
    CNI_PLUGIN_UNAVAILABLE,
    cni_code_for_classes,
    error_classes,
)
from netplugin.frontends.wire.protocol import CNI_COMMANDS, CNI_VERSIONS, MAX_STDIN

__all__ = [
    "COMMANDS",
    "DEFAULT_NAMESPACE",
    "LATEST",
    "MAX_STDIN",
    "NO_NETNS",
    "SUPPORTED_VERSIONS",
    "CniError",
    "CniRequest",
    "check_version_rules",
    "error_for",
    "parse_cni_args",
    "parse_request",
]

SUPPORTED_VERSIONS = CNI_VERSIONS


LATEST = SUPPORTED_VERSIONS[-1]


#: every CNI command, in spec order (their table: :data:`~netplugin.frontends.wire.protocol.CNI_COMMANDS`)
COMMANDS = tuple(CNI_COMMANDS)


#: NETPLUGIN_NETNS when the runtime gives no netns: ENOTDIR for any open, so it never exists.
NO_NETNS = "/dev/null/no-netns"


DEFAULT_NAMESPACE = "default"


#: what the kernel and ``ip`` accept as a name, in ASCII (dev_valid_name: no '/', ':' or space)
_IFNAME_OK = re.compile(r"[!-~]+\Z")
_IFNAME_BAD = re.compile(r"[/:\s]")
#: IFNAMSIZ less the NUL
MAX_IFNAME = 15


_NETWORK_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*\Z")


class CniError(Exception):
    """An error the shim reports to the runtime as CNI error JSON."""

    def __init__(self, code: int, msg: str, details: str = "") -> None:
        super().__init__(msg)
        self.code = code
        self.msg = msg
        self.details = details
        #: the version to answer in (the network config's when it names a supported one)
        self.cni_version = LATEST

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
    #: DEL only: why the attachment's ADD must have been refused (then DEL does nothing and succeeds)
    refused: str = ""

    @property
    def cni_version(self) -> str:
        v = self.conf.get("cniVersion")
        return v if isinstance(v, str) and v in SUPPORTED_VERSIONS else LATEST


def parse_cni_args(raw: str) -> dict[str, str]:
    """``K=V;K=V`` -> dict. Empty pieces are ignored; a piece without ``=`` is error 4."""
    out: dict[str, str] = {}
    for piece in raw.split(";"):
        if not piece:
            continue
        key, sep, value = piece.partition("=")
        if not sep or not key:
            raise CniError(CNI_INVALID_ENV, f"invalid CNI_ARGS {short_repr(raw)}: {short_repr(piece)} is not KEY=VALUE")
        out[key] = value
    return out


def _ifname_problem(name: str) -> str | None:
    if not name:
        return "must not be empty"
    if _IFNAME_BAD.search(name):
        return "must not contain '/', ':' or whitespace"
    if not _IFNAME_OK.match(name):
        return "must be printable ASCII"
    if len(name) > MAX_IFNAME:
        return f"must be at most {MAX_IFNAME} bytes (IFNAMSIZ)"
    if name in (".", ".."):
        return "must not be '.' or '..'"
    return None


def _prev_result_problem(prev: Any) -> str | None:
    """Why ``prevResult`` is not a CNI result this shim can extend, or None (chaining, spec "Result")."""
    if not isinstance(prev, dict):
        return f"must be an object (got {short_repr(prev)})"
    for key, kind in (("interfaces", list), ("ips", list), ("routes", list), ("dns", dict)):
        value = prev.get(key)
        if value is not None and not isinstance(value, kind):
            return f"{key} must be {'a list' if kind is list else 'an object'} (got {short_repr(value)})"
    for key in ("interfaces", "ips", "routes"):
        for i, entry in enumerate(prev.get(key) or []):
            if not isinstance(entry, dict):
                return f"{key}[{i}] must be an object (got {short_repr(entry)})"
    for i, entry in enumerate(prev.get("ips") or []):
        address = entry.get("address")
        if not isinstance(address, str):
            return f"ips[{i}].address must be a CIDR string (got {short_repr(address)})"
        import ipaddress

        try:
            ipaddress.ip_interface(address)
        except ValueError:
            return f"ips[{i}].address must be a CIDR string (got {short_repr(address)})"
        index = entry.get("interface")
        if index is not None and (isinstance(index, bool) or not isinstance(index, int) or index < 0):
            return f"ips[{i}].interface must be an interface index (got {short_repr(index)})"
    return None


def parse_request(environ: Mapping[str, str], stdin: bytes) -> CniRequest:
    """Read and check what the runtime gave us. Raises :class:`CniError` (codes 1, 4, 6, 7).

    The network config is parsed once, first: an error about anything else still answers in
    the config's ``cniVersion`` (the CniError's ``cni_version``).
    """
    command = environ.get("CNI_COMMAND", "")
    req = CniRequest(command=command)
    text = stdin.strip()
    bad_conf: CniError | None = None
    if text or command != "VERSION":
        try:
            req.conf = _read_conf(text)
        except CniError as e:
            bad_conf = e
    try:
        if command not in COMMANDS:
            if not command:
                raise CniError(CNI_INVALID_ENV, "CNI_COMMAND is not set", f"expected one of {', '.join(COMMANDS)}")
            raise CniError(
                CNI_INVALID_ENV, f"unknown CNI_COMMAND {short_repr(command)}", f"expected one of {', '.join(COMMANDS)}"
            )
        if bad_conf is not None:
            raise bad_conf
        return _check_request(req, environ)
    except CniError as e:
        e.cni_version = req.cni_version
        raise


def _read_conf(text: bytes) -> dict[str, Any]:
    if len(text) > MAX_STDIN:  # too large, whatever it holds: said so, not "not JSON"
        raise CniError(CNI_IO_FAILURE, f"network config on stdin is too large (more than {MAX_STDIN} bytes)")
    try:  # bounded depth; duplicate keys: the last one wins, as in libcni (Go)
        conf = load_json(text, duplicates=True)
    except DocumentError as e:
        raise CniError(CNI_DECODE_FAILURE, f"network config on stdin is not JSON: {e}") from None
    if not isinstance(conf, dict):
        raise CniError(CNI_DECODE_FAILURE, f"network config must be a JSON object, got {type(conf).__name__}")
    return conf


def _check_request(req: CniRequest, environ: Mapping[str, str]) -> CniRequest:
    command = req.command
    version = req.conf.get("cniVersion")
    if command == "VERSION":
        return req
    if version is None:
        raise CniError(
            CNI_INCOMPATIBLE_VERSION, "network config has no cniVersion", f"supported: {', '.join(SUPPORTED_VERSIONS)}"
        )
    if version not in SUPPORTED_VERSIONS:
        raise CniError(
            CNI_INCOMPATIBLE_VERSION,
            f"incompatible CNI version {short_repr(version)}",
            f"supported: {', '.join(SUPPORTED_VERSIONS)}",
        )
    name = req.conf.get("name")
    if name is not None and (not isinstance(name, str) or not _NETWORK_NAME.match(name)):
        raise CniError(
            CNI_INVALID_CONFIG, f"invalid network name {short_repr(name)}", "must match ^[a-zA-Z0-9][a-zA-Z0-9_.-]*$"
        )
    if command in ("STATUS", "GC"):
        req.netns = environ.get("CNI_NETNS", "")
        req.path = environ.get("CNI_PATH", "")
        req.args = parse_cni_args(environ.get("CNI_ARGS", ""))
        return req
    # ADD, DEL, CHECK
    req.container_id = environ.get("CNI_CONTAINERID", "")
    try:
        validate_infra_id(req.container_id)
    except InvalidArgument as e:
        raise CniError(CNI_INVALID_ENV, f"invalid CNI_CONTAINERID {short_repr(req.container_id)}: {e.reason}") from None
    req.ifname = environ.get("CNI_IFNAME", "")
    problem = _ifname_problem(req.ifname)
    if problem and command == "DEL":
        # ADD refused this name, so nothing of the attachment exists: DEL succeeds without running.
        req.refused = f"invalid CNI_IFNAME {short_repr(req.ifname)}: {problem}"
        return req
    if problem:
        raise CniError(CNI_INVALID_ENV, f"invalid CNI_IFNAME {short_repr(req.ifname)}: {problem}")
    if command != "DEL" and "prevResult" in req.conf:
        problem = _prev_result_problem(req.conf["prevResult"])
        if problem:
            raise CniError(CNI_INVALID_CONFIG, f"invalid prevResult: {problem}")
    req.netns = environ.get("CNI_NETNS", "")
    if command != "DEL":
        if not req.netns:
            raise CniError(CNI_INVALID_ENV, f"CNI_NETNS is required for {command}")
        if not os.path.exists(req.netns):
            raise CniError(CNI_INVALID_ENV, f"CNI_NETNS {short_repr(req.netns)} does not exist")
    req.args = parse_cni_args(environ.get("CNI_ARGS", ""))
    req.path = environ.get("CNI_PATH", "")
    return req


#: the lowest config cniVersion for which libcni sends each command (older ones: code 1)
MIN_VERSION = {"CHECK": "0.4.0", "STATUS": "1.1.0", "GC": "1.1.0"}


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def check_version_rules(req: CniRequest) -> None:
    """Error code 1 when the config's cniVersion predates the command (see the module docstring)."""
    need = MIN_VERSION.get(req.command)
    version = req.conf.get("cniVersion")
    if need is None or not isinstance(version, str) or version not in SUPPORTED_VERSIONS:
        return
    if version_tuple(version) < version_tuple(need):
        raise CniError(
            CNI_INCOMPATIBLE_VERSION,
            f"incompatible CNI version {version!r} for {req.command}",
            f"{req.command} needs a config cniVersion of {need} or later",
        )


def error_for(err: NetpluginError, command: str) -> CniError:
    """The CNI error for a netplugin error: :data:`~netplugin.frontends.wire.codes.CNI_CODES`, except
    that STATUS reports any but a config error as "plugin unavailable", and a bad plugin name is a config error."""
    details = ""
    if isinstance(err, PluginError):
        # The message already quotes the stderr tail; details carry it verbatim for tooling.
        details = err.stderr_tail or err.stdout_tail
        if "rollback_error" in err.details:
            details += f"\nrollback (teardown) also failed: {err.details['rollback_error']}"
    elif err.details:
        details = json.dumps(err.details, default=str, sort_keys=True)
    if command == "STATUS" and not isinstance(err, ConfigError):
        return CniError(CNI_PLUGIN_UNAVAILABLE, err.message, details)
    if isinstance(err, InvalidArgument) and err.field == "plugin name":
        return CniError(CNI_INVALID_CONFIG, err.message, details)
    return CniError(cni_code_for_classes(error_classes(type(err))), err.message, details)
