"""``KubeHost``: pod lookups against a real Kubernetes API server.

The CLI (and the CNI shim) start a fresh process for every pod action, so the
lookup here uses only the standard library: urllib + ssl + json cost a new
process about 49 ms against about 238 ms with lightkube (see
shared/reference/python-stack-measurements.md, section 5). lightkube is
imported only inside :meth:`KubeHost.kube_client`, for the long-running daemon
and for plugins that want a full client.

Where the settings come from, first match wins:

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

Supported: the kubeconfig's current context (or ``context=``), ``server``
over ``https`` (``certificate-authority``, ``certificate-authority-data`` or
``insecure-skip-tls-verify``) or plain ``http``; users with ``token``,
``tokenFile`` (re-read at every request, because the kubelet rotates projected
service-account tokens), ``client-certificate``/``client-key`` (files or
``-data``), ``username``/``password`` (sent as HTTP basic auth, as kubectl
does), or no credentials at all. ``exec`` and ``auth-provider`` users are
refused with a clear error rather than silently sent anonymously.

Outcomes of :meth:`KubeHost.get_pod_by_name`:

* 200 with a Pod -> the pod as a dict;
* 404 with a Kubernetes ``Status`` body -> ``None``: the pod does not exist,
  and the manager runs the plugin without pod JSON (the kubelet did the same);
* anything else (401, 403, other 4xx, 5xx, a redirect, a timeout, a refused
  connection, TLS failures, a body that is not a Pod) -> :class:`HostError`
  naming the URL (never credentials) and the reason.

With ``fallback_on_error=True`` those errors become ``None`` ("pod unknown"),
the error is kept in :attr:`KubeHost.last_error` and logged as a warning, so a
node whose API server is down can still wire pods that do not need pod data.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import os
import shutil
import ssl
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import HostError

__all__ = [
    "DEFAULT_SERVICE_ACCOUNT_DIR",
    "DEFAULT_TIMEOUT",
    "KubeHost",
    "KubeSettings",
    "load_kubeconfig",
    "load_service_account",
    "resolve_settings",
]

DEFAULT_SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
DEFAULT_TIMEOUT = 5.0
#: etcd refuses objects over 1.5 MiB, so a larger answer is not a Pod: stop reading it.
MAX_BODY = 8 << 20
USER_AGENT = "netplugin/0.1.0 (kube)"

log = logging.getLogger(__name__)

Pod = dict[str, Any]


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


# --- settings: kubeconfig ------------------------------------------------------------------------


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


def load_kubeconfig(paths: str | Sequence[str], context: str | None = None) -> KubeSettings:
    """Settings from one kubeconfig file or the merge of several (``KUBECONFIG`` semantics).

    Every named file must exist (an explicit list that points nowhere is a mistake to report).
    """
    from ._yaml import load_yaml

    files = [p for p in ([paths] if isinstance(paths, str) else list(paths)) if p]
    if not files:
        raise HostError("no kubeconfig file given")
    clusters: dict[str, dict[str, Any]] = {}
    users: dict[str, dict[str, Any]] = {}
    contexts: dict[str, dict[str, Any]] = {}
    current: str | None = None
    for path in files:
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except OSError as e:
            raise HostError(f"cannot read kubeconfig {path}: {e.strerror or e}") from e
        try:
            doc = load_yaml(raw)
        except ValueError as e:
            raise HostError(f"kubeconfig {path} is not valid YAML: {e}") from e
        if doc is None:
            continue
        if not isinstance(doc, dict):
            raise HostError(f"kubeconfig {path}: expected a mapping, got {type(doc).__name__}")
        for name, body in _named(doc, "clusters", "cluster", path).items():
            clusters.setdefault(name, body)
        for name, body in _named(doc, "users", "user", path).items():
            users.setdefault(name, body)
        for name, body in _named(doc, "contexts", "context", path).items():
            contexts.setdefault(name, body)
        cc = doc.get("current-context")
        if current is None and isinstance(cc, str) and cc:
            current = cc
    shown = ":".join(files)
    ctx_name = context or current
    if not ctx_name:
        raise HostError(f"kubeconfig {shown} has no current-context (and no context was chosen)")
    ctx = contexts.get(ctx_name)
    if ctx is None:
        raise HostError(f"kubeconfig {shown}: context {ctx_name!r} not found (known: {', '.join(contexts)})")
    where = f"kubeconfig {shown}, context {ctx_name!r}"
    cluster_name = ctx.get("cluster")
    if not isinstance(cluster_name, str) or cluster_name not in clusters:
        raise HostError(f"{where}: cluster {cluster_name!r} not found")
    cluster = clusters[cluster_name]
    user_name = ctx.get("user")
    user: dict[str, Any] = {}
    if user_name:
        if not isinstance(user_name, str) or user_name not in users:
            raise HostError(f"{where}: user {user_name!r} not found")
        user = users[user_name]
    cwhere = f"{where}, cluster {cluster_name!r}"
    uwhere = f"{where}, user {user_name!r}"

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
    password = _opt_str(user, "password", uwhere)
    has_creds = bool(token or token_file or cert_file or cert_data or username)
    for unsupported in ("exec", "auth-provider"):
        if user.get(unsupported) and not has_creds:
            # Going anonymous instead would turn into a puzzling 401/403 later.
            raise HostError(
                f"{uwhere}: {unsupported} credentials are not supported by netplugin; "
                "use a token, tokenFile or client certificate"
            )
    namespace = ctx.get("namespace")
    return KubeSettings(
        server=_check_server(cluster.get("server"), cwhere),
        source=where,
        ca_file=ca_file,
        ca_data=ca_data,
        insecure=insecure,
        token=token,
        token_file=token_file,
        username=username,
        password=password,
        client_cert_file=cert_file,
        client_key_file=key_file,
        client_cert_data=cert_data,
        client_key_data=key_data,
        namespace=namespace if isinstance(namespace, str) and namespace else None,
        proxy_url=_opt_str(cluster, "proxy-url", cwhere),
    )


# --- settings: in-cluster service account --------------------------------------------------------


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


def _ssl_context(s: KubeSettings) -> ssl.SSLContext:
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


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """The pods API never redirects; following one would send the bearer token to another host."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


# --- the host ------------------------------------------------------------------------------------


class KubeHost:
    """A :class:`~netplugin.host.Host` backed by the Kubernetes API.

    Settings are resolved on first use, not in the constructor, so that a missing or
    broken kubeconfig goes through ``fallback_on_error`` like any other failure to
    answer. ``settings=`` skips that resolution (for callers that already have them).

    ``proxies``: None uses the ``HTTP(S)_PROXY``/``NO_PROXY`` environment like kubectl;
    ``{}`` disables proxies (tests do this). A kubeconfig ``proxy-url`` wins over both.
    """

    def __init__(
        self,
        kubeconfig: str | None = None,
        *,
        context: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        fallback_on_error: bool = False,
        environ: Mapping[str, str] | None = None,
        service_account_dir: str = DEFAULT_SERVICE_ACCOUNT_DIR,
        proxies: Mapping[str, str] | None = None,
        settings: KubeSettings | None = None,
    ) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, got {timeout!r}")
        self.kubeconfig = kubeconfig
        self.context = context
        self.timeout = float(timeout)
        self.fallback_on_error = fallback_on_error
        self.environ = environ
        self.service_account_dir = service_account_dir
        self.proxies = None if proxies is None else dict(proxies)
        #: The error of the most recent call, or None when it succeeded (also set when not falling back).
        self.last_error: HostError | None = None
        self._settings = settings
        self._opener: urllib.request.OpenerDirector | None = None
        self._client: Any | None = None
        # The daemon calls from several threads; settings, opener and client are built once.
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, config: Any, **kwargs: Any) -> KubeHost:
        """Build from a :class:`netplugin.config.Config` (its ``kubeconfig`` and ``kube_timeout``)."""
        return cls(
            getattr(config, "kubeconfig", None),
            timeout=float(getattr(config, "kube_timeout", DEFAULT_TIMEOUT)),
            **kwargs,
        )

    # -- settings and transport --

    @property
    def settings(self) -> KubeSettings:
        """The resolved settings (raises HostError when there is no usable configuration)."""
        if self._settings is None:
            with self._lock:
                if self._settings is None:
                    self._settings = resolve_settings(
                        self.kubeconfig,
                        context=self.context,
                        environ=self.environ,
                        service_account_dir=self.service_account_dir,
                    )
        return self._settings

    def _get_opener(self, s: KubeSettings) -> urllib.request.OpenerDirector:
        if self._opener is None:
            with self._lock:
                if self._opener is None:
                    if s.proxy_url:
                        proxies: dict[str, str] | None = {"http": s.proxy_url, "https": s.proxy_url}
                    else:
                        proxies = self.proxies
                    handlers: list[urllib.request.BaseHandler] = [
                        urllib.request.ProxyHandler(proxies),
                        _NoRedirect(),
                    ]
                    if s.server.startswith("https:"):
                        handlers.append(urllib.request.HTTPSHandler(context=_ssl_context(s)))
                    self._opener = urllib.request.build_opener(*handlers)
        return self._opener

    def _headers(self, s: KubeSettings) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        token = s.token
        if s.token_file:
            # Like client-go, the file wins over an inline token; it is re-read because it rotates.
            try:
                with open(s.token_file, encoding="utf-8") as f:
                    token = f.read().strip()
            except OSError as e:
                raise HostError(f"{s.source}: cannot read token file {s.token_file}: {e.strerror or e}") from e
            if not token:
                raise HostError(f"{s.source}: token file {s.token_file} is empty")
        if token:
            headers["Authorization"] = f"Bearer {token}"
        elif s.username is not None and s.password is not None:
            pair = base64.b64encode(f"{s.username}:{s.password}".encode()).decode("ascii")
            headers["Authorization"] = f"Basic {pair}"
        return headers

    def _timed_out(self, where: str, url: str) -> HostError:
        return HostError(f"{where}: timed out after {self.timeout:g}s", url=url)

    def _get(self, url: str, where: str) -> tuple[int, str, bytes, str | None]:
        """GET url -> (status, reason, body, Location). Transport failures are HostErrors."""
        s = self.settings
        request = urllib.request.Request(url, headers=self._headers(s), method="GET")
        opener = self._get_opener(s)
        deadline = time.monotonic() + self.timeout
        try:
            try:
                response: Any = opener.open(request, timeout=self.timeout)
            except urllib.error.HTTPError as e:
                # Non-2xx answers still carry a body (a Kubernetes Status) worth reading.
                response = e
            with response:
                status = int(response.status)
                reason = str(getattr(response, "reason", "") or http.client.responses.get(status, ""))
                location = response.headers.get("Location") if response.headers else None
                body = _read_body(response, deadline)
                if body is None:
                    raise self._timed_out(where, url)
        except HostError:
            raise
        except urllib.error.URLError as e:
            raise self._transport_error(e.reason, where, url) from e
        except (OSError, http.client.HTTPException, ValueError) as e:
            raise self._transport_error(e, where, url) from e
        return status, reason, body, location

    def _transport_error(self, reason: object, where: str, url: str) -> HostError:
        if isinstance(reason, TimeoutError):
            return self._timed_out(where, url)
        if isinstance(reason, ConnectionRefusedError):
            why = "connection refused (is the API server running and the server address right?)"
        elif isinstance(reason, ssl.SSLCertVerificationError):
            why = f"TLS certificate verification failed: {reason.verify_message or reason.reason}"
        elif isinstance(reason, ssl.SSLError):
            why = f"TLS error: {reason.reason or reason}"
        elif isinstance(reason, http.client.HTTPException):
            why = f"bad HTTP response: {type(reason).__name__}: {reason}"
        elif isinstance(reason, OSError):
            why = str(reason.strerror or reason)
        else:
            why = str(reason)
        return HostError(f"{where}: {why}", url=url)

    # -- the Host protocol --

    def get_pod_by_name(self, namespace: str, name: str) -> Pod | None:
        """The Pod as a dict; None when the API says it does not exist (see the module docstring)."""
        try:
            pod = self._fetch_pod(namespace, name)
        except HostError as e:
            self.last_error = e
            if not self.fallback_on_error:
                raise
            log.warning("%s; treating pod %s/%s as unknown (fallback_on_error)", e, namespace, name)
            return None
        self.last_error = None
        return pod

    def _fetch_pod(self, namespace: str, name: str) -> Pod | None:
        s = self.settings
        # Names are validated upstream, but a URL is built here: escape anyway ("/" or "?" must not reroute).
        path = "/api/v1/namespaces/{}/pods/{}".format(
            urllib.parse.quote(namespace, safe=""), urllib.parse.quote(name, safe="")
        )
        url = s.server + path
        where = f"cannot get pod {namespace}/{name} from {url}"
        status, reason, body, location = self._get(url, where)
        doc = _json(body)
        if status == 200:
            if not isinstance(doc, dict):
                raise HostError(
                    f"{where}: answered 200 with a garbage body (not a JSON object): {_snippet(body)}",
                    status=status,
                    url=url,
                )
            kind = doc.get("kind")
            meta = doc.get("metadata")
            if kind != "Pod" or not isinstance(meta, dict):
                raise HostError(f"{where}: answered 200 with kind {kind!r}, not a Pod", status=status, url=url)
            if meta.get("name") != name or meta.get("namespace", namespace) != namespace:
                raise HostError(
                    f"{where}: answered with pod {meta.get('namespace')}/{meta.get('name')}, not the one asked for",
                    status=status,
                    url=url,
                )
            return doc
        is_status = isinstance(doc, dict) and doc.get("kind") == "Status"
        if status == 404:
            if is_status:
                return None
            # A real API server always answers 404 with a Status; anything else is a wrong server address.
            raise HostError(
                f"{where}: HTTP 404 without a Kubernetes Status body "
                f"(is {s.server} a Kubernetes API server?): {_snippet(body)}",
                status=status,
                url=url,
            )
        if is_status and isinstance(doc, dict) and doc.get("message"):
            detail = str(doc["message"])
        else:
            detail = _snippet(body) if body else "(empty body)"
        msg = f"{where}: HTTP {status} {reason}: {detail}"
        if 300 <= status < 400:
            msg += f" (redirect to {location or '?'} not followed)"
        elif status == 401:
            msg += f" (check the credentials of {s.source})"
        elif status == 403:
            msg += " (the account needs get on pods: see etc/kubernetes/rbac.yaml)"
        raise HostError(msg, status=status, url=url)

    def kube_client(self) -> Any | None:
        """A lightkube ``Client`` with the same settings, built on first use.

        lightkube is imported here and only here so that the CLI never pays for it.
        """
        try:
            return self._build_client()
        except HostError as e:
            self.last_error = e
            if not self.fallback_on_error:
                raise
            log.warning("%s; no Kubernetes client (fallback_on_error)", e)
            return None

    def _build_client(self) -> Any:
        if self._client is not None:
            return self._client
        s = self.settings
        try:
            import httpx2
            from lightkube import Client
            from lightkube.config.kubeconfig import KubeConfig
            from lightkube.config.models import Cluster, User
        except ImportError as e:
            raise HostError(
                f"a Kubernetes client needs lightkube, which is not importable ({e}); "
                "install netplugin[daemon] (lightkube>=1.0,<2)"
            ) from e

        def b64(data: bytes | None) -> str | None:
            return base64.b64encode(data).decode("ascii") if data else None

        cluster = Cluster(
            server=s.server,
            certificate_auth=s.ca_file,
            certificate_auth_data=b64(s.ca_data),
            insecure=s.insecure,
        )
        # lightkube asserts a user exists even for anonymous access, hence User() rather than None.
        user = User(
            token=s.token,
            token_file=s.token_file,
            username=s.username,
            password=s.password,
            client_cert=s.client_cert_file,
            client_key=s.client_key_file,
            client_cert_data=b64(s.client_cert_data),
            client_key_data=b64(s.client_key_data),
        )
        config = KubeConfig.from_one(cluster=cluster, user=user, namespace=s.namespace)
        proxy = s.proxy_url
        if proxy is None and self.proxies:
            proxy = self.proxies.get("https") or self.proxies.get("http")
        try:
            client = Client(
                config=config,
                timeout=httpx2.Timeout(self.timeout),
                trust_env=self.proxies is None,
                proxy=proxy,
            )
        except Exception as e:  # lightkube raises assorted types (ConfigError, KeyError, ssl errors)
            raise HostError(f"{s.source}: cannot build a lightkube client: {type(e).__name__}: {e}") from e
        with self._lock:
            if self._client is None:
                self._client = client
        return self._client


def _read_body(response: Any, deadline: float) -> bytes | None:
    """Read at most MAX_BODY bytes; None when the overall deadline passes.

    The socket timeout bounds each read only; a server trickling bytes would
    otherwise hold the lookup far past its timeout. read1() returns after one
    socket read, so the deadline is checked often.
    """
    read: Callable[[int], bytes] = getattr(response, "read1", None) or response.read
    chunks: list[bytes] = []
    total = 0
    while True:
        if time.monotonic() > deadline:
            return None
        chunk = read(64 * 1024)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
        if total > MAX_BODY:
            raise ValueError(f"response larger than {MAX_BODY} bytes")


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:  # also covers UnicodeDecodeError
        return None


def _snippet(body: bytes, limit: int = 200) -> str:
    text = body[:limit].decode("utf-8", "replace")
    return repr(text + ("..." if len(body) > limit else ""))
