"""List+watch of one Kubernetes collection into a local cache (client-go's reflector, small).

In detail: ``ARCHITECTURE.md``, "Module notes".

An :class:`Informer` keeps :meth:`Informer.items` equal to a collection on the API server
(``/api/v1/nodes``, or ``/api/v1/pods`` with ``fieldSelector=spec.nodeName=<node>``):
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from netplugin.core._yaml import short_repr
from netplugin.core.errors import HostError
from netplugin.hosts.kubewire import BadObject, WatchStream, object_problem, parse_event, parse_list_page

__all__ = [
    "Backoff",
    "ClusterCache",
    "Informer",
    "WatchExpired",
    "WatchTransport",
    "object_key",
    "relist_backoff",
    "slim_node",
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


@dataclass
class Backoff:
    """Exponential backoff with jitter: ``initial``, doubling, at most ``cap`` seconds (+-20 %).

    ``reset_after``: start from ``initial`` again when the previous delay was asked for longer
    ago than that (client-go's ``resetDuration``); None: only :meth:`reset` does.
    """

    initial: float = 0.2
    cap: float = 30.0
    reset_after: float | None = None
    _current: float = 0.0
    _last: float = 0.0

    def next(self) -> float:
        now = time.monotonic()
        if self.reset_after is not None and now - self._last > self.reset_after:
            self._current = 0.0
        self._last = now
        self._current = self.initial if not self._current else min(self.cap, self._current * 2)
        return self._current * random.uniform(0.8, 1.2)

    def reset(self) -> None:
        self._current = 0.0


def relist_backoff() -> Backoff:
    """client-go's reflector: 0.8 s doubling to 30 s, reset after 2 minutes without a relist."""
    return Backoff(initial=0.8, cap=30.0, reset_after=120.0)


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
    bad_objects: int = 0  # left out of the cache now (see Informer.bad_objects)
    last_error: str | None = None
    failing: bool = False  # since the last failure, until a LIST or an event succeeds

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
        relist: Backoff | None = None,
        transform: Callable[[Obj], Obj] | None = None,
    ) -> None:
        self.transport = transport
        self.path = path
        self.field_selector = field_selector
        self.on_change = on_change
        self.name = name or path
        self.watch_timeout = watch_timeout
        self.backoff = backoff or Backoff()
        self.relist = relist or relist_backoff()
        #: what is kept of each object (client-go's SetTransform): the cache holds only what its readers use
        self.transform = transform or (lambda obj: obj)
        self.stats = InformerStats()
        self._bad: dict[Key, BadObject] = {}  # left out of the cache, by key (nameless: ("", reason))
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
            # Synced only while the loop is sound: a cache whose watch keeps failing is stale.
            "synced": self.synced.is_set() and not self.stats.failing,
            "alive": self._thread is not None and self._thread.is_alive(),
            "objects": count,
            "resource_version": self._rv,
            **self.stats.to_dict(),
        }

    # --- life cycle --------------------------------------------------------------------------------

    def bad_objects(self) -> list[BadObject]:
        """The objects the server sent that are not in the cache (too big, too deep, nameless)."""
        with self._lock:
            return sorted(self._bad.values(), key=lambda b: (b.name, b.reason))

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
                self._rv = None
                delay = self.relist.next()
                log.info("%s: %s; listing again in %.1fs", self.name, e, delay)
                self._stop.wait(delay)
            except BaseException as e:
                if self._stop.is_set():
                    return
                self._failed(e)

    def _failed(self, e: BaseException) -> None:
        """Record a failure of the loop, and wait before the next try (the loop goes on)."""
        expected = isinstance(e, (HostError, ValueError, OSError))
        self.stats.failures += 1
        self.stats.failing = True
        try:
            text = getattr(e, "message", None) or f"{type(e).__name__}: {e}"
        except Exception:  # an exception whose str() fails must not end the thread either
            text = type(e).__name__
        self.stats.last_error = short_repr(text, 300) if not isinstance(text, str) else text[:300]
        if not expected:
            # A bug, or something no one planned for (RecursionError, a handler's SystemExit):
            # the cache may be half-updated, so start over from a fresh LIST.
            self._rv = None
            log.error("%s: the watch loop failed: %s", self.name, self.stats.last_error, exc_info=e)
        delay = self.backoff.next()
        log.warning("%s: %s; retrying in %.1fs", self.name, self.stats.last_error, delay)
        self._stop.wait(delay)

    def _recovered(self) -> None:
        if self.stats.failing:
            log.info("%s: the watch works again", self.name)
        self.stats.failing = False
        self.backoff.reset()

    def _list(self) -> None:
        """LIST (page by page) into a fresh store; deliver the difference to the old one."""
        self.stats.lists += 1
        fresh: dict[Key, Obj] = {}
        bad: dict[Key, BadObject] = {}
        rv = ""
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
            page = parse_list_page(doc, self.path)
            rv = rv or page.resource_version
            for obj in page.items:
                fresh[object_key(obj)] = self.transform(obj)
            for b in page.bad:
                bad[b.key] = b
            token = page.token
            if not token:
                break
        with self._lock:
            old, self._store = self._store, fresh
            self._rv = rv
        self._set_bad(bad, replace=True)
        self.synced.set()
        self._recovered()
        for key, obj in fresh.items():
            prev = old.get(key)
            if prev is None:
                self._emit("ADDED", None, obj)
            elif _rv(prev) != _rv(obj):
                self._emit("MODIFIED", prev, obj)
        for key, prev in old.items():
            if key not in fresh:
                self._emit("DELETED", prev, None)

    def _set_bad(self, bad: dict[Key, BadObject], *, replace: bool) -> None:
        """Remember the objects left out; log each when it appears or changes, not at every LIST."""
        with self._lock:
            before = self._bad
            self._bad = bad if replace else {**before, **bad}
            self.stats.bad_objects = len(self._bad)
        for key, b in bad.items():
            if before.get(key) != b:
                log.warning("%s: left out of the cache: %s (revision %s)", self.name, b, b.resource_version or "?")

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
        self._recovered()  # the API answers again; a line that breaks this stream fails it anew
        try:
            with stream:
                if self._stop.is_set():
                    return
                for line in stream:
                    if line.strip():
                        self._apply(*parse_event(line))
                        self._recovered()
        finally:
            self._stream = None
        # The server ended the stream (its timeoutSeconds): watch again at once, from where we are.

    def _apply(self, etype: str, obj: Obj) -> None:
        if etype == "ERROR":
            if obj.get("code") == 410:
                raise WatchExpired(f"watch said: {obj.get('message') or obj.get('reason') or 'Gone'}")
            raise ValueError(
                f"watch {self.path} error {short_repr(obj.get('code'))}: {short_repr(obj.get('message'), 200)}"
            )
        rv = _rv(obj)
        if etype == "BOOKMARK":
            self.stats.bookmarks += 1
            self._rv = rv
            return
        if etype not in ("ADDED", "MODIFIED", "DELETED"):
            raise ValueError(f"watch {self.path}: unknown event type {short_repr(etype)}")
        problem = object_problem(obj)
        if problem is not None:
            self._apply_bad(etype, problem, rv)
            return
        key = object_key(obj)
        obj = self.transform(obj)
        self.stats.events += 1
        with self._lock:
            old = self._store.get(key)
            if etype == "DELETED":
                self._store.pop(key, None)
            else:
                self._store[key] = obj
            self._rv = rv
            gone = self._bad.pop(key, None)
            self.stats.bad_objects = len(self._bad)
        if gone is not None:
            log.info("%s: %s can be read again (or is gone)", self.name, key[1])
        if etype == "DELETED":
            if old is not None:
                self._emit("DELETED", old, None)
        else:
            self._emit("MODIFIED" if old is not None else "ADDED", old, obj)

    def _apply_bad(self, etype: str, problem: BadObject, rv: str) -> None:
        """An event whose object cannot be cached: its older version goes (it is no longer true)."""
        self.stats.events += 1
        with self._lock:
            old = self._store.pop(problem.key, None)
            self._rv = rv
            if etype == "DELETED":
                self._bad.pop(problem.key, None)
                self.stats.bad_objects = len(self._bad)
        if etype != "DELETED":
            self._set_bad({problem.key: problem}, replace=False)
        if old is not None:
            self._emit("DELETED", old, None)

    def _emit(self, etype: str, old: Obj | None, new: Obj | None) -> None:
        if self.on_change is None:
            return
        try:
            self.on_change(etype, old, new)
        except Exception:  # a consumer's bug must not stop the cache
            log.exception("%s: change handler failed on %s", self.name, etype)


def slim_node(obj: Obj) -> Obj:
    """What the daemon reads of a Node (:meth:`NodeInfo.from_node`): a kubelet's Node is mostly
    what it never reads (conditions, images, capacity), and a big cluster's full Nodes would fill its memory."""
    meta = obj.get("metadata") or {}
    keep = ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
    spec, status = obj.get("spec"), obj.get("status")
    slim: Obj = {"metadata": {k: meta[k] for k in keep if k in meta}}
    if isinstance(spec, dict):
        slim["spec"] = {k: spec[k] for k in ("podCIDR", "podCIDRs") if k in spec}
    else:
        slim["spec"] = spec
    if isinstance(status, dict):
        slim["status"] = {k: status[k] for k in ("addresses",) if k in status}
    else:
        slim["status"] = status
    return slim


class ClusterCache:
    """The daemon's view of the cluster: every Node, and the Pods bound to this node."""

    def __init__(
        self,
        transport: WatchTransport,
        node_name: str,
        on_nodes_change: Callable[[], None] | None = None,
        on_pod_deleted: Callable[[str, str], None] | None = None,
    ) -> None:
        def changed(etype: str, old: Obj | None, new: Obj | None) -> None:
            if on_nodes_change is not None:
                on_nodes_change()

        def pod_changed(etype: str, old: Obj | None, new: Obj | None) -> None:
            meta = (old or {}).get("metadata") or {}
            if etype == "DELETED" and on_pod_deleted is not None:
                on_pod_deleted(str(meta.get("namespace", "")), str(meta.get("name", "")))

        self.node_name = node_name
        self.nodes = Informer(transport, "/api/v1/nodes", on_change=changed, name="nodes", transform=slim_node)
        self.pods = Informer(
            transport,
            "/api/v1/pods",
            field_selector=f"spec.nodeName={node_name}",
            name=f"pods on {node_name}",
            on_change=pod_changed,
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
