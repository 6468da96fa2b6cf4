"""The real Kubernetes peers that ``scripts/build-peers.sh`` builds from the Go module proxy.

``scripts/test.sh`` runs the build in the background and exports its directory as
``NETPLUGIN_PEERS`` for the tests marked ``peers`` (run once the build is done), after the others; a
developer running pytest alone exports it from ``bash scripts/build-peers.sh``. Nobody writes the
``peers`` mark: tests/conftest.py puts it on every test that :func:`uses_peers` says needs them, and
the first phase runs without ``NETPLUGIN_PEERS``, so under CI a test that needs a peer unmarked fails.

A test that needs a peer calls :func:`require`: where a peer is missing it fails under CI
(``CI=true``: the peer build is part of the run, so a missing peer is a broken build) and skips
with the reason elsewhere. It never stands in for a peer that is not there.
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

__all__ = ["MARK", "PEERS_ENV", "missing_reason", "peer", "require", "uses_peers"]

PEERS_ENV = "NETPLUGIN_PEERS"
#: the mark of the tests that need a peer (scripts/test.sh's second phase)
MARK = "peers"


def _dir() -> Path | None:
    value = os.environ.get(PEERS_ENV, "")
    return Path(value) if value else None


def missing_reason(*names: str) -> str | None:
    """Why the peers ``names`` (paths under the peer dir, e.g. ``containerd``, ``cni/bridge``) cannot be used."""
    base = _dir()
    if base is None:
        return f"{PEERS_ENV} is not set (export {PEERS_ENV}=$(bash scripts/build-peers.sh))"
    absent = [n for n in names if not os.access(base / n, os.X_OK)]
    if not absent:
        return None
    why = f"{', '.join(absent)} not built in {base}"
    failed = base / "MISSING"
    if failed.is_file():
        why += f" (build-peers.sh could not build: {' '.join(failed.read_text().split())}; its logs: {base.parent}/log)"
    return why


def require(*names: str) -> Path:
    """The peer dir, holding ``names``; else fail under CI, skip elsewhere, with the reason."""
    reason = missing_reason(*names)
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"peer missing under CI: {reason}", pytrace=False)
        pytest.skip(reason)
    base = _dir()
    assert base is not None
    return base


def peer(name: str) -> Path:
    """The path of peer ``name`` (after :func:`require` accepted it)."""
    return require(name) / name


def _code_uses(code: types.CodeType, helpers: set[str], globals_: dict[str, Any], seen: set[types.CodeType]) -> bool:
    if code in seen:
        return False
    seen.add(code)
    if PEERS_ENV in code.co_consts:
        return True
    if any(name in helpers and globals_.get(name) in _HELPERS for name in code.co_names):
        return True
    # gopeers.require(...): the module by any name, and a helper's name as the attribute
    if helpers & set(code.co_names) and any(globals_.get(n) is _MODULE for n in code.co_names):
        return True
    if any(isinstance(c, types.CodeType) and _code_uses(c, helpers, globals_, seen) for c in code.co_consts):
        return True
    # a plain function of the tests that a fixture calls (a shared node factory) counts as the fixture's own
    called = (getattr(f, "__wrapped__", f) for f in (globals_.get(name) for name in code.co_names))  # @contextmanager
    return any(
        isinstance(f, types.FunctionType)
        and f.__code__.co_filename.startswith(_TESTS)
        and _code_uses(f.__code__, helpers, f.__globals__, seen)
        for f in called
    )


def uses_peers(funcs: Iterable[Callable[..., Any]]) -> bool:
    """Whether any of ``funcs`` (a test and the fixtures it uses) calls a helper of this module or
    names ``NETPLUGIN_PEERS`` (as the bench smoke passes it on), nested functions and the tests' own
    functions they call included."""
    for func in funcs:
        func = getattr(func, "__wrapped__", func)
        code = getattr(func, "__code__", None)
        globals_ = getattr(func, "__globals__", {})
        if code is not None and _code_uses(code, {f.__name__ for f in _HELPERS}, globals_, set()):
            return True
    return False


_HELPERS = (require, peer, missing_reason)
_MODULE = sys.modules[__name__]
_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
