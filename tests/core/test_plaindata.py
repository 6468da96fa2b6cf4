"""netplugin's data classes behave as the standard library's on every feature netplugin uses.

Each case defines the same class twice, once with ``dataclasses`` and once with
:mod:`netplugin.core.plaindata`, and compares what each does: the standard library is the reference.
"""

from __future__ import annotations

import copy
import dataclasses
import subprocess
import sys
from collections.abc import Callable
from typing import Any, ClassVar

import pytest

from netplugin.core import plaindata

Decorators = tuple[Callable[..., Any], Callable[..., Any]]
LIBS: dict[str, Any] = {"stdlib": dataclasses, "plaindata": plaindata}


def make(lib: Any, **options: Any) -> dict[str, type]:
    """The same family of classes, built with ``lib``'s decorator and field."""
    dc, field = lib.dataclass, lib.field

    @dc(**options)
    class Point:
        x: int
        y: int = 0
        tags: list[str] = field(default_factory=list)
        note: str = field(default="", compare=False)
        secret: str | None = field(default=None, repr=False)
        KIND: ClassVar[str] = "point"

    @dc(**options)
    class Point3(Point):
        z: int = 0

    return {"Point": Point, "Point3": Point3}


def outcome(fn: Callable[[], Any]) -> tuple[str, str]:
    """What calling ``fn`` gives: ("ok", repr) or (exception class name, "")."""
    try:
        return "ok", repr(fn())
    except Exception as e:  # compared across the two libraries, not hidden
        return type(e).__name__, ""


PROBES: dict[str, Callable[[dict[str, type]], Any]] = {
    "repr": lambda c: c["Point"](1, 2, ["a"], "n", "s"),
    "repr-sub": lambda c: c["Point3"](1, z=3),
    "eq": lambda c: c["Point"](1, 2) == c["Point"](1, 2),
    "eq-ignores-compare-false": lambda c: c["Point"](1, note="a") == c["Point"](1, note="b"),
    "ne-other-values": lambda c: c["Point"](1) != c["Point"](2),
    "not-eq-other-class": lambda c: c["Point"](1) == c["Point3"](1),
    "not-eq-tuple": lambda c: c["Point"](1) == (1, 0, [], "", None),
    "factory-fresh": lambda c: c["Point"](1).tags is not c["Point"](1).tags,
    "missing-arg": lambda c: c["Point"](),
    "unknown-arg": lambda c: c["Point"](1, nope=2),
    "too-many": lambda c: c["Point"](1, 2, [], "", None, 6),
    "hash": lambda c: hash(c["Point"](1, 2, (), "a")) == hash(c["Point"](1, 2, (), "b")),
    "hash-distinct": lambda c: {c["Point"](1, 2, ()), c["Point"](1, 2, ())}.__len__(),
    "order": lambda c: sorted([c["Point"](2), c["Point"](1, 5), c["Point"](1, 3)]),
    "order-other-class": lambda c: c["Point"](1) < c["Point3"](1),
    "set-field": lambda c: setattr(c["Point"](1), "x", 5),
    "del-field": lambda c: delattr(c["Point"](1), "x"),
    "new-attr": lambda c: setattr(c["Point"](1), "other", 5),
    "replace": lambda c: (lambda p: type(p)(**{**{f.name: getattr(p, f.name) for f in LIB_FIELDS(p)}, "y": 9}))(
        c["Point3"](1, 2, z=7)),
    "fields": lambda c: [f.name for f in LIB_FIELDS(c["Point3"])],
    "match-args": lambda c: c["Point3"].__match_args__,  # type: ignore[attr-defined]
    "classvar": lambda c: (c["Point"].KIND, "KIND" in [f.name for f in LIB_FIELDS(c["Point"])]),  # type: ignore[attr-defined]
    "class-default": lambda c: c["Point"].y,  # type: ignore[attr-defined]
    # pickle's own protocol (a class made in a function cannot be pickled by name, so copied)
    "copy-pickle-protocol": lambda c: copy.deepcopy(c["Point3"](1, 2, ["a"], "n", z=3)),
}
LIB_FIELDS: Callable[[Any], Any] = dataclasses.fields  # set per case below


OPTIONS = [
    pytest.param({}, id="plain"),
    pytest.param({"frozen": True}, id="frozen"),
    pytest.param({"frozen": True, "order": True}, id="frozen-order"),
    pytest.param({"frozen": True, "slots": True}, id="frozen-slots"),
    pytest.param({"slots": True}, id="slots"),
]


@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("probe", sorted(PROBES))
def test_plaindata_behaves_as_the_standard_library(options: dict[str, Any], probe: str) -> None:
    global LIB_FIELDS
    results = {}
    for name, lib in LIBS.items():
        LIB_FIELDS = lib.fields
        results[name] = outcome(lambda lib=lib: PROBES[probe](make(lib, **options)))
    expected, got = results["stdlib"], results["plaindata"]
    if probe == "new-attr" and options.get("frozen") and options.get("slots"):
        # 3.11's frozen __setattr__ compares with the class before slots were added, so it raises
        # TypeError from object.__setattr__ there; plaindata says FrozenInstanceError. Both refuse.
        assert expected[0] != "ok" and got[0] == "FrozenInstanceError"
    else:  # FrozenInstanceError: each library raises its own class, of the same name
        assert got == expected


@pytest.mark.parametrize("lib", sorted(LIBS))
def test_replace_and_post_init(lib: str) -> None:
    m = LIBS[lib]
    seen: list[int] = []

    @m.dataclass(frozen=True)
    class Box:
        n: int
        items: tuple[int, ...] = ()

        def __post_init__(self) -> None:
            seen.append(self.n)

    b = m.replace(Box(1, (2,)), n=5)
    assert (b, seen) == (Box(5, (2,)), [1, 5, 5])  # __post_init__ runs for the replacement too
    with pytest.raises(TypeError):
        m.replace(Box(1), nope=1)
    with pytest.raises(TypeError):
        m.fields(object())


@pytest.mark.parametrize("lib", sorted(LIBS))
@pytest.mark.parametrize(
    "body",
    [
        pytest.param("x: int = 0\n    y: int", id="non-default-after-default"),
        pytest.param("x: list = []", id="mutable-default"),
    ],
)
def test_bad_class_bodies_are_refused_alike(lib: str, body: str) -> None:
    scope: dict[str, Any] = {"dc": LIBS[lib].dataclass}
    with pytest.raises((TypeError, ValueError)):
        exec(f"@dc\nclass Bad:\n    {body}\n", scope)


def test_the_cold_paths_do_not_import_dataclasses() -> None:
    """The CLI's direct path (config, manager, store) runs without the standard library's dataclasses."""
    code = ("import sys; import netplugin.core.config, netplugin.manager.manager, netplugin.store.state; "
            "print('dataclasses' in sys.modules, 'inspect' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.split() == ["False", "False"]
