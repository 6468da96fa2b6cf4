"""What the API server sends to a list+watch, read within bounds: LIST pages and watch events.

Anyone who can write a Node (a kubelet registers its own) writes part of what every daemon of
the cluster reads, so nothing here trusts the shape or the size of an answer:

* a **LIST page** is bounded by its bytes (:data:`MAX_LIST_BODY`) and its nesting depth, never by
  a node count meant for one config document: a page of real Node objects has far more
  JSON nodes. Each item is then checked on its own (:func:`object_problem`): an object deeper
  than the depth limit or with more than :data:`MAX_OBJECT_NODES` nodes, or without a name or
  revision, is set aside as a :class:`BadObject` (the caller logs it once per revision), and the
  rest of the page is used;
* a **watch line** is bounded by :data:`MAX_EVENT_BYTES`, parsed without recursion errors (the
  depth limit turns a ``[[[[...`` line into a :class:`~netplugin.core._yaml.DocumentError`), and
  must be ``{type, object}``;
* :class:`WatchStream` splits a chunked watch response into lines, refusing a line longer than
  the limit before it is held in memory.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from netplugin.core._yaml import MAX_NODES, DocumentError, load_json, shape_problem

__all__ = [
    "MAX_EVENT_BYTES",
    "MAX_LIST_BODY",
    "MAX_OBJECT_NODES",
    "BadObject",
    "ListPage",
    "WatchStream",
    "keepalive",
    "object_problem",
    "parse_event",
    "parse_list",
    "parse_list_page",
]

#: one page of a LIST (the informers ask for pages of 500 objects; a real Node is 2-20 KB)
MAX_LIST_BODY = 64 << 20
#: one watch event (one object: etcd refuses objects over 1.5 MiB)
MAX_EVENT_BYTES = 8 << 20
#: JSON nodes of one object in a LIST or an event (far more than a kubelet's Node or a Pod has)
MAX_OBJECT_NODES = MAX_NODES

Obj = dict[str, Any]


@dataclass(frozen=True)
class BadObject:
    """An item of a LIST (or a watch event's object) that is not used, and why."""

    name: str  # "" when it has none
    resource_version: str  # "" when it has none
    reason: str
    namespace: str = ""

    @property
    def key(self) -> tuple[str, str]:
        """The cache key of the object it replaces; a nameless one has none (its reason stands in)."""
        return (self.namespace, self.name) if self.name else ("\0", self.reason)

    def __str__(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{where or '(no name)'}: {self.reason}"


@dataclass
class ListPage:
    """One page of a LIST: the usable items, the bad ones, the revision and the continue token."""

    items: list[Obj]
    bad: list[BadObject]
    resource_version: str
    token: str


def _meta_str(obj: Mapping[str, Any], key: str) -> str:
    meta = obj.get("metadata")
    value = meta.get(key) if isinstance(meta, Mapping) else None
    return value if isinstance(value, str) else ""


def object_problem(obj: Any) -> BadObject | None:
    """Why ``obj`` (one item of a LIST or the object of an event) cannot be cached, or None."""
    if not isinstance(obj, dict):
        return BadObject("", "", f"an item is a JSON {type(obj).__name__}, not an object")
    name, rv, ns = _meta_str(obj, "name"), _meta_str(obj, "resourceVersion"), _meta_str(obj, "namespace")
    if not name:
        return BadObject("", rv, "metadata.name is missing or not a string")
    if not rv:
        return BadObject(name, "", "metadata.resourceVersion is missing or not a string", ns)
    problem = shape_problem(obj, MAX_OBJECT_NODES)
    if problem:
        return BadObject(name, rv, f"the object {problem}", ns)
    return None


def parse_list(body: bytes) -> Any:
    """The JSON of a LIST answer, its bytes bounded, not its node count. DocumentError if not JSON.

    The depth of each item is checked by :func:`parse_list_page` (one walk per object, which it
    makes anyway); the parser's own recursion guard bounds the rest, and nothing walks it.
    """
    if len(body) > MAX_LIST_BODY:
        raise DocumentError(f"is larger than the limit of {MAX_LIST_BODY} bytes")
    try:
        return json.loads(body)
    except RecursionError:
        raise DocumentError("is nested too deep for the JSON parser") from None
    except ValueError as e:  # JSONDecodeError, bad UTF-8, huge integers
        raise DocumentError(" ".join(str(e).split())[:200]) from None


def parse_list_page(doc: Any, what: str) -> ListPage:
    """Check a parsed LIST page; ValueError (naming ``what``) when the page itself is unusable."""
    if not isinstance(doc, dict):
        raise ValueError(f"LIST {what}: the answer is not a JSON object")
    items, meta = doc.get("items"), doc.get("metadata")
    if items is None:
        items = []
    if not isinstance(items, list):
        raise ValueError(f"LIST {what}: items is not a list")
    if not isinstance(meta, Mapping):
        raise ValueError(f"LIST {what}: no metadata")
    rv, token = meta.get("resourceVersion"), meta.get("continue") or ""
    if not isinstance(rv, str) or not rv:
        raise ValueError(f"LIST {what}: no metadata.resourceVersion")
    if not isinstance(token, str):
        raise ValueError(f"LIST {what}: metadata.continue is not a string")
    good: list[Obj] = []
    bad: list[BadObject] = []
    for item in items:
        problem = object_problem(item)
        if problem is None:
            good.append(item)
        else:
            bad.append(problem)
    return ListPage(good, bad, rv, token)


def parse_event(line: bytes) -> tuple[str, Obj]:
    """One watch line -> (type, object). ValueError (DocumentError) with the reason when it is not one.

    The object itself is not checked here (an ERROR event carries a Status, a BOOKMARK only a
    revision): see :func:`object_problem`.
    """
    if len(line) > MAX_EVENT_BYTES:
        raise DocumentError(f"a watch event is larger than the limit of {MAX_EVENT_BYTES} bytes")
    try:
        event = load_json(line, duplicates=True, max_nodes=None)
    except DocumentError as e:
        raise DocumentError(f"a watch event {e}") from None
    if not isinstance(event, dict) or not isinstance(event.get("object"), dict):
        raise DocumentError("a watch event is not {type, object}")
    etype = event.get("type")
    if not isinstance(etype, str):
        raise DocumentError("a watch event's type is not a string")
    return etype, event["object"]


class WatchStream:
    """The lines of one watch response; :meth:`abort` (from any thread) ends them.

    ``response`` is an ``http.client.HTTPResponse`` (anything with ``read1`` and ``close``);
    ``sock`` its socket, shut down by :meth:`abort`.
    """

    MAX_LINE = MAX_EVENT_BYTES

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
                raise DocumentError(f"a watch event is larger than the limit of {self.MAX_LINE} bytes")
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
