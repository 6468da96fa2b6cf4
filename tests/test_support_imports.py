"""The shared test helpers live in ``tests/support/`` and are imported one way only:
``from tests.support.NAME import ...`` (or ``from tests.support import NAME``), never by a bare module name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
SUPPORT = {p.stem for p in (TESTS / "support").glob("*.py") if p.stem != "__init__"}


def imports_by_bare_name(path: Path) -> list[str]:
    """Each import of a support module that does not go through ``tests.support``, as ``line: module``."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            names = [node.module]
            if node.module == "tests":
                names += [f"tests.{a.name}" for a in node.names]
        for name in names:
            head, _, rest = name.partition(".")
            bare = head in SUPPORT
            old = head == "tests" and rest.split(".")[0] in SUPPORT
            if bare or old:
                found.append(f"{node.lineno}: {name}")
    return found


def test_the_support_package_holds_the_helpers() -> None:
    assert {"nettest", "waits", "gopeers", "kubeplane"} <= SUPPORT
    assert not [p.name for p in TESTS.glob("*.py") if p.stem in SUPPORT], "a helper is left beside the tests"


@pytest.mark.parametrize("root", ["tests", "bench"])
def test_every_import_of_a_helper_goes_through_tests_support(root: str) -> None:
    files = sorted((REPO / root).rglob("*.py"))
    bad = {str(p.relative_to(REPO)): got for p in files if (got := imports_by_bare_name(p))}
    assert bad == {}


def test_the_check_sees_a_bare_import(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text("from nettest import x\nimport waits\nfrom tests import gopeers\nfrom tests.nettest import y\n"
                       "from tests.support.nettest import z\n")
    assert imports_by_bare_name(planted) == ["1: nettest", "2: waits", "3: tests.gopeers", "4: tests.nettest"]
