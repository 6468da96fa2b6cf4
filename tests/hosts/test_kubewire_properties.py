"""Hypothesis: the parsers of what the API server sends (LIST pages, watch events) answer with a
value or ValueError (DocumentError), never another exception, whatever the bytes or the shape.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from netplugin.core._yaml import MAX_DEPTH
from netplugin.hosts.kubewire import object_problem, parse_event, parse_list, parse_list_page
from netplugin.hosts.watch import Informer, WatchExpired

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=30,
)
names = st.text(min_size=0, max_size=10)
metas = st.fixed_dictionaries(
    {},
    optional={
        "name": names | scalars,
        "namespace": names,
        "resourceVersion": st.from_regex(r"[0-9]{0,4}", fullmatch=True) | scalars,
    },
)
objects = st.fixed_dictionaries({"metadata": metas | values}, optional={"spec": values, "status": values})
pages = st.fixed_dictionaries(
    {},
    optional={
        "kind": st.just("NodeList") | scalars,
        "metadata": st.fixed_dictionaries(
            {}, optional={"resourceVersion": names | scalars, "continue": names | scalars}
        )
        | values,
        "items": st.lists(objects | values, max_size=6) | values,
    },
)
event_types = st.sampled_from(["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR", "BOGUS"]) | scalars
events = st.fixed_dictionaries({}, optional={"type": event_types, "object": objects | values})


def nested(depth: int, opener: str) -> bytes:
    close = "]" if opener == "[" else "}"
    inner = "[" * depth if opener == "[" else '{"a":' * depth
    return (inner + "1" + close * depth).encode()


@SETTINGS
@given(pages)
def test_list_pages(doc: dict[str, Any]) -> None:
    try:
        page = parse_list_page(doc, "/api/v1/nodes")
    except ValueError:
        return
    items = doc.get("items") or []
    assert len(page.items) + len(page.bad) == len(items)
    assert all(object_problem(o) is None for o in page.items)
    assert page.resource_version and isinstance(page.token, str)


@SETTINGS
@given(st.binary(max_size=200) | pages.map(lambda d: json.dumps(d).encode()))
def test_list_bodies(body: bytes) -> None:
    try:
        doc = parse_list(body)
    except ValueError:
        return
    try:
        parse_list_page(doc, "/api/v1/nodes")
    except ValueError:
        pass


@SETTINGS
@given(
    st.binary(max_size=200)
    | events.map(lambda e: json.dumps(e).encode())
    | st.integers(1, 5000).map(lambda d: nested(d, "["))
)
def test_watch_lines(line: bytes) -> None:
    try:
        etype, obj = parse_event(line)
    except ValueError:
        return
    assert isinstance(etype, str) and isinstance(obj, dict)


@SETTINGS
@given(st.integers(MAX_DEPTH + 1, 200_000), st.sampled_from(["[", "{"]))
def test_deep_lines_are_refused_not_recursed(depth: int, opener: str) -> None:
    line = b'{"type":"ADDED","object":' + nested(depth, opener) + b"}" if opener == "{" else nested(depth, opener)
    try:
        _, obj = parse_event(line)
    except ValueError:
        return
    assert object_problem(obj) is not None  # parsed (shallow enough for json), refused as an object


@SETTINGS
@given(st.lists(events, max_size=8))
def test_events_move_the_cache_or_fail_cleanly(evs: list[dict[str, Any]]) -> None:
    inf = Informer(None, "/api/v1/nodes")  # type: ignore[arg-type]  # no transport: events applied by hand
    for ev in evs:
        try:
            inf._apply(*parse_event(json.dumps(ev).encode()))
        except (ValueError, WatchExpired):
            continue
    for obj in inf.items():
        assert object_problem(obj) is None
    assert inf.status()["objects"] == len(inf.items())
