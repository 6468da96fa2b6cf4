"""Where the API server is and how to authenticate: kubeconfig files and the in-cluster account.

Where the settings come from, first match wins (see :func:`resolve_settings`):

1. the ``kubeconfig`` argument (one path, or several joined with ``:``);
2. ``$KUBECONFIG`` (a ``:``-separated list, merged as kubectl does: for each
   named cluster, user and context the first file that defines it wins);
3. the in-cluster service account, when ``KUBERNETES_SERVICE_HOST`` and
   ``KUBERNETES_SERVICE_PORT`` are set (token, ca.crt and namespace from the
   service account directory);
4. ``~/.kube/config``.

An explicit choice by the operator (1, 2) beats the ambient in-cluster
environment; the in-cluster account beats a home-directory file that may have
been left in an image by accident.
"""

from __future__ import annotations

import base64
import os
import shutil
import ssl
import tempfile
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from netplugin.core._yaml import DocumentError, load_yaml, read_document
from netplugin.core.errors import HostError

__all__ = [
    "DEFAULT_SERVICE_ACCOUNT_DIR",
    "KubeSettings",
    "load_kubeconfig",
    "load_service_account",
    "resolve_settings",
    "ssl_context",
]


DEFAULT_SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


@dataclass(frozen=True)
class KubeSettings:
    """Everything needed to talk to one API server, already resolved and validated.

    Secrets are kept out of ``repr`` so that settings can be logged.
    """

    server: str
    source: str
    ca_file: str | None = None
    ca_data: bytes | None = field(default=None, repr=False)
    insecure: bool = False
    token: str | None = field(default=None, repr=False)
    token_file: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    client_cert_file: str | None = None
    client_key_file: str | None = None
    client_cert_data: bytes | None = field(default=None, repr=False)
    client_key_data: bytes | None = field(default=None, repr=False)
    namespace: str | None = None
    proxy_url: str | None = None

    @property
    def has_client_cert(self) -> bool:
        return bool(self.client_cert_file or self.client_cert_data)


def _check_server(server: Any, where: str) -> str:
    """Normalise the server URL; refuse what urllib would mishandle or what would leak credentials."""
    if not isinstance(server, str) or not server:
        raise HostError(f"{where}: cluster server is missing")
    parts = urllib.parse.urlsplit(server)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise HostError(f"{where}: cluster server {server!r} must be an http:// or https:// URL")
    if parts.username is not None or parts.password is not None:
        # Never echo the URL itself: it holds the credentials.
        raise HostError(f"{where}: cluster server URL must not contain credentials (use a user entry)")
    # A path prefix is kept: some proxies (Rancher, for one) serve the API under one.
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


def _b64(value: Any, key: str, where: str) -> bytes:
    if not isinstance(value, str) or not value.strip():
        raise HostError(f"{where}: {key} must be a base64 string")
    try:
        # kubeconfigs written by hand often wrap the data; base64 tolerates no whitespace in strict mode.
        return base64.b64decode("".join(value.split()), validate=True)
    except ValueError as e:
        raise HostError(f"{where}: {key} is not valid base64: {e}") from None


def _opt_str(entry: Mapping[str, Any], key: str, where: str) -> str | None:
    value = entry.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise HostError(f"{where}: {key} must be a string, got {type(value).__name__}")
    return value


def _named(doc: Mapping[str, Any], section: str, inner: str, path: str) -> dict[str, dict[str, Any]]:
    """``clusters: [{name: x, cluster: {...}}, ...]`` -> ``{x: {...}}`` (first entry of a name wins)."""
    items = doc.get(section) or []
    if not isinstance(items, list):
        raise HostError(f"kubeconfig {path}: {section} must be a list")
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise HostError(f"kubeconfig {path}: every entry of {section} needs a name")
        body = item.get(inner) or {}
        if not isinstance(body, dict):
            raise HostError(f"kubeconfig {path}: {section} entry {item['name']!r}: {inner} must be a mapping")
        out.setdefault(item["name"], {**body, "__dir__": os.path.dirname(os.path.abspath(path))})
    return out


def _rel(entry: Mapping[str, Any], key: str, where: str) -> str | None:
    """A file named in a kubeconfig; relative names are relative to that kubeconfig (as in client-go)."""
    value = _opt_str(entry, key, where)
    if value is None:
        return None
    return os.path.join(str(entry["__dir__"]), os.path.expanduser(value))


#: The largest kubeconfig read (embedded certificates of many clusters stay far below it).
MAX_KUBECONFIG_BYTES = 16 << 20


def _merge_kubeconfigs(files: Sequence[str]) -> _Merged:
    """Read every file; for each named cluster, user and context the first file that defines it wins."""
    merged = _Merged()
    for path in files:
        try:
            raw = read_document(path, MAX_KUBECONFIG_BYTES)  # bounded, never blocks on a FIFO
        except OSError as e:
            raise HostError(f"cannot read kubeconfig {path}: {e.strerror or e}") from e
        except DocumentError as e:
            raise HostError(f"cannot read kubeconfig {path}: it {e}") from None
        try:
            doc = load_yaml(raw)
        except ValueError as e:
            raise HostError(f"kubeconfig {path} is not valid YAML: {e}") from e
        if doc is None:
            continue
        if not isinstance(doc, dict):
            raise HostError(f"kubeconfig {path}: expected a mapping, got {type(doc).__name__}")
        for name, body in _named(doc, "clusters", "cluster", path).items():
            merged.clusters.setdefault(name, body)
        for name, body in _named(doc, "users", "user", path).items():
            merged.users.setdefault(name, body)
        for name, body in _named(doc, "contexts", "context", path).items():
            merged.contexts.setdefault(name, body)
        cc = doc.get("current-context")
        if merged.current is None and isinstance(cc, str) and cc:
            merged.current = cc
    return merged


@dataclass
class _Merged:
    clusters: dict[str, dict[str, Any]] = field(default_factory=dict)
    users: dict[str, dict[str, Any]] = field(default_factory=dict)
    contexts: dict[str, dict[str, Any]] = field(default_factory=dict)
    current: str | None = None


def _cluster_settings(cluster: Mapping[str, Any], cwhere: str) -> dict[str, Any]:
    insecure = cluster.get("insecure-skip-tls-verify", False)
    if not isinstance(insecure, bool):
        raise HostError(f"{cwhere}: insecure-skip-tls-verify must be true or false")
    ca_file = _rel(cluster, "certificate-authority", cwhere)
    ca_data = (
        _b64(cluster["certificate-authority-data"], "certificate-authority-data", cwhere)
        if cluster.get("certificate-authority-data")
        else None
    )
    if insecure and (ca_file or ca_data):
        # kubectl refuses this combination too: the operator cannot have meant both.
        raise HostError(f"{cwhere}: a certificate authority together with insecure-skip-tls-verify")
    return {
        "server": _check_server(cluster.get("server"), cwhere),
        "ca_file": ca_file,
        "ca_data": ca_data,
        "insecure": insecure,
        "proxy_url": _opt_str(cluster, "proxy-url", cwhere),
    }


def _user_settings(user: Mapping[str, Any], uwhere: str) -> dict[str, Any]:
    cert_file = _rel(user, "client-certificate", uwhere)
    key_file = _rel(user, "client-key", uwhere)
    cert_data = (
        _b64(user["client-certificate-data"], "client-certificate-data", uwhere)
        if user.get("client-certificate-data")
        else None
    )
    key_data = _b64(user["client-key-data"], "client-key-data", uwhere) if user.get("client-key-data") else None
    if bool(cert_file or cert_data) != bool(key_file or key_data):
        raise HostError(f"{uwhere}: a client certificate needs both the certificate and the key")
    token = _opt_str(user, "token", uwhere)
    token_file = _rel(user, "tokenFile", uwhere)
    username = _opt_str(user, "username", uwhere)
    has_creds = bool(token or token_file or cert_file or cert_data or username)
    for unsupported in ("exec", "auth-provider"):
        if user.get(unsupported) and not has_creds:
            # Going anonymous instead would turn into a puzzling 401/403 later.
            raise HostError(
                f"{uwhere}: {unsupported} credentials are not supported by netplugin; "
                "use a token, tokenFile or client certificate"
            )
    return {
        "token": token,
        "token_file": token_file,
        "username": username,
        "password": _opt_str(user, "password", uwhere),
        "client_cert_file": cert_file,
        "client_key_file": key_file,
        "client_cert_data": cert_data,
        "client_key_data": key_data,
    }


def load_kubeconfig(paths: str | Sequence[str], context: str | None = None) -> KubeSettings:
    """Settings from one kubeconfig file or the merge of several (``KUBECONFIG`` semantics).

    Every named file must exist (an explicit list that points nowhere is a mistake to report).
    """
    files = [p for p in ([paths] if isinstance(paths, str) else list(paths)) if p]
    if not files:
        raise HostError("no kubeconfig file given")
    merged = _merge_kubeconfigs(files)
    shown = ":".join(files)
    ctx_name = context or merged.current
    if not ctx_name:
        raise HostError(f"kubeconfig {shown} has no current-context (and no context was chosen)")
    ctx = merged.contexts.get(ctx_name)
    if ctx is None:
        raise HostError(f"kubeconfig {shown}: context {ctx_name!r} not found (known: {', '.join(merged.contexts)})")
    where = f"kubeconfig {shown}, context {ctx_name!r}"
    cluster_name = ctx.get("cluster")
    if not isinstance(cluster_name, str) or cluster_name not in merged.clusters:
        raise HostError(f"{where}: cluster {cluster_name!r} not found")
    user_name = ctx.get("user")
    user: dict[str, Any] = {}
    if user_name:
        if not isinstance(user_name, str) or user_name not in merged.users:
            raise HostError(f"{where}: user {user_name!r} not found")
        user = merged.users[user_name]
    cluster = _cluster_settings(merged.clusters[cluster_name], f"{where}, cluster {cluster_name!r}")
    creds = _user_settings(user, f"{where}, user {user_name!r}")
    namespace = ctx.get("namespace")
    return KubeSettings(
        source=where,
        namespace=namespace if isinstance(namespace, str) and namespace else None,
        **cluster,
        **creds,
    )


def load_service_account(
    environ: Mapping[str, str] | None = None, sa_dir: str = DEFAULT_SERVICE_ACCOUNT_DIR
) -> KubeSettings:
    """Settings of a pod's own service account (what client-go's InClusterConfig does)."""
    env = os.environ if environ is None else environ
    host = env.get("KUBERNETES_SERVICE_HOST", "")
    port = env.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise HostError("not in a cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set")
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 service address
    where = f"in-cluster service account {sa_dir}"
    token_file = os.path.join(sa_dir, "token")
    ca_file = os.path.join(sa_dir, "ca.crt")
    for needed in (token_file, ca_file):
        if not os.path.isfile(needed):
            raise HostError(f"{where}: {needed} does not exist (is automountServiceAccountToken off?)")
    namespace: str | None = None
    try:
        with open(os.path.join(sa_dir, "namespace"), encoding="utf-8") as f:
            namespace = f.read().strip() or None
    except OSError:
        pass  # only informational; older clusters did not mount it
    return KubeSettings(
        server=_check_server(f"https://{host}:{port}", where),
        source=where,
        ca_file=ca_file,
        token_file=token_file,
        namespace=namespace,
    )


def resolve_settings(
    kubeconfig: str | None = None,
    *,
    context: str | None = None,
    environ: Mapping[str, str] | None = None,
    service_account_dir: str = DEFAULT_SERVICE_ACCOUNT_DIR,
) -> KubeSettings:
    """Pick the configuration source (see the module docstring for the order)."""
    env = os.environ if environ is None else environ
    if kubeconfig:
        return load_kubeconfig(kubeconfig.split(os.pathsep), context)
    listed = [p for p in env.get("KUBECONFIG", "").split(os.pathsep) if p]
    if listed:
        # kubectl skips missing entries of $KUBECONFIG; only all of them missing is an error.
        present = [p for p in listed if os.path.exists(p)]
        if not present:
            raise HostError(f"KUBECONFIG names no existing file: {env['KUBECONFIG']}")
        return load_kubeconfig(present, context)
    if env.get("KUBERNETES_SERVICE_HOST") and env.get("KUBERNETES_SERVICE_PORT"):
        return load_service_account(env, service_account_dir)
    home = env.get("HOME") or os.path.expanduser("~")
    default = os.path.join(home, ".kube", "config")
    if os.path.exists(default):
        return load_kubeconfig(default, context)
    raise HostError(
        "no Kubernetes API configuration: set the kubeconfig option or KUBECONFIG, "
        f"run in a pod with a service account, or create {default}"
    )


# --- TLS -----------------------------------------------------------------------------------------


def ssl_context(s: KubeSettings) -> ssl.SSLContext:
    """The TLS context the settings ask for (CA, client certificate, or no verification)."""
    try:
        if s.insecure:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        else:
            ctx = ssl.create_default_context(
                cafile=s.ca_file, cadata=s.ca_data.decode("ascii", "replace") if s.ca_data else None
            )
        if s.has_client_cert:
            _load_client_cert(ctx, s)
    except (OSError, ValueError) as e:  # ssl.SSLError is an OSError
        raise HostError(f"{s.source}: cannot set up TLS: {e}") from e
    return ctx


def _load_client_cert(ctx: ssl.SSLContext, s: KubeSettings) -> None:
    """load_cert_chain() only takes file names: put -data fields in a private dir just long enough to load."""
    tmp: str | None = None
    try:
        cert, key = s.client_cert_file, s.client_key_file
        if s.client_cert_data or s.client_key_data:
            tmp = tempfile.mkdtemp(prefix="netplugin-kube-")  # mode 0700: the key never is world-readable
            if s.client_cert_data:
                cert = os.path.join(tmp, "client.crt")
                _write_private(cert, s.client_cert_data)
            if s.client_key_data:
                key = os.path.join(tmp, "client.key")
                _write_private(key, s.client_key_data)
        assert cert is not None and key is not None  # guaranteed by load_kubeconfig
        ctx.load_cert_chain(cert, key)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _write_private(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
