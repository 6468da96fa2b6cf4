"""The ``peers`` mark that splits scripts/test.sh into its two phases is derived, never written:
tests/conftest.py puts it on a test when :func:`gopeers.uses_peers` finds a peer helper in the test
or in a fixture it uses (nested functions too), or ``NETPLUGIN_PEERS`` named (the bench smoke)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import gopeers
from tests.support.gopeers import require, uses_peers

REPO = Path(__file__).resolve().parent.parent


def _calls_require() -> None:
    require("containerd")


def _nested() -> Callable[[], Any]:
    def inner() -> Any:
        return gopeers.peer("critest")

    return inner


def _conditional(two: bool) -> None:
    if two:
        require("containerd")


def _names_the_env() -> str:
    return os.environ.get("NETPLUGIN_PEERS", "")


def _another_require(require: Callable[[str], None]) -> None:  # a local of that name, not gopeers'
    require("x")


def _plain() -> int:
    return 1


def _via_a_helper_of_the_tests(two: bool) -> None:  # a fixture calling a shared node factory
    _conditional(two)


@contextlib.contextmanager
def _factory(two: bool) -> Iterator[None]:
    _conditional(two)
    yield


def _via_a_context_manager(two: bool) -> None:
    with _factory(two):
        pass


def _recursive(n: int) -> int:  # a loop of calls ends
    return _recursive(n - 1) if n else _plain()


CASES = [
    (_calls_require, True),
    (_nested, True),
    (_conditional, True),
    (_names_the_env, True),
    (_another_require, False),
    (_plain, False),
    (_via_a_helper_of_the_tests, True),
    (_via_a_context_manager, True),
    (_recursive, False),
]


@pytest.mark.parametrize(("func", "needs"), CASES, ids=[f.__name__ for f, _ in CASES])
def test_uses_peers_finds_the_helpers(func: Callable[..., Any], needs: bool) -> None:
    assert uses_peers([func]) is needs


def _collected(phase: str, *paths: str) -> set[str]:
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q", "--peers", phase, *paths]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 5), done.stdout[-2000:] + done.stderr[-2000:]
    return {line.split("::")[0] for line in done.stdout.splitlines() if "::" in line}


def test_the_phases_split_the_suite_by_the_derived_mark() -> None:
    files = ["tests/frontends/cni/test_critest.py", "tests/plugins/test_hostport.py", "tests/test_bench_smoke.py",
             "tests/deploy/test_node_repair.py"]  # fmt: skip
    assert _collected("only", *files) == {files[0], files[2], files[3]}
    # a node factory shared through a plain (context-manager) function of the tests counts as its fixture's
    assert _collected("without", *files) == {files[1]}
