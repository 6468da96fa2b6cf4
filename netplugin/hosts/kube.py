"""``KubeHost``: pod lookups against a real Kubernetes API server.

The CLI (and the CNI shim) start a fresh process for every pod action, so the
lookup here uses only the standard library: urllib + ssl + json cost a new
process about 49 ms against about 238 ms with lightkube (see
shared/reference/python-stack-measurements.md, section 5). lightkube is
imported only inside :meth:`KubeHost.kube_client`, for the long-running daemon
and for plugins that want a full client.

Settings come from :mod:`netplugin.hosts.kubeconfig` (kubeconfig files or the in-cluster account).

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
from collections.abc import Callable, Mapping
from typing import Any

from netplugin.core.errors import HostError
from netplugin.hosts.kubeconfig import DEFAULT_SERVICE_ACCOUNT_DIR, KubeSettings, resolve_settings

__all__ = ["DEFAULT_TIMEOUT", "KubeHost"]

DEFAULT_TIMEOUT = 5.0
#: etcd refuses objects over 1.5 MiB, so a larger answer is not a Pod: stop reading it.
MAX_BODY = 8 << 20
USER_AGENT = "netplugin/0.1.0 (kube)"

log = logging.getLogger(__name__)

Pod = dict[str, Any]


# --- settings: kubeconfig ------------------------------------------------------------------------


# --- settings: in-cluster service account --------------------------------------------------------


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
    """A :class:`~netplugin.hosts.Host` backed by the Kubernetes API.

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
        """Build from a :class:`netplugin.core.config.Config` (its ``kubeconfig`` and ``kube_timeout``)."""
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
    from netplugin.core._yaml import DocumentError, load_json

    try:
        return load_json(body, duplicates=True)  # bounded depth: no RecursionError from a deep body
    except DocumentError:
        return None


def _snippet(body: bytes, limit: int = 200) -> str:
    text = body[:limit].decode("utf-8", "replace")
    return repr(text + ("..." if len(body) > limit else ""))
