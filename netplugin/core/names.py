"""Plugin-name escaping and every validator of outside input.

Plugin names are Kubernetes *qualified names*: an optional DNS-1123 subdomain
prefix and ``/``, then 1-63 characters of ``[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?``.
On disk a ``/`` cannot be part of a directory name, so a vendored plugin
``vendor.example/foo`` lives in the directory ``vendor.example~foo`` and its
executable is ``vendor.example~foo/foo``.

Pod arguments follow Kubernetes too: a namespace is a DNS-1123 label (at most
63), a pod name a DNS-1123 subdomain (at most 253), and an infra container id
``[A-Za-z0-9][A-Za-z0-9_.-]*`` (CNI's container-id rule) of at most
:data:`MAX_INFRA_ID` characters. CNI sets no length; this limit is what every
consumer can store: the bridge plugins (bash and native) name files after the
infra id plus a temporary-file decoration of up to ~34 bytes, the CNI shim's
attachment records add the interface name, and a file name holds 255 bytes, so
ids of 200-256 characters used to pass here and then fail in a plugin. Runtimes
use 64 hex digits; 128 leaves room for every decoration and for keying by
interface name later.
Validators raise :class:`~netplugin.core.errors.InvalidArgument` naming the field.
"""

from __future__ import annotations

import re

from netplugin.core.errors import InvalidArgument
from netplugin.core.plaindata import dataclass

__all__ = [
    "MAX_INFRA_ID",
    "PodRef",
    "escape_plugin_name",
    "infra_id_digest",
    "node_name_problem",
    "plugin_dir_and_exe",
    "unescape_plugin_name",
    "validate_infra_id",
    "validate_namespace",
    "validate_plugin_name",
    "validate_pod_name",
]

_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_QUALIFIED_NAME_PART = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?\Z")
_INFRA_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\Z")

MAX_LABEL = 63
MAX_SUBDOMAIN = 253
#: The longest infra container id accepted (see the module docstring for why 128).
MAX_INFRA_ID = 128


def _dns1123_label_problem(value: str) -> str | None:
    if not value:
        return "must not be empty"
    if len(value) > MAX_LABEL:
        return f"must be at most {MAX_LABEL} characters (got {len(value)})"
    if not _DNS1123_LABEL.match(value):
        return "must be a DNS-1123 label: lowercase letters, digits and '-', starting and ending alphanumeric"
    return None


def _dns1123_subdomain_problem(value: str) -> str | None:
    if not value:
        return "must not be empty"
    if len(value) > MAX_SUBDOMAIN:
        return f"must be at most {MAX_SUBDOMAIN} characters (got {len(value)})"
    if not _DNS1123_SUBDOMAIN.match(value):
        return (
            "must be a DNS-1123 subdomain: lowercase alphanumeric labels separated by '.', "
            "each starting and ending alphanumeric"
        )
    return None


def plugin_name_problem(name: str) -> str | None:
    """Why ``name`` is not a qualified name, or None if it is one."""
    if not isinstance(name, str) or not name:
        return "must not be empty"
    parts = name.split("/")
    if len(parts) > 2:
        return "must have at most one '/' (an optional DNS-1123 subdomain prefix, then the name)"
    if len(parts) == 2:
        prefix, short = parts
        problem = _dns1123_subdomain_problem(prefix)
        if problem:
            return f"prefix {prefix!r} {problem}"
    else:
        short = parts[0]
    if not short:
        return "name part must not be empty"
    if len(short) > MAX_LABEL:
        return f"name part must be at most {MAX_LABEL} characters (got {len(short)})"
    if not _QUALIFIED_NAME_PART.match(short):
        return "name part must consist of alphanumerics, '-', '_' or '.', starting and ending alphanumeric"
    return None


def validate_plugin_name(name: str) -> str:
    problem = plugin_name_problem(name)
    if problem:
        raise InvalidArgument("plugin name", _shown(name) if isinstance(name, str) else name, problem)
    return name


def escape_plugin_name(name: str) -> str:
    """``vendor.example/foo`` -> ``vendor.example~foo`` (the directory name)."""
    return name.replace("/", "~")


def unescape_plugin_name(dirname: str) -> str:
    """``vendor.example~foo`` -> ``vendor.example/foo`` (every ``~`` stands for ``/``)."""
    return dirname.replace("~", "/")


def plugin_dir_and_exe(name: str) -> tuple[str, str]:
    """(directory name, executable name) for a plugin name."""
    return escape_plugin_name(name), name.rsplit("/", 1)[-1]


def node_name_problem(value: str) -> str | None:
    """Why ``value`` cannot be a Kubernetes node name (a DNS-1123 subdomain), or None."""
    return _dns1123_subdomain_problem(value)


def _shown(value: str) -> str:
    """The value as an error quotes it: a hostile megabyte-long argument is cut."""
    return value if len(value) <= 300 else value[:300] + "..."


def validate_namespace(value: str) -> str:
    problem = _dns1123_label_problem(value)
    if problem:
        raise InvalidArgument("namespace", _shown(value), problem)
    return value


def validate_pod_name(value: str) -> str:
    problem = _dns1123_subdomain_problem(value)
    if problem:
        raise InvalidArgument("pod name", _shown(value), problem)
    return value


def validate_infra_id(value: str) -> str:
    if not value:
        raise InvalidArgument("infra container id", value, "must not be empty")
    if len(value) > MAX_INFRA_ID:
        raise InvalidArgument(
            "infra container id", _shown(value), f"must be at most {MAX_INFRA_ID} characters (got {len(value)})"
        )
    if not _INFRA_ID.match(value):
        raise InvalidArgument(
            "infra container id",
            value,
            "must start with a letter or digit and contain only letters, digits, '_', '.' and '-'",
        )
    return value


@dataclass(frozen=True, slots=True)
class PodRef:
    """A validated (namespace, pod name, infra container id) triple: the arguments of every pod action."""

    namespace: str
    name: str
    infra_id: str

    def __post_init__(self) -> None:
        validate_namespace(self.namespace)
        validate_pod_name(self.name)
        validate_infra_id(self.infra_id)

    @property
    def key(self) -> str:
        """A file-name-safe key for the pod: ``namespace_name`` ('_' occurs in neither part)."""
        return f"{self.namespace}_{self.name}"

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def infra_id_digest(infra_id: str) -> str:
    """FNV-1a-64 of the infra id, 16 hex digits: the per-pod part of the names a plugin gives the
    host's objects (the bash plugins compute the same, so either side finds what the other made)."""
    h = 0xCBF29CE484222325
    for b in infra_id.encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"
