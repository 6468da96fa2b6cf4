"""``KubeHost``: pod lookups against a real Kubernetes API server.

The CLI (and the CNI shim) start a fresh process for every pod action, so the
lookup here uses only the standard library: urllib + ssl + json cost a new
process a fraction of what lightkube's import does (BENCHMARKS.md, the CLI cold
start row B-i). lightkube is imported only inside :meth:`KubeHost.kube_client`,
for the long-running daemon and for plugins that want a full client.

How it works, in detail: ``docs/cluster.md``, "The kube host's API requests".
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from netplugin.core._yaml import DocumentError, load_json
from netplugin.core.errors import HostError
from netplugin.core.node import NodeInfo, node_name
from netplugin.hosts.kubeclient import lightkube_client
from netplugin.hosts.kubeconfig import DEFAULT_SERVICE_ACCOUNT_DIR, KubeSettings, resolve_settings
from netplugin.hosts.kubehttp import KubeTransport, read_body
from netplugin.hosts.kubewire import MAX_LIST_BODY, WatchStream, keepalive, parse_list
from netplugin.hosts.nodeobjects import NodeParser
from netplugin.hosts.watch import ClusterCache

__all__ = ["DEFAULT_TIMEOUT", "KubeHost"]

DEFAULT_TIMEOUT = 5.0

log = logging.getLogger(__name__)

Pod = dict[str, Any]


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
        node_name: str | None = None,
    ) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, got {timeout!r}")
        self.kubeconfig = kubeconfig
        self.timeout = float(timeout)
        self.fallback_on_error = fallback_on_error
        self.proxies = None if proxies is None else dict(proxies)
        #: the API's HTTP side: settings resolved once, the opener, each bounded GET
        self.http = KubeTransport(
            lambda: resolve_settings(
                kubeconfig, context=context, environ=environ, service_account_dir=service_account_dir
            ),
            timeout=self.timeout,
            proxies=self.proxies,
            settings=settings,
        )
        #: The error of the most recent call, or None when it succeeded (also set when not falling back).
        self.last_error: HostError | None = None
        self._client: Any | None = None
        # The daemon calls from several threads; the client is built once.
        self._lock = threading.Lock()
        self._node_name = node_name
        #: requests sent, by (verb, resource): the daemon exports them, the benchmark counts them
        self.requests: Counter[tuple[str, str]] = Counter()
        #: the daemon's list+watch caches (see start_watching); None on the CLI path
        self.cache: ClusterCache | None = None
        self._nodes: NodeParser | None = None

    @classmethod
    def from_config(cls, config: Any, **kwargs: Any) -> KubeHost:
        """Build from a :class:`netplugin.core.config.Config` (its ``kubeconfig`` and ``kube_timeout``)."""
        return cls(
            getattr(config, "kubeconfig", None),
            timeout=float(getattr(config, "kube_timeout", DEFAULT_TIMEOUT)),
            **kwargs,
        )

    @property
    def settings(self) -> KubeSettings:
        """The resolved settings (raises HostError when there is no usable configuration)."""
        return self.http.settings

    # -- the Host protocol --

    def get_pod_by_name(self, namespace: str, name: str) -> Pod | None:
        """The Pod as a dict; None when the API says it does not exist (see the module docstring).

        A daemon that watches (:meth:`start_watching`) answers from its cache when the pod is
        there, with no request; a pod not (yet) in the cache is fetched.
        """
        cache = self.cache
        if cache is not None:
            cached = cache.pod(namespace, name)
            if cached is not None:
                return cached
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
        # Names are validated upstream, but a URL is built here: escape anyway ("/" or "?" must not reroute).
        path = "/api/v1/namespaces/{}/pods/{}".format(
            urllib.parse.quote(namespace, safe=""), urllib.parse.quote(name, safe="")
        )
        return self._fetch_object("Pod", path, namespace, name)

    def _fetch_object(self, kind: str, path: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """GET one object: the object, None on 404 with a Status, HostError otherwise."""
        s = self.settings
        url = s.server + path
        what = f"pod {namespace}/{name}" if kind == "Pod" else f"{kind.lower()} {name}"
        where = f"cannot get {what} from {url}"
        self.requests[("get", kind.lower() + "s")] += 1
        status, reason, body, location = self.http.get(url, where)
        doc = _json(body)
        if status == 200:
            if not isinstance(doc, dict):
                raise HostError(
                    f"{where}: answered 200 with a garbage body (not a JSON object): {_snippet(body)}",
                    status=status,
                    url=url,
                )
            meta = doc.get("metadata")
            if doc.get("kind") != kind or not isinstance(meta, dict):
                raise HostError(
                    f"{where}: answered 200 with kind {doc.get('kind')!r}, not a {kind}", status=status, url=url
                )
            if meta.get("name") != name or (namespace is not None and meta.get("namespace", namespace) != namespace):
                got = f"{meta.get('namespace')}/{meta.get('name')}" if namespace is not None else meta.get("name")
                raise HostError(
                    f"{where}: answered with {kind.lower()} {got}, not the one asked for", status=status, url=url
                )
            return doc
        self._raise_status(where, url, status, reason, body, location, allow_404=True, verb="get", kind=kind)
        return None

    def _raise_status(
        self,
        where: str,
        url: str,
        status: int,
        reason: str,
        body: bytes,
        location: str | None,
        *,
        allow_404: bool,
        verb: str,
        kind: str,
    ) -> None:
        """Turn a non-200 answer into a HostError (a 404 with a Status returns when ``allow_404``)."""
        s = self.settings
        doc = _json(body)
        is_status = isinstance(doc, dict) and doc.get("kind") == "Status"
        if status == 404 and allow_404:
            if is_status:
                return
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
            msg += f" (the account needs {verb} on {kind.lower()}s: see etc/kubernetes/rbac.yaml)"
        raise HostError(msg, status=status, url=url)

    # -- nodes --

    @property
    def node_name(self) -> str:
        return node_name(self._node_name)

    def node_info(self) -> NodeInfo:
        """This node from its Node object (the daemon's cache, else a GET); name only when it has none."""
        me = self.node_name
        cache = self.cache
        if cache is not None and cache.nodes.synced.is_set():
            obj = cache.nodes.get(("", me))
        else:
            obj = self._fetch_object("Node", "/api/v1/nodes/" + urllib.parse.quote(me, safe=""), None, me)
        return NodeInfo.from_node(obj) if obj is not None else NodeInfo(me)

    def list_nodes(self) -> list[NodeInfo]:
        """Every node (the daemon's cache, else a LIST), sorted by name.

        A Node that does not parse is left out, and logged once per revision (:meth:`node_problems`).
        """
        cache = self.cache
        if cache is not None and cache.nodes.synced.is_set():
            objs = cache.nodes.items()
        else:
            objs = self.list_collection("/api/v1/nodes", {}).get("items") or []
        if self._nodes is None:
            self._nodes = NodeParser()
        return self._nodes.parse(o for o in objs if isinstance(o, dict))

    def node_problems(self) -> list[tuple[str, str]]:
        """(node, why) for each Node left out: unreadable as a Node, or refused by the list+watch cache."""
        out = self._nodes.problems() if self._nodes is not None else []
        if self.cache is not None:
            out += [(b.name or "(no name)", b.reason) for b in self.cache.nodes.bad_objects()]
        return sorted(out)

    # -- list and watch (the daemon's caches; see netplugin.hosts.watch) --

    def list_collection(self, path: str, query: Mapping[str, str]) -> dict[str, Any]:
        """GET a collection (one page of it); the List object. HostError with ``status`` otherwise."""
        url = self.settings.server + path + ("?" + urllib.parse.urlencode(query) if query else "")
        resource = path.rsplit("/", 1)[-1]
        where = f"cannot list {resource} from {url}"
        self.requests[("list", resource)] += 1
        status, reason, body, location = self.http.get(url, where, max_body=MAX_LIST_BODY)
        if status != 200:
            self._raise_status(where, url, status, reason, body, location, allow_404=False, verb="list", kind=resource)
        try:
            doc = parse_list(body)
        except DocumentError as e:
            raise HostError(f"{where}: answered 200 with a body that cannot be read: it {e}", url=url) from None
        if not isinstance(doc, dict) or not str(doc.get("kind", "")).endswith("List"):
            raise HostError(f"{where}: answered 200 with something that is not a List: {_snippet(body)}", url=url)
        return doc

    def watch_collection(self, path: str, query: Mapping[str, str], timeout: float) -> WatchStream:
        """Open a watch of a collection (``query`` has ``watch=1``); HostError with ``status`` if not 200."""
        url = self.settings.server + path + "?" + urllib.parse.urlencode(query)
        resource = path.rsplit("/", 1)[-1]
        where = f"cannot watch {resource} at {url}"
        self.requests[("watch", resource)] += 1
        try:
            # The socket timeout bounds each read; the server ends the stream after ``timeout``
            # and sends bookmarks meanwhile, so a longer silence means a dead connection.
            response = self.http.open(url, where, timeout + 60)
        except urllib.error.HTTPError as e:
            with e:
                body = read_body(e, time.monotonic() + self.timeout) or b""
            self._raise_status(
                where, url, e.code, str(e.reason), body, None, allow_404=False, verb="watch", kind=resource
            )
            raise AssertionError("unreachable") from None
        sock = keepalive(response)
        return WatchStream(response, sock)

    def start_watching(
        self,
        on_nodes_change: Callable[[], None] | None = None,
        *,
        on_pod_deleted: Callable[[str, str], None] | None = None,
    ) -> ClusterCache:
        """Start the daemon's caches: every Node, and this node's Pods (``spec.nodeName=<node>``).

        From then on node and pod lookups answer from them once they are synced.
        ``on_nodes_change`` is called (on the watch thread) whenever a Node changed,
        ``on_pod_deleted(namespace, name)`` when a Pod of this node was deleted.
        """
        if self.cache is None:
            self.cache = ClusterCache(self, self.node_name, on_nodes_change, on_pod_deleted)
            self.cache.start()
        return self.cache

    def stop_watching(self) -> None:
        cache, self.cache = self.cache, None
        if cache is not None:
            cache.stop()

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

        client = lightkube_client(self.settings, self.timeout, self.proxies)
        with self._lock:
            if self._client is None:
                self._client = client
        return self._client


def _json(body: bytes) -> Any:
    try:
        return load_json(body, duplicates=True)  # bounded depth: no RecursionError from a deep body
    except DocumentError:
        return None


def _snippet(body: bytes, limit: int = 200) -> str:
    text = body[:limit].decode("utf-8", "replace")
    return repr(text + ("..." if len(body) > limit else ""))
