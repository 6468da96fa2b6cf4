"""The simulated cluster's API server speaks the Kubernetes REST shapes netplugin relies on."""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from netplugin.frontends.lab.simcluster.apiserver import ApiServer, make_node, make_pod


@pytest.fixture
def api() -> Iterator[ApiServer]:
    server = ApiServer(bookmark_interval=0.2)
    yield server
    server.close()


def get(api: ApiServer, path: str, **query: str) -> tuple[int, Any]:
    url = api.url + path + ("?" + urllib.parse.urlencode(query) if query else "")
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


class Watch:
    """A watch stream read on a thread, so tests can act while it runs."""

    def __init__(self, api: ApiServer, path: str, **query: str) -> None:
        query = {"watch": "1", **query}
        self.response = urllib.request.urlopen(api.url + path + "?" + urllib.parse.urlencode(query), timeout=10)
        self.events: list[dict[str, Any]] = []
        self.ended: str | None = None
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        buf = b""
        try:
            while chunk := self.response.read1(65536):  # raises IncompleteRead when the stream breaks
                buf += chunk
                *lines, buf = buf.split(b"\n")
                self.events += [json.loads(line) for line in lines]
            self.ended = "clean"
        except (http.client.HTTPException, OSError) as e:
            self.ended = f"broken: {type(e).__name__}"

    def wait(self, n: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while len(self.events) < n and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.events

    def join(self, timeout: float = 5.0) -> None:
        self._thread.join(timeout)

    def types(self) -> list[tuple[str, str]]:
        return [(e["type"], e["object"]["metadata"].get("name", "")) for e in self.events if e["type"] != "BOOKMARK"]


def test_get_and_not_found_status(api: ApiServer) -> None:
    api.apply(make_node("n1", ["10.206.129.0/24"], ["10.206.0.11"]))
    status, node = get(api, "/api/v1/nodes/n1")
    assert status == 200 and node["kind"] == "Node" and node["spec"]["podCIDRs"] == ["10.206.129.0/24"]
    assert node["metadata"]["resourceVersion"] and node["metadata"]["uid"]
    status, doc = get(api, "/api/v1/nodes/nope")
    assert status == 404
    assert doc["kind"] == "Status" and doc["reason"] == "NotFound" and doc["code"] == 404
    assert doc["details"] == {"name": "nope", "kind": "nodes"}
    api.apply(make_pod("ns1", "p1", "n1"))
    status, pod = get(api, "/api/v1/namespaces/ns1/pods/p1")
    assert status == 200 and pod["spec"]["nodeName"] == "n1"
    assert get(api, "/api/v1/namespaces/other/pods/p1")[0] == 404


def test_list_has_revision_and_bare_items(api: ApiServer) -> None:
    for i in (1, 2):
        api.apply(make_node(f"n{i}", [], []))
    status, doc = get(api, "/api/v1/nodes")
    assert status == 200 and doc["kind"] == "NodeList" and doc["apiVersion"] == "v1"
    assert doc["metadata"]["resourceVersion"] == str(api.resource_version)
    assert [i["metadata"]["name"] for i in doc["items"]] == ["n1", "n2"]
    assert all("kind" not in i for i in doc["items"])  # as the real server: list items carry no kind


def test_field_selectors(api: ApiServer) -> None:
    api.apply(make_pod("a", "p1", "n1"))
    api.apply(make_pod("b", "p2", "n2"))
    api.apply(make_pod("b", "p3", "n1"))
    names = lambda doc: sorted(i["metadata"]["name"] for i in doc["items"])  # noqa: E731
    assert names(get(api, "/api/v1/pods", fieldSelector="spec.nodeName=n1")[1]) == ["p1", "p3"]
    assert names(get(api, "/api/v1/pods", fieldSelector="spec.nodeName!=n1")[1]) == ["p2"]
    assert names(get(api, "/api/v1/namespaces/b/pods", fieldSelector="spec.nodeName==n1")[1]) == ["p3"]
    status, doc = get(api, "/api/v1/pods", fieldSelector="spec.bogus=1")
    assert status == 400 and doc["reason"] == "BadRequest" and "field label not supported: spec.bogus" in doc["message"]


def test_watch_from_revision_streams_changes_in_order(api: ApiServer) -> None:
    api.apply(make_node("n1", [], []))
    rv = api.resource_version
    api.apply(make_node("n2", [], []))
    w = Watch(api, "/api/v1/nodes", resourceVersion=str(rv))
    assert w.response.headers["Transfer-Encoding"] == "chunked"
    api.apply(make_node("n1", ["10.206.129.0/24"], []))
    api.delete("Node", "n2")
    w.wait(3)
    assert w.types() == [("ADDED", "n2"), ("MODIFIED", "n1"), ("DELETED", "n2")]
    revs = [int(e["object"]["metadata"]["resourceVersion"]) for e in w.events if e["type"] != "BOOKMARK"]
    assert revs == sorted(revs) and revs[0] > rv
    assert all(e["object"]["kind"] == "Node" for e in w.events)


def test_watch_without_revision_starts_with_the_state(api: ApiServer) -> None:
    api.apply(make_node("n1", [], []))
    w = Watch(api, "/api/v1/nodes")
    assert [t for t in w.wait(1)[:1]] and w.types()[:1] == [("ADDED", "n1")]


def test_bookmarks_carry_progress_and_timeout_ends_cleanly(api: ApiServer) -> None:
    rv = api.resource_version
    w = Watch(api, "/api/v1/nodes", resourceVersion=str(rv), allowWatchBookmarks="true", timeoutSeconds="1")
    api.apply(make_pod("x", "unrelated", "n9"))  # another collection moves the revision
    w.join(5)
    assert w.ended == "clean"
    marks = [e for e in w.events if e["type"] == "BOOKMARK"]
    assert marks and marks[-1]["object"]["metadata"]["resourceVersion"] == str(api.resource_version)
    assert set(marks[-1]["object"]) == {"kind", "apiVersion", "metadata"}
    w2 = Watch(api, "/api/v1/nodes", resourceVersion=str(rv), timeoutSeconds="1")
    w2.join(5)
    assert not [e for e in w2.events if e["type"] == "BOOKMARK"]  # only when asked for


def test_selector_entering_and_leaving_become_added_and_deleted(api: ApiServer) -> None:
    api.apply(make_pod("d", "p", "n2"))
    w = Watch(api, "/api/v1/pods", resourceVersion=str(api.resource_version), fieldSelector="spec.nodeName=n1")
    api.apply(make_pod("d", "p", "n1"))
    api.apply({**make_pod("d", "p", "n1"), "status": {"phase": "Running"}})
    api.apply(make_pod("d", "p", "n3"))
    api.apply(make_pod("d", "other", "n3"))
    w.wait(3)
    time.sleep(0.1)
    assert w.types() == [("ADDED", "p"), ("MODIFIED", "p"), ("DELETED", "p")]


def test_expired_revision_is_410_in_stream_or_as_http(api: ApiServer) -> None:
    api.apply(make_node("n1", [], []))
    old = api.resource_version
    api.apply(make_node("n2", [], []))
    api.expire_history()
    w = Watch(api, "/api/v1/nodes", resourceVersion=str(old))
    w.join(5)
    [ev] = w.events
    assert ev["type"] == "ERROR" and ev["object"]["kind"] == "Status"
    assert ev["object"]["code"] == 410 and ev["object"]["reason"] == "Expired"
    api.answer_next_watches_410()
    status, doc = get(api, "/api/v1/nodes", watch="1", resourceVersion=str(api.resource_version))
    assert status == 410 and doc["kind"] == "Status" and doc["code"] == 410


def test_broken_watch_ends_without_final_chunk(api: ApiServer) -> None:
    w = Watch(api, "/api/v1/nodes", resourceVersion=str(api.resource_version))
    assert api.wait_watching(1)
    api.break_watches()
    w.join(5)
    assert w.ended is not None and w.ended.startswith("broken")


def test_requests_are_counted_by_verb(api: ApiServer) -> None:
    get(api, "/api/v1/nodes")
    get(api, "/api/v1/nodes/x")
    Watch(api, "/api/v1/nodes", timeoutSeconds="1").join(5)
    assert (api.count("list"), api.count("get"), api.count("watch")) == (1, 1, 1)
    assert api.count(resource="pods") == 0
