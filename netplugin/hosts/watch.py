"""List+watch of one Kubernetes collection into a local cache (client-go's reflector, small).

An :class:`Informer` keeps :meth:`Informer.items` equal to a collection on the API server
(``/api/v1/nodes``, or ``/api/v1/pods`` with ``fieldSelector=spec.nodeName=<node>``):

* it LISTs once, remembers the list's ``resourceVersion``, then WATCHes from there with
  ``allowWatchBookmarks=true`` and a ``timeoutSeconds`` spread over 5-10 minutes (so that a
  fleet of daemons does not reconnect in step);
* every event moves the cache and the remembered revision; ``BOOKMARK`` events move only
  the revision, so a quiet collection does not fall out of the server's history;
* a stream that ends (the server's timeout) is watched again at once from the remembered
  revision, so no event is lost; a broken stream or a failed request is retried with
  exponential backoff (0.2 s doubling to 30 s, with jitter), reset by the next good event;
* a ``410 Gone`` (the revision left the server's history), as an HTTP status or as an
  ``ERROR`` event, LISTs again: the new list replaces the cache, and the difference is
  delivered as ADDED/MODIFIED/DELETED, so a consumer never misses a deletion it slept through.

The transport is the host's (:class:`WatchTransport`): the standard library's HTTP client in
:class:`~netplugin.hosts.kube.KubeHost`. This module starts threads, so only the daemon uses it.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import random
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from netplugin.core.errors import HostError

__all__ = [
    "Backoff",
    "ClusterCache",
    "Informer",
    "WatchExpired",
    "WatchStream",
    "WatchTransport",
    "keepalive",
    "object_key",
]

log = logging.getLogger("netplugin.watch")

#: objects per LIST page (as client-go's reflector: big clusters are listed in pieces)
LIST_PAGE = 500

Obj = dict[str, Any]
Key = tuple[str, str]
#: (event type, old object or None, new object or None); called on the informer's thread.
Handler = Callable[[str, Obj | None, Obj | None], None]


class WatchExpired(Exception):
    """The server no longer has the revision we watch from (410 Gone): list again."""


class WatchTransport(Protocol):
    """What an informer needs from a host's HTTP client."""

    def list_collection(self, path: str, query: Mapping[str, str]) -> Obj:
        """GET ``path?query`` -> the List object. HostError (with ``status``) on any failure."""
        ...

    def watch_collection(self, path: str, query: Mapping[str, str], timeout: float) -> WatchStream:
        """GET ``path?query`` (``watch=1`` is in query) -> the open stream.

        HostError (with ``status``) when the answer is not 200, 410 included.
        """
        ...


class WatchStream:
    """The lines of one watch response; :meth:`abort` (from any thread) ends them.

    ``response`` is an ``http.client.HTTPResponse`` (anything with ``read1`` and ``close``);
    ``sock`` its socket, shut down by :meth:`abort`.
    """

    MAX_LINE = 8 << 20  # a Node or Pod is far below etcd's 1.5 MiB limit

    def __init__(self, response: Any, sock: Any | None) -> None:
        self._response = response
        self._sock = sock
        self.aborted = False

    def __enter__(self) -> WatchStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._response.close()

    def abort(self) -> None:
        self.aborted = True
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)

    def __iter__(self) -> Iterator[bytes]:
        # read1(), not readline(): on a chunked response readline() reports a connection dropped
        # mid-stream as a clean end, read1() raises IncompleteRead, and the informer must know.
        buf = b""
        while True:
            nl = buf.find(b"\n")
            if nl >= 0:
                line, buf = buf[: nl + 1], buf[nl + 1 :]
                yield line
                continue
            if len(buf) > self.MAX_LINE:
                raise ValueError(f"watch event larger than {self.MAX_LINE} bytes")
            try:
                chunk = self._response.read1(64 * 1024)
            except (http.client.HTTPException, OSError, ValueError) as e:
                if self.aborted:
                    return
                raise ConnectionError(f"watch stream broken: {type(e).__name__}: {e}") from None
            if not chunk:
                if buf.strip():
                    raise ConnectionError("watch stream broken: connection closed inside an event")
                return
            buf += chunk


@dataclass
class Backoff:
    """Exponential backoff with jitter: ``initial``, doubling, at most ``cap`` seconds."""

    initial: float = 0.2
    cap: float = 30.0
    _current: float = 0.0

    def next(self) -> float:
        self._current = self.initial if not self._current else min(self.cap, self._current * 2)
        return self._current * random.uniform(0.8, 1.2)

    def reset(self) -> None:
        self._current = 0.0


def object_key(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
        raise ValueError("object without metadata.name")
    return (str(meta.get("namespace") or ""), meta["name"])


def _rv(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    rv = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
    if not isinstance(rv, str) or not rv:
        raise ValueError("object without metadata.resourceVersion")
    return rv


@dataclass
class InformerStats:
    lists: int = 0
    watches: int = 0
    relists: int = 0  # after a 410
    failures: int = 0
    events: int = 0
    bookmarks: int = 0
    last_error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


class Informer:
    """A cache of one collection kept current by list+watch, on a thread of its own."""

    def __init__(
        self,
        transport: WatchTransport,
        path: str,
        *,
        field_selector: str = "",
        on_change: Handler | None = None,
        name: str = "",
        watch_timeout: tuple[float, float] = (300.0, 600.0),
        backoff: Backoff | None = None,
    ) -> None:
        self.transport = transport
        self.path = path
        self.field_selector = field_selector
        self.on_change = on_change
        self.name = name or path
        self.watch_timeout = watch_timeout
        self.backoff = backoff or Backoff()
        self.stats = InformerStats()
        #: set once the first LIST is in the cache (and stays set across relists)
        self.synced = threading.Event()
        self._store: dict[Key, Obj] = {}
        self._rv: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._stream: WatchStream | None = None
        self._thread: threading.Thread | None = None

    # --- reading the cache (any thread) -----------------------------------------------------------

    def get(self, key: Key) -> Obj | None:
        with self._lock:
            return self._store.get(key)

    def items(self) -> list[Obj]:
        with self._lock:
            return list(self._store.values())

    @property
    def resource_version(self) -> str | None:
        return self._rv

    def status(self) -> dict[str, Any]:
        with self._lock:
            count = len(self._store)
        return {
            "path": self.path,
            "field_selector": self.field_selector,
            "synced": self.synced.is_set(),
            "objects": count,
            "resource_version": self._rv,
            **self.stats.to_dict(),
        }

    # --- life cycle --------------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"watch {self.name}", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        stream = self._stream
        if stream is not None:
            stream.abort()
        if self._thread is not None:
            self._thread.join(timeout)

    def wait_synced(self, timeout: float) -> bool:
        return self.synced.wait(timeout)

    # --- the loop (informer thread) ------------------------------------------------------------

    def _query(self, **params: str) -> dict[str, str]:
        q = {k: v for k, v in params.items() if v}
        if self.field_selector:
            q["fieldSelector"] = self.field_selector
        return q

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self._rv is None:
                    self._list()
                self._watch()
            except WatchExpired as e:
                self.stats.relists += 1
                log.info("%s: %s; listing again", self.name, e)
                self._rv = None
            except (HostError, ValueError, OSError) as e:
                if self._stop.is_set():
                    return
                self.stats.failures += 1
                self.stats.last_error = getattr(e, "message", None) or f"{type(e).__name__}: {e}"
                delay = self.backoff.next()
                log.warning("%s: %s; retrying in %.1fs", self.name, self.stats.last_error, delay)
                self._stop.wait(delay)

    def _list(self) -> None:
        """LIST (page by page) into a fresh store; deliver the difference to the old one."""
        self.stats.lists += 1
        fresh: dict[Key, Obj] = {}
        rv: Any = None
        token = ""
        while True:
            try:
                doc = self.transport.list_collection(
                    self.path, self._query(limit=str(LIST_PAGE), **{"continue": token})
                )
            except HostError as e:
                if token and e.details.get("status") == 410:
                    raise WatchExpired("the LIST's continue token expired") from None
                raise
            items = doc.get("items")
            meta = doc.get("metadata")
            if not isinstance(items, list) and items is not None:
                raise ValueError(f"LIST {self.path}: items is not a list")
            if not isinstance(meta, Mapping):
                raise ValueError(f"LIST {self.path}: no metadata")
            rv = rv or meta.get("resourceVersion")
            for obj in items or []:
                if not isinstance(obj, dict):
                    raise ValueError(f"LIST {self.path}: an item is not an object")
                fresh[object_key(obj)] = obj
            token = str(meta.get("continue") or "")
            if not token:
                break
        if not isinstance(rv, str) or not rv:
            raise ValueError(f"LIST {self.path}: no metadata.resourceVersion")
        with self._lock:
            old, self._store = self._store, fresh
            self._rv = rv
        self.synced.set()
        for key, obj in fresh.items():
            prev = old.get(key)
            if prev is None:
                self._emit("ADDED", None, obj)
            elif _rv(prev) != _rv(obj):
                self._emit("MODIFIED", prev, obj)
        for key, prev in old.items():
            if key not in fresh:
                self._emit("DELETED", prev, None)

    def _watch(self) -> None:
        self.stats.watches += 1
        timeout = random.uniform(*self.watch_timeout)
        query = self._query(
            watch="1",
            resourceVersion=self._rv or "",
            allowWatchBookmarks="true",
            timeoutSeconds=str(int(timeout)),
        )
        try:
            stream = self.transport.watch_collection(self.path, query, timeout)
        except HostError as e:
            if e.details.get("status") == 410:
                raise WatchExpired(f"watch answered HTTP 410 Gone: {e.message}") from None
            raise
        self._stream = stream
        try:
            with stream:
                if self._stop.is_set():
                    return
                for line in stream:
                    if line.strip():
                        self._apply(json.loads(line))
                        self.backoff.reset()
        finally:
            self._stream = None
        # The server ended the stream (its timeoutSeconds): watch again at once, from where we are.

    def _apply(self, event: Any) -> None:
        if not isinstance(event, dict) or not isinstance(event.get("object"), dict):
            raise ValueError(f"watch {self.path}: an event is not {{type, object}}")
        etype, obj = event.get("type"), event["object"]
        if etype == "ERROR":
            if obj.get("code") == 410:
                raise WatchExpired(f"watch said: {obj.get('message') or obj.get('reason') or 'Gone'}")
            raise ValueError(f"watch {self.path} error {obj.get('code')}: {obj.get('message')}")
        rv = _rv(obj)
        if etype == "BOOKMARK":
            self.stats.bookmarks += 1
            self._rv = rv
            return
        if etype not in ("ADDED", "MODIFIED", "DELETED"):
            raise ValueError(f"watch {self.path}: unknown event type {etype!r}")
        key = object_key(obj)
        self.stats.events += 1
        with self._lock:
            old = self._store.get(key)
            if etype == "DELETED":
                self._store.pop(key, None)
            else:
                self._store[key] = obj
            self._rv = rv
        if etype == "DELETED":
            if old is not None:
                self._emit("DELETED", old, None)
        else:
            self._emit("MODIFIED" if old is not None else "ADDED", old, obj)

    def _emit(self, etype: str, old: Obj | None, new: Obj | None) -> None:
        if self.on_change is None:
            return
        try:
            self.on_change(etype, old, new)
        except Exception:  # a consumer's bug must not stop the cache
            log.exception("%s: change handler failed on %s", self.name, etype)


def keepalive(response: Any) -> socket.socket | None:
    """The socket under an urllib response, with TCP keepalive on (a dead peer shows in about a minute).

    None when the socket cannot be found (then a watch cannot be aborted early; it ends at its timeout).
    """
    raw = getattr(getattr(response, "fp", None), "raw", None)
    sock = getattr(raw, "_sock", None)
    if not isinstance(sock, socket.socket):
        return None
    with contextlib.suppress(OSError, AttributeError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 30)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 10)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
    return sock


class ClusterCache:
    """The daemon's view of the cluster: every Node, and the Pods bound to this node."""

    def __init__(
        self, transport: WatchTransport, node_name: str, on_nodes_change: Callable[[], None] | None = None
    ) -> None:
        def changed(etype: str, old: Obj | None, new: Obj | None) -> None:
            if on_nodes_change is not None:
                on_nodes_change()

        self.node_name = node_name
        self.nodes = Informer(transport, "/api/v1/nodes", on_change=changed, name="nodes")
        self.pods = Informer(
            transport, "/api/v1/pods", field_selector=f"spec.nodeName={node_name}", name=f"pods on {node_name}"
        )

    def start(self) -> None:
        self.nodes.start()
        self.pods.start()

    def stop(self) -> None:
        self.nodes.stop()
        self.pods.stop()

    def wait_synced(self, timeout: float) -> bool:
        return self.nodes.wait_synced(timeout) and self.pods.wait_synced(timeout)

    def pod(self, namespace: str, name: str) -> Obj | None:
        """The pod from the cache, or None (not synced yet, or not here: the caller asks the API)."""
        return self.pods.get((namespace, name)) if self.pods.synced.is_set() else None

    def status(self) -> dict[str, Any]:
        return {"nodes": self.nodes.status(), "pods": self.pods.status()}
