"""The HTTP side of :class:`netplugin.hosts.kube.KubeHost` (which holds a :class:`KubeTransport`): one
bounded, authenticated GET.

Settings are resolved once (:mod:`netplugin.hosts.kubeconfig`), on first use; the opener is built
once, never follows a redirect (that would send the credentials to another host) and uses the
kubeconfig's ``proxy-url``, else the host's ``proxies``. Credentials become headers at every
request (a token file is re-read: the kubelet rotates it). A GET is bounded by the host's timeout
as a whole, not per read, and by a body size; every transport failure is a :class:`HostError`
naming the URL and the reason, never the credentials.
"""

from __future__ import annotations

import base64
import http.client
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from netplugin import __version__
from netplugin.core.errors import HostError
from netplugin.hosts.kubeconfig import KubeSettings, ssl_context

__all__ = ["MAX_BODY", "USER_AGENT", "KubeTransport", "read_body"]

#: etcd refuses objects over 1.5 MiB, so a larger answer is not a Pod: stop reading it.
MAX_BODY = 8 << 20
USER_AGENT = f"netplugin/{__version__} (kube)"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """The pods API never redirects; following one would send the bearer token to another host."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class KubeTransport:
    """Settings, opener and GET of a host of the Kubernetes API. Thread-safe.

    Built with ``resolve()``, which finds the settings on first use (unless ``settings`` are given
    already resolved), the time limit of a GET and the ``proxies`` (None: the environment's).
    """

    def __init__(
        self,
        resolve: Callable[[], KubeSettings],
        *,
        timeout: float,
        proxies: dict[str, str] | None,
        settings: KubeSettings | None = None,
    ) -> None:
        self._resolve, self.timeout, self.proxies, self._settings = resolve, timeout, proxies, settings
        self._opener: urllib.request.OpenerDirector | None = None
        # Several threads call (the daemon's); settings and opener are built once.
        self._lock = threading.Lock()

    @property
    def settings(self) -> KubeSettings:
        """The resolved settings (raises HostError when there is no usable configuration)."""
        if self._settings is None:
            with self._lock:
                if self._settings is None:
                    self._settings = self._resolve()
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
                        handlers.append(urllib.request.HTTPSHandler(context=ssl_context(s)))
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

    def get(self, url: str, where: str, max_body: int | None = None) -> tuple[int, str, bytes, str | None]:
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
                body = read_body(response, deadline, max_body)
                if body is None:
                    raise self._timed_out(where, url)
        except HostError:
            raise
        except urllib.error.URLError as e:
            raise self._transport_error(e.reason, where, url) from e
        except (OSError, http.client.HTTPException, ValueError) as e:
            raise self._transport_error(e, where, url) from e
        return status, reason, body, location

    def open(self, url: str, where: str, timeout: float) -> Any:
        """A GET of ``url`` left open to be read as a stream (a watch): its response.

        ``timeout`` bounds each read. A non-2xx answer raises ``urllib.error.HTTPError`` (its body
        is the caller's to read); a transport failure, a HostError.
        """
        s = self.settings
        request = urllib.request.Request(url, headers=self._headers(s), method="GET")
        try:
            return self._get_opener(s).open(request, timeout=timeout)
        except urllib.error.HTTPError:
            raise
        except urllib.error.URLError as e:
            raise self._transport_error(e.reason, where, url) from e
        except (OSError, http.client.HTTPException, ValueError) as e:
            raise self._transport_error(e, where, url) from e

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


def read_body(response: Any, deadline: float, limit: int | None = None) -> bytes | None:
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
        limit = MAX_BODY if limit is None else limit
        if total > limit:
            raise ValueError(f"response larger than {limit} bytes")
