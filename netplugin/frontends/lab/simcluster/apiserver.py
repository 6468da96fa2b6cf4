"""A small Kubernetes API server for Nodes and Pods: the real REST shapes, in one process.

In detail: ``ARCHITECTURE.md``, "Module notes".

No kube-apiserver can be installed on the machines netplugin is tested on, so the simulated
cluster (tests, benchmarks, ``netplugin demo --nodes``) talks to this instead. It speaks the
parts of the API that netplugin uses, with their real shapes and semantics:
"""

from __future__ import annotations

import base64
import bisect
import copy
import json
import socket
import struct
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from netplugin.frontends.lab.simcluster.apiobjects import (
    KINDS,
    BadRequest,
    Event,
    Selector,
    kubelet_node,
    make_node,
    make_pod,
    resource_of,
    status,
)

__all__ = ["ApiServer", "Event", "kubelet_node", "make_node", "make_pod"]

Obj = dict[str, Any]

class ApiServer:
    """The server; ``url`` once started. Thread-safe: tests mutate while daemons watch."""

    def __init__(
        self,
        *,
        sock: socket.socket | None = None,
        bookmark_interval: float = 1.0,
        history: int = 10_000,
    ) -> None:
        self.bookmark_interval = bookmark_interval
        self.history = history
        self._cond = threading.Condition()
        self._objects: dict[str, dict[tuple[str, str], Obj]] = {r: {} for r in KINDS}
        self._events: list[Event] = []
        self._rv = 100  # as a real server, revisions do not start at 1
        self._oldest = self._rv  # a watch from below this has lost history: 410
        self._generation = 0  # bumped by break_watches(): streams opened before end abruptly
        self._http410_next = 0
        self._http410_always = False
        self._reset = False  # break_watches(reset=True): end streams with a TCP reset
        self._lines: list[bytes] = []  # raw lines sent to every watch open at the time (send_watch_line)
        self._watching = 0  # watch streams open now
        self.forbidden: set[str] = set()  # resources every request for is refused (403), as RBAC would
        self.requests: list[tuple[str, str, str]] = []  # (verb, resource, query) of every request
        self._closed = False
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                owner._handle(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            allow_reuse_address = True

        if sock is None:
            self._httpd = Server(("127.0.0.1", 0), Handler)
        else:
            self._httpd = Server(sock.getsockname()[:2], Handler, bind_and_activate=False)
            self._httpd.socket.close()
            self._httpd.socket = sock
            self._httpd.address_family = sock.family
            sock.listen(128)
        host, port = self._httpd.socket.getsockname()[:2]
        self.url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        self._thread = threading.Thread(
            target=lambda: self._httpd.serve_forever(poll_interval=0.05), name="fake-apiserver", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._httpd.shutdown()
        self._httpd.server_close()

    # --- the store ---------------------------------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        with self._cond:
            return self._rv

    def apply(self, obj: Obj) -> Obj:
        """Create or replace ``obj`` (a Node or a Pod); returns the stored copy with its new revision."""
        resource = resource_of(obj.get("kind"))
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if resource == "pods":
            meta.setdefault("namespace", "default")
        key = (meta.get("namespace", "") if resource == "pods" else "", meta["name"])
        with self._cond:
            old = self._objects[resource].get(key)
            self._rv += 1
            meta["resourceVersion"] = str(self._rv)
            if old is None:
                meta["uid"] = str(uuid.uuid4())
                meta["creationTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            else:
                meta["uid"] = old["metadata"]["uid"]
                meta["creationTimestamp"] = old["metadata"]["creationTimestamp"]
            self._objects[resource][key] = obj
            self._record(Event(self._rv, resource, "ADDED" if old is None else "MODIFIED", obj, old))
            return copy.deepcopy(obj)

    def objects(self, kind: str) -> list[Obj]:
        """Copies of every stored ``kind`` (Node or Pod) object."""
        resource = resource_of(kind)
        with self._cond:
            return [copy.deepcopy(o) for _, o in sorted(self._objects[resource].items())]

    def delete(self, kind: str, name: str, namespace: str = "default") -> bool:
        resource = resource_of(kind)
        key = (namespace if resource == "pods" else "", name)
        with self._cond:
            old = self._objects[resource].pop(key, None)
            if old is None:
                return False
            self._rv += 1
            gone = copy.deepcopy(old)
            gone["metadata"]["resourceVersion"] = str(self._rv)
            self._record(Event(self._rv, resource, "DELETED", gone, old))
            return True

    def _record(self, ev: Event) -> None:
        self._events.append(ev)
        if len(self._events) > self.history:
            dropped = self._events[: len(self._events) - self.history]
            del self._events[: len(dropped)]
            self._oldest = dropped[-1].rv
        self._cond.notify_all()

    # --- faults for tests -------------------------------------------------------------------------------

    def expire_history(self) -> None:
        """Forget every event so far (etcd compaction): a watch from an older revision gets 410."""
        with self._cond:
            self._events.clear()
            self._oldest = self._rv
            self._cond.notify_all()

    def break_watches(self, *, reset: bool = False) -> None:
        """End every open watch stream abruptly (no terminating chunk), as a dropped connection does.

        ``reset``: with a TCP reset (RST), as a crashed server or a middlebox does.
        """
        with self._cond:
            self._generation += 1
            self._reset = reset
            self._cond.notify_all()

    def answer_every_watch_410(self, on: bool = True) -> None:
        """Every watch request gets HTTP 410 Gone while ``on``: a server whose history is always too short."""
        with self._cond:
            self._http410_always = on

    def send_watch_line(self, line: bytes) -> None:
        """Send ``line`` (raw bytes, a newline added) on every watch stream open now: a broken or hostile event."""
        with self._cond:
            self._lines.append(line.rstrip(b"\n") + b"\n")
            self._cond.notify_all()

    def answer_next_watches_410(self, count: int = 1) -> None:
        """The next ``count`` watch requests get HTTP 410 with a Status (instead of an ERROR event)."""
        with self._cond:
            self._http410_next += count

    def wait_watching(self, count: int, timeout: float = 5.0) -> bool:
        """Wait until at least ``count`` watch streams are open (True) or ``timeout`` passes."""
        with self._cond:
            return self._cond.wait_for(lambda: self._watching >= count, timeout)

    def count(self, verb: str | None = None, resource: str | None = None) -> int:
        with self._cond:
            return sum(
                1 for v, r, _ in self.requests if (verb is None or v == verb) and (resource is None or r == resource)
            )

    # --- HTTP ------------------------------------------------------------------------------------------

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        parts = urllib.parse.urlsplit(h.path)
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(parts.query, keep_blank_values=True).items()}
        segs = [urllib.parse.unquote(s) for s in parts.path.strip("/").split("/")]
        namespace: str | None = None
        name: str | None = None
        if segs[:2] != ["api", "v1"]:
            return self._send(h, 404, status(404, "NotFound", "the server could not find the requested resource"))
        rest = segs[2:]
        if len(rest) >= 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        if not rest or rest[0] not in KINDS or len(rest) > 2 or (rest[0] == "nodes" and namespace is not None):
            return self._send(h, 404, status(404, "NotFound", "the server could not find the requested resource"))
        resource = rest[0]
        if len(rest) == 2:
            name = rest[1]
        watch = query.get("watch", "") in ("1", "true")
        verb = "watch" if watch else ("get" if name else "list")
        with self._cond:
            self.requests.append((verb, resource, parts.query))
        if resource in self.forbidden:
            user = "system:serviceaccount:kube-system:netplugin"
            message = f'{resource} is forbidden: User "{user}" cannot {verb} resource "{resource}"'
            return self._send(h, 403, status(403, "Forbidden", message))
        try:
            if name is not None:
                if resource == "pods" and namespace is None:
                    return self._send(
                        h, 404, status(404, "NotFound", "the server could not find the requested resource")
                    )
                return self._get(h, resource, namespace or "", name)
            sel = Selector.parse(resource, query.get("fieldSelector", ""))
            if namespace is not None:
                sel.terms.append(("metadata.namespace", namespace, True))
            if watch:
                return self._watch(h, resource, sel, query)
            return self._list(h, resource, sel, query)
        except BadRequest as e:
            return self._send(h, 400, status(400, "BadRequest", str(e)))

    def _send(self, h: BaseHTTPRequestHandler, code: int, doc: Obj) -> None:
        body = json.dumps(doc).encode()
        h.send_response(code)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def _get(self, h: BaseHTTPRequestHandler, resource: str, namespace: str, name: str) -> None:
        with self._cond:
            obj = copy.deepcopy(self._objects[resource].get((namespace, name)))
        if obj is None:
            what = "pods" if resource == "pods" else "nodes"
            return self._send(
                h, 404, status(404, "NotFound", f'{what} "{name}" not found', {"name": name, "kind": what})
            )
        self._send(h, 200, obj)

    def _list(self, h: BaseHTTPRequestHandler, resource: str, sel: Selector, query: dict[str, str]) -> None:
        """A List; with ``limit``, one page and a ``continue`` token (pages follow the key order).

        Unlike etcd, later pages are read from the current objects, not a snapshot at the first
        page's revision; the token still expires (410) when that revision left the history.
        """
        try:
            limit = int(query.get("limit") or 0)
        except ValueError:
            raise BadRequest(f"invalid limit {query.get('limit')!r}") from None
        after: tuple[str, str] | None = None
        with self._cond:
            rv = self._rv
            if query.get("continue"):
                try:
                    token = json.loads(base64.urlsafe_b64decode(query["continue"]))
                    rv, after = int(token["rv"]), (str(token["ns"]), str(token["name"]))
                except (ValueError, KeyError, TypeError):
                    raise BadRequest("continue key is not valid") from None
                if rv < self._oldest:
                    return self._send(
                        h,
                        410,
                        status(
                            410,
                            "Expired",
                            "The provided continue parameter is too old to display a consistent list result.",
                        ),
                    )
            keys = [
                k
                for k, o in sorted(self._objects[resource].items())
                if sel.matches(resource, o) and (after is None or k > after)
            ]
            more = bool(limit) and len(keys) > limit
            keys = keys[:limit] if limit else keys
            items = [copy.deepcopy(self._objects[resource][k]) for k in keys]
        for item in items:
            item.pop("kind", None)
            item.pop("apiVersion", None)
        meta: Obj = {"resourceVersion": str(rv)}
        if more:
            last = keys[-1]
            meta["continue"] = base64.urlsafe_b64encode(
                json.dumps({"rv": rv, "ns": last[0], "name": last[1]}).encode()
            ).decode()
        self._send(h, 200, {"kind": KINDS[resource] + "List", "apiVersion": "v1", "metadata": meta, "items": items})

    def _watch(self, h: BaseHTTPRequestHandler, resource: str, sel: Selector, query: dict[str, str]) -> None:
        rv_text, since, timeout, bookmarks = _watch_query(query)
        with self._cond:
            if self._http410_next or self._http410_always:
                self._http410_next = max(0, self._http410_next - 1)
                return self._send(
                    h, 410, status(410, "Expired", f"too old resource version: {rv_text} ({self._oldest})")
                )
            generation = self._generation
            initial: list[Obj] = []
            if since is None:
                since = self._rv
                initial = [
                    copy.deepcopy(o) for _, o in sorted(self._objects[resource].items()) if sel.matches(resource, o)
                ]
            expired = since < self._oldest
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        with self._cond:
            self._watching += 1
            self._cond.notify_all()
        try:
            if expired:
                self._chunk(
                    h,
                    {
                        "type": "ERROR",
                        "object": status(410, "Expired", f"too old resource version: {since} ({self._oldest})"),
                    },
                )
                return self._end(h)
            for obj in initial:
                self._chunk(h, {"type": "ADDED", "object": obj})
            for item in self._stream(resource, sel, since, generation, timeout, bookmarks):
                if item is None:
                    if self._reset:
                        h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return  # broken on purpose: no terminating chunk, the connection just closes
                if isinstance(item, bytes):
                    h.wfile.write(b"%x\r\n%s\r\n" % (len(item), item))
                    h.wfile.flush()
                    continue
                self._chunk(h, item)
            self._end(h)
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            h.close_connection = True
            with self._cond:
                self._watching -= 1
                self._cond.notify_all()

    def _stream(
        self, resource: str, sel: Selector, since: int, generation: int, timeout: float, bookmarks: bool
    ) -> Iterator[Obj | bytes | None]:
        deadline = time.monotonic() + timeout
        next_bookmark = time.monotonic() + self.bookmark_interval
        sent = since
        with self._cond:
            lines_sent = len(self._lines)
        while True:
            with self._cond:
                while True:
                    if self._closed or self._generation != generation:
                        yield None
                        return
                    pending = self._events[bisect.bisect_right(self._events, sent, key=lambda e: e.rv) :]
                    raw, lines_sent = self._lines[lines_sent:], len(self._lines)
                    now = time.monotonic()
                    if raw or pending or now >= deadline or (bookmarks and now >= next_bookmark):
                        break
                    self._cond.wait(min(deadline, next_bookmark if bookmarks else deadline) - now)
                rv = self._rv
            yield from raw
            for ev in pending:
                sent = ev.rv
                if ev.resource != resource:
                    continue
                out = self._translate(ev, sel)
                if out is not None:
                    yield out
            now = time.monotonic()
            if bookmarks and now >= next_bookmark:
                next_bookmark = now + self.bookmark_interval
                # Every revision up to rv has been seen (sent, or filtered out): say so.
                sent = max(sent, rv)
                yield {
                    "type": "BOOKMARK",
                    "object": {
                        "kind": KINDS[resource],
                        "apiVersion": "v1",
                        "metadata": {"resourceVersion": str(sent)},
                    },
                }
            if now >= deadline:
                return

    @staticmethod
    def _translate(ev: Event, sel: Selector) -> Obj | None:
        new_in = sel.matches(ev.resource, ev.obj)
        old_in = ev.old is not None and sel.matches(ev.resource, ev.old)
        if ev.type == "DELETED":
            return {"type": "DELETED", "object": ev.obj} if old_in else None
        if ev.type == "ADDED":
            return {"type": "ADDED", "object": ev.obj} if new_in else None
        if new_in and old_in:
            return {"type": "MODIFIED", "object": ev.obj}
        if new_in:
            return {"type": "ADDED", "object": ev.obj}
        if old_in:
            return {"type": "DELETED", "object": ev.obj}
        return None

    @staticmethod
    def _chunk(h: BaseHTTPRequestHandler, doc: Obj) -> None:
        data = json.dumps(doc).encode() + b"\n"
        h.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        h.wfile.flush()

    @staticmethod
    def _end(h: BaseHTTPRequestHandler) -> None:
        h.wfile.write(b"0\r\n\r\n")
        h.wfile.flush()


def _watch_query(query: dict[str, str]) -> tuple[str, int | None, float, bool]:
    """A watch's (resourceVersion as sent, as a number or None for "now", timeoutSeconds, allowWatchBookmarks)."""
    rv_text = query.get("resourceVersion", "")
    bookmarks = query.get("allowWatchBookmarks", "") in ("1", "true")
    try:
        timeout = float(query.get("timeoutSeconds", "1800"))
    except ValueError:
        raise BadRequest(f"invalid timeoutSeconds {query.get('timeoutSeconds')!r}") from None
    try:
        since = int(rv_text) if rv_text not in ("", "0") else None
    except ValueError:
        raise BadRequest(f"invalid resourceVersion {rv_text!r}") from None
    return rv_text, since, timeout, bookmarks
