"""The daemon's list+watch caches against the simulated cluster's API server (real HTTP, real streams).

Every test that breaks something checks that no event was lost: the cache ends equal to the
server's objects, and the change handler saw every change, deletions made while the watch was
down included.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from netplugin.core.errors import HostError
from netplugin.core.node import NodeInfo
from netplugin.frontends.lab.simcluster.apiserver import ApiServer, make_node, make_pod
from netplugin.hosts.watch import Backoff, Informer, object_key
from tests.support.waits import WITHIN, wait_for

from .conftest import host_for

Event = tuple[str, str]


class Recorder:
    def __init__(self) -> None:
        self.events: list[Event] = []

    def __call__(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        obj = new if new is not None else old
        assert obj is not None
        self.events.append((etype, obj["metadata"]["name"]))


@pytest.fixture
def nodes(api: ApiServer) -> Iterator[tuple[Informer, Recorder]]:
    for i in (1, 2):
        api.apply(make_node(f"n{i}", [f"10.206.{128 + i}.0/24"], [f"10.206.0.{10 + i}"]))
    rec = Recorder()
    inf = Informer(host_for(api), "/api/v1/nodes", on_change=rec, backoff=Backoff(0.05, 0.2))
    inf.start()
    assert inf.wait_synced(5)
    assert api.wait_watching(1)
    yield inf, rec
    inf.stop()


def names(inf: Informer) -> list[str]:
    return sorted(o["metadata"]["name"] for o in inf.items())


def server_names(api: ApiServer) -> list[str]:
    return sorted(o["metadata"]["name"] for o in api.objects("Node"))


def test_list_then_watch_follows_every_change(api: ApiServer, nodes: tuple[Informer, Recorder]) -> None:
    inf, rec = nodes
    assert rec.events == [("ADDED", "n1"), ("ADDED", "n2")]
    api.apply(make_node("n3", [], []))
    api.apply(make_node("n1", ["10.206.140.0/24"], ["10.206.0.11"]))
    api.delete("Node", "n2")
    wait_for(lambda: len(rec.events) == 5, "the five events", WITHIN)
    assert rec.events[2:] == [("ADDED", "n3"), ("MODIFIED", "n1"), ("DELETED", "n2")]
    assert names(inf) == ["n1", "n3"]
    assert inf.get(("", "n1"))["spec"]["podCIDRs"] == ["10.206.140.0/24"]  # type: ignore[index]
    assert inf.resource_version == str(api.resource_version)
    assert (api.count("list"), api.count("watch")) == (1, 1)


def test_bookmarks_keep_the_revision_fresh(api: ApiServer, nodes: tuple[Informer, Recorder]) -> None:
    inf, rec = nodes
    api.apply(make_pod("d", "p", "elsewhere"))  # moves the revision, not the nodes
    wait_for(
        lambda: inf.resource_version == str(api.resource_version), "the informer's resource version to catch up", WITHIN
    )
    assert inf.stats.bookmarks >= 1 and len(rec.events) == 2


def test_broken_stream_resumes_from_its_revision_without_losing_events(
    api: ApiServer, nodes: tuple[Informer, Recorder]
) -> None:
    inf, rec = nodes
    api.break_watches()
    api.apply(make_node("n3", [], []))  # while the watch is down
    api.delete("Node", "n1")
    wait_for(lambda: names(inf) == ["n2", "n3"], "nodes n2 and n3 alone", WITHIN)
    assert rec.events[2:] == [("ADDED", "n3"), ("DELETED", "n1")]
    assert inf.stats.failures >= 1 and inf.stats.lists == 1  # resumed, not relisted
    last = api.requests[-1]
    assert last[0] == "watch" and "resourceVersion=" in last[2] and "allowWatchBookmarks=true" in last[2]


@pytest.mark.parametrize("how", ["error-event", "http-410"])
def test_410_gone_relists_and_delivers_what_was_missed(
    api: ApiServer, nodes: tuple[Informer, Recorder], how: str
) -> None:
    inf, rec = nodes
    inf.stop()  # the informer is away while history moves on and is compacted
    api.apply(make_node("n3", [], []))
    api.delete("Node", "n1")
    api.apply(make_node("n2", ["10.206.150.0/24"], []))
    if how == "http-410":
        api.answer_next_watches_410()
    else:
        api.expire_history()
    again = Informer(inf.transport, inf.path, on_change=rec, backoff=Backoff(0.05, 0.2))
    again._store, again._rv = dict(inf._store), inf._rv  # resume where the first one stopped
    again.start()
    try:
        wait_for(
            lambda: again.stats.relists == 1 and names(again) == server_names(api),
            "one relist, then the server's nodes",
            WITHIN,
        )
        assert sorted(rec.events[2:]) == [("ADDED", "n3"), ("DELETED", "n1"), ("MODIFIED", "n2")]
        assert api.count("list") == 2
    finally:
        again.stop()


def test_api_down_then_back_backs_off_and_recovers(api: ApiServer) -> None:
    host = host_for(api)
    url = api.url
    api.close()
    inf = Informer(host, "/api/v1/nodes", backoff=Backoff(0.05, 0.2))
    inf.start()
    try:
        wait_for(lambda: inf.stats.failures >= 2, "two failures", WITHIN)
        assert not inf.synced.is_set()
        assert "connection refused" in (inf.stats.last_error or "")
    finally:
        inf.stop()
    assert url  # the port is gone; a new server is a new cluster: covered by the relist tests


def test_paged_list(api: ApiServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("netplugin.hosts.watch.LIST_PAGE", 2)
    for i in range(5):
        api.apply(make_node(f"n{i}", [], []))
    inf = Informer(host_for(api), "/api/v1/nodes")
    inf.start()
    try:
        assert inf.wait_synced(5)
        assert names(inf) == [f"n{i}" for i in range(5)]
        assert api.count("list") == 3
    finally:
        inf.stop()


def test_stop_is_prompt_even_mid_stream(api: ApiServer, nodes: tuple[Informer, Recorder]) -> None:
    inf, _ = nodes
    start = time.monotonic()
    inf.stop()
    # Stuck in the stream, stop() would wait out its 5 s join and leave the thread alive.
    assert time.monotonic() - start < 3.0
    assert inf._thread is not None and not inf._thread.is_alive()


def test_cache_answers_pods_and_nodes_without_requests(api: ApiServer) -> None:
    api.apply(make_node("n1", ["10.206.129.0/24"], ["10.206.0.11"]))
    api.apply(make_node("n2", ["10.206.130.0/24"], ["10.206.0.12"]))
    api.apply(make_pod("default", "web", "n1", labels={"app": "web"}))
    api.apply(make_pod("default", "other", "n2"))
    host = host_for(api, "n1")
    changes: list[int] = []
    cache = host.start_watching(lambda: changes.append(1))
    try:
        assert cache.wait_synced(5)
        assert api.wait_watching(2)
        before = len(api.requests)
        pod = host.get_pod_by_name("default", "web")
        assert pod is not None and pod["metadata"]["labels"] == {"app": "web"}
        assert host.node_info() == NodeInfo("n1", ("10.206.129.0/24",), ("10.206.0.11",))
        assert [n.name for n in host.list_nodes()] == ["n1", "n2"]
        assert len(api.requests) == before  # all from memory
        assert cache.pods.get(("default", "other")) is None  # only this node's pods are watched
        assert host.get_pod_by_name("default", "other") is not None  # a miss asks the API
        assert api.requests[-1][:2] == ("get", "pods")
        assert host.requests[("get", "pods")] == 1
        api.apply(make_node("n3", [], []))
        wait_for(lambda: len(changes) >= 3, "three changes", WITHIN)
    finally:
        host.stop_watching()
    assert host.cache is None


def test_cli_path_node_lookups(api: ApiServer) -> None:
    host = host_for(api, "n1")
    assert host.node_info() == NodeInfo("n1")  # no Node object: the name only
    api.apply(make_node("n1", ["10.206.129.0/24", "fd6e:7031:1a00:8001::/64"], ["10.206.0.11"]))
    assert host.node_info().pod_cidrs == ("10.206.129.0/24", "fd6e:7031:1a00:8001::/64")
    assert [n.name for n in host.list_nodes()] == ["n1"]
    assert (api.count("get", "nodes"), api.count("list", "nodes")) == (2, 1)


def test_forbidden_names_the_rbac_rule(api: ApiServer) -> None:
    api.forbidden.add("nodes")
    with pytest.raises(HostError) as info:
        host_for(api).list_nodes()
    assert info.value.status == 403
    assert "cannot list resource" in info.value.message
    assert "needs list on nodes" in info.value.message and "rbac.yaml" in info.value.message


def test_object_key() -> None:
    assert object_key({"metadata": {"name": "a", "namespace": "b"}}) == ("b", "a")
    assert object_key({"metadata": {"name": "n"}}) == ("", "n")
    with pytest.raises(ValueError):
        object_key({"metadata": {}})
