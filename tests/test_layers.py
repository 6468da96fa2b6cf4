"""The house keeps its plan: imports go only downward, there is no import circle, rooms stay small.

Layers (see ARCHITECTURE.md), lowest first:

    0  netplugin.core                                   primitives
    1  netplugin.store, netplugin.hosts, netplugin.plugins, netplugin.nodenet   siblings, never import each other
    2  netplugin.manager
    3  netplugin.agent                                  the node's control loops (keepers, pod repairer)
    4  netplugin.frontends

    5  bench                                            a front end of its own (the benchmark harness)

Inside ``netplugin.frontends`` the parts are ranked the same way, lowest first:

    0  wire                                   the daemon protocol, codec, frame, code tables, client
    1  cni, lab                               the CNI operations; the demos and simulated cluster
    2  daemon                                 ``netplugin serve``
    3  checks, nodeconfig, entrypoints        the node's checks, its config file, the entry scripts
    4  cli                                    the command line

and ``lab`` is imported by the ``demo`` command's module alone (:data:`ONLY_FROM`).

A module may import from its own layer package or a lower layer. Every import counts: module
level, inside functions, and under ``TYPE_CHECKING``. ``bench`` stands above every layer: it may
import any of netplugin, and netplugin never imports it. The size caps hold for netplugin and
bench alike; a module over its cap is split by role, never by base class (an owner holds its
collaborators; a class is never cut in two to fit). The checkers run on the real tree and on small
planted trees, which prove that they catch an upward edge, a sibling edge, a circle and an
oversized module or function, in both.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "netplugin"
RANKS = {"core": 0, "store": 1, "hosts": 1, "plugins": 1, "nodenet": 1, "manager": 2, "agent": 3, "frontends": 4}
#: the parts of netplugin.frontends (sub-packages and top modules), ranked as the layers are
FRONTEND_RANKS = {
    "wire": 0,
    "cni": 1,
    "lab": 1,
    "daemon": 2,
    "checks": 3,
    "nodeconfig": 3,
    "entrypoints": 3,
    "uninstall": 3,
    "cli": 4,
}
#: front-end parts that only the named modules may import
ONLY_FROM = {"lab": frozenset({"netplugin.frontends.cli.commands.demos"})}
#: top-level packages above every layer of netplugin, with their rank: they import netplugin, never the reverse
ABOVE = {"bench": 5}
TOPS = (PACKAGE, *ABOVE)
MAX_MODULE_LINES = 520
MAX_FUNCTION_LINES = 80
# A function longer than the limit says why in its docstring, with this phrase.
LONG_REASON = "Long because"


def _sources(root: Path) -> list[Path]:
    """Every module of netplugin and of the packages above it, under ``root``."""
    return [p for top in TOPS for p in sorted((root / top).rglob("*.py"))]


def _modules(root: Path) -> dict[str, Path]:
    out = {}
    for path in _sources(root):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, known: set[str]) -> Iterator[tuple[str, int]]:
    """Every netplugin or bench module ``name`` imports, with the line: ``from x import y`` counts x.y if a module."""
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                pkg = pkg[: len(pkg) - node.level + 1]
                base = ".".join([*pkg, base] if base else pkg)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for t in targets:
            if t.split(".")[0] in TOPS:
                # a module whose parent package is imported too: importing a.b.c runs a/__init__, a/b/__init__
                yield t, node.lineno


def _layer(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] in ABOVE:
        return parts[0]
    return parts[1] if len(parts) > 1 and parts[1] in RANKS else None


def _rank(layer: str) -> int:
    return ABOVE.get(layer, RANKS.get(layer, -1))


def _frontend_part(module: str) -> str | None:
    """The front-end part (``wire``, ``cli``...) of a module under netplugin.frontends, else None."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == [PACKAGE, "frontends"] else None


def _frontend_problem(mod: str, target: str) -> str | None:
    """What is wrong with ``mod`` importing ``target`` by the front ends' own ranks (None: nothing)."""
    src, dst = _frontend_part(mod), _frontend_part(target)
    if src is None or dst is None or src == dst:
        return None
    for part in (src, dst):
        if part not in FRONTEND_RANKS:
            return f"netplugin.frontends.{part} is in no front-end rank ({', '.join(FRONTEND_RANKS)})"
    if dst in ONLY_FROM and mod not in ONLY_FROM[dst]:
        return f"{mod} imports {target}: only {', '.join(sorted(ONLY_FROM[dst]))} may import {dst}"
    if FRONTEND_RANKS[dst] >= FRONTEND_RANKS[src]:
        kind = "sideways" if FRONTEND_RANKS[dst] == FRONTEND_RANKS[src] else "upward"
        return f"{kind} front-end import: {mod} ({src}) imports {target} ({dst})"
    return None


def check_tree(root: Path) -> list[str]:
    """Every layering problem of the packages under ``root``: upward or sibling edges, and circles."""
    mods = _modules(root)
    known = set(mods)
    problems: list[str] = []
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for target, line in _imports(mod, path, known):
            while target not in known and "." in target:
                target = target.rsplit(".", 1)[0]
            if target == mod:
                continue
            graph[mod].add(target)
            src, dst = _layer(mod), _layer(target)
            if mod.count(".") == 1 and src is None and dst not in ABOVE:
                continue  # netplugin/__init__ and __main__ stand above every layer (not above bench)
            if dst is None:
                if target != PACKAGE:
                    problems.append(f"{path}:{line}: {mod} imports {target}, which is in no layer")
                continue
            if src is None and mod.count(".") != 1:
                problems.append(f"{path}:{line}: {mod} is in no layer ({', '.join(RANKS)})")
            elif dst != src and _rank(dst) >= _rank(src or PACKAGE):
                kind = "sideways" if _rank(dst) == _rank(src or PACKAGE) else "upward"
                problems.append(f"{path}:{line}: {kind} import: {mod} ({src}) imports {target} ({dst})")
            elif (why := _frontend_problem(mod, target)) is not None:
                problems.append(f"{path}:{line}: {why}")
    problems += [f"import circle: {' -> '.join(c)}" for c in _cycles(graph)]
    return problems


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected component with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_package_has_no_upward_edge_and_no_circle() -> None:
    assert check_tree(REPO) == []


def test_every_subpackage_is_a_layer() -> None:
    subpackages = {p.name for p in (REPO / PACKAGE).iterdir() if (p / "__init__.py").exists()}
    assert subpackages <= set(RANKS), f"unknown layer package(s): {subpackages - set(RANKS)}"
    assert {"core", "store", "hosts", "plugins", "manager", "agent", "frontends"} <= subpackages


def test_every_front_end_part_is_ranked() -> None:
    """Each sub-package and module directly under netplugin/frontends has a front-end rank, and each rank is used."""
    root = REPO / PACKAGE / "frontends"
    parts = {p.stem for p in root.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()} - {"__init__"}
    assert parts == set(FRONTEND_RANKS)


def check_rooms(root: Path) -> list[str]:
    """Every module over the line cap and every function over its cap without a "Long because" reason."""
    too_big = []
    for path in _sources(root):
        src = path.read_text()
        if len(src.splitlines()) > MAX_MODULE_LINES:
            too_big.append(f"{path}: {len(src.splitlines())} lines")
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES and LONG_REASON not in (ast.get_docstring(node) or ""):
                    too_big.append(f"{path}:{node.lineno}: {node.name} is {length} lines")
    return too_big


def test_rooms_stay_small() -> None:
    assert check_rooms(REPO) == []


def test_bench_is_checked() -> None:
    """The real bench/ is part of both checks (a rename of the package would otherwise silence them)."""
    mods = _modules(REPO)
    assert "bench.runner" in mods and "netplugin.core" in mods
    edges = {t for m, path in mods.items() if m.startswith("bench.") for t, _ in _imports(m, path, set(mods))}
    assert any(t.startswith("netplugin.") for t in edges) and "bench.util" in edges


def _plant(root: Path, files: dict[str, str]) -> Path:
    """A tree of ``files`` under ``root``: paths under netplugin/ unless they start with a package above it."""
    for rel, text in files.items():
        top = rel.split("/")[0]
        path = root / rel if top in ABOVE else root / PACKAGE / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for top in TOPS:
        if (root / top).is_dir():
            for d in [root / top, *[p for p in (root / top).rglob("*") if p.is_dir()]]:
                (d / "__init__.py").touch()
    return root


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        pytest.param(
            {"core/a.py": "from netplugin.manager import m\n", "manager/m.py": ""}, "upward import", id="upward"
        ),
        pytest.param(
            {"core/a.py": "def f():\n    from netplugin.frontends.cli import main\n", "frontends/cli.py": ""},
            "upward import",
            id="upward-in-function",
        ),
        pytest.param(
            {
                "store/s.py": (
                    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from netplugin.hosts import h\n"
                ),
                "hosts/h.py": "",
            },
            "sideways import",
            id="sibling-under-type-checking",
        ),
        pytest.param(
            {
                "core/a.py": "from netplugin.core import b\n",
                "core/b.py": "def f():\n    from netplugin.core import a\n",
            },
            "import circle: netplugin.core.a -> netplugin.core.b",
            id="circle-through-function",
        ),
        pytest.param(
            {"core/a.py": "from . import b\n", "core/b.py": "from .a import x\n"},
            "import circle",
            id="relative-circle",
        ),
        pytest.param({"extra/x.py": "", "core/a.py": "import netplugin.extra.x\n"}, "in no layer", id="unknown-layer"),
        pytest.param(
            {"frontends/f.py": "def g():\n    from bench.util import ms\n", "bench/util.py": ""},
            "upward import: netplugin.frontends.f (frontends) imports bench.util (bench)",
            id="netplugin-imports-bench",
        ),
        pytest.param(
            {"__main__.py": "import bench\n", "bench/util.py": ""},
            "upward import: netplugin.__main__",
            id="netplugin-main-imports-bench",
        ),
        pytest.param(
            {"bench/a.py": "from . import b\n", "bench/b.py": "def f():\n    from bench import a\n"},
            "import circle: bench.a -> bench.b",
            id="bench-circle",
        ),
        pytest.param({"bench/a.py": "import netplugin.extra.x\n", "extra/x.py": ""}, "in no layer", id="bench-unknown"),
        pytest.param(
            {
                "core/execplugin/run.py": "from netplugin.plugins.bridge.plugin import P\n",
                "plugins/bridge/plugin.py": "",
            },
            "upward import: netplugin.core.execplugin.run (core) imports netplugin.plugins.bridge.plugin (plugins)",
            id="upward-between-subpackages",
        ),
        pytest.param(
            {
                "frontends/wire/codec.py": "def f():\n    from netplugin.frontends.cli import app\n",
                "frontends/cli/app.py": "",
            },
            "upward front-end import: netplugin.frontends.wire.codec (wire) imports netplugin.frontends.cli.app (cli)",
            id="frontends-upward-in-function",
        ),
        pytest.param(
            {
                "frontends/cni/router.py": "from netplugin.frontends.daemon import server\n",
                "frontends/daemon/server.py": "",
            },
            "upward front-end import: netplugin.frontends.cni.router (cni)",
            id="frontends-cni-imports-daemon",
        ),
        pytest.param(
            {
                "frontends/cni/spec.py": "from netplugin.frontends.lab import demo\n",
                "frontends/lab/demo.py": "",
            },
            "only netplugin.frontends.cli.commands.demos may import lab",
            id="frontends-lab-from-cni",
        ),
        pytest.param(
            {
                "frontends/cli/commands/pods.py": "from netplugin.frontends.lab import demo\n",
                "frontends/lab/demo.py": "",
            },
            "only netplugin.frontends.cli.commands.demos may import lab",
            id="frontends-lab-from-another-command",
        ),
        pytest.param(
            {
                "frontends/checks.py": "from netplugin.frontends.cli import app\n",
                "frontends/cli/app.py": "",
            },
            "upward front-end import: netplugin.frontends.checks (checks)",
            id="frontends-top-module-imports-cli",
        ),
        pytest.param(
            {
                "frontends/misc/x.py": "from netplugin.frontends.wire import codec\n",
                "frontends/wire/codec.py": "",
            },
            "netplugin.frontends.misc is in no front-end rank",
            id="frontends-unranked-part",
        ),
        pytest.param(
            {
                "agent/nodekeeper.py": "def f():\n    from netplugin.frontends.daemon import metrics\n",
                "frontends/daemon/metrics.py": "",
            },
            "upward import: netplugin.agent.nodekeeper (agent) imports netplugin.frontends.daemon.metrics (frontends)",
            id="agent-imports-frontends",
        ),
        pytest.param(
            {
                "manager/gc.py": (
                    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from netplugin.agent import gckeeper\n"
                ),
                "agent/gckeeper.py": "",
            },
            "upward import: netplugin.manager.gc (manager) imports netplugin.agent.gckeeper (agent)",
            id="manager-imports-agent",
        ),
        pytest.param(
            {"plugins/bridge/ipam.py": "from netplugin.store import s\n", "store/s.py": ""},
            "sideways import: netplugin.plugins.bridge.ipam (plugins)",
            id="sibling-from-a-subpackage",
        ),
    ],
)
def test_the_checker_catches(tmp_path: Path, files: dict[str, str], expected: str) -> None:
    problems = check_tree(_plant(tmp_path, files))
    assert any(expected in p for p in problems), problems


def test_the_contract_module_runs_nothing() -> None:
    """core/plugin is the contract only: running exec plugins lives in core/execplugin, which it never imports."""
    mods = _modules(REPO)
    targets = {t for t, _ in _imports("netplugin.core.plugin", mods["netplugin.core.plugin"], set(mods))}
    assert not {t for t in targets if t.startswith("netplugin.core.execplugin")}, targets


def test_the_checker_accepts_downward_edges(tmp_path: Path) -> None:
    root = _plant(
        tmp_path,
        {
            "core/a.py": "",
            "store/s.py": "from netplugin.core import a\n",
            "manager/m.py": "from netplugin.store import s\nfrom netplugin.core.a import x\n",
            "frontends/f.py": "def g():\n    from netplugin.manager.m import y\n    from netplugin.agent.k import z\n",
            "agent/k.py": "from netplugin.manager.m import y\nfrom netplugin.nodenet.w import v\n",
            "nodenet/w.py": "from netplugin.core import a\n",
            "bench/b.py": "from netplugin.core import a\nfrom netplugin.frontends.f import g\nfrom .c import z\n",
            "bench/c.py": "from netplugin.store.s import w\n",
            "frontends/wire/codec.py": "",
            "frontends/cni/router.py": "from netplugin.frontends.wire import codec\n",
            "frontends/daemon/server.py": "from netplugin.frontends.cni import router\n",
            "frontends/cli/commands/demos.py": "from netplugin.frontends.lab import demo\n",
            "frontends/lab/demo.py": "from netplugin.frontends.wire.codec import loads\n",
        },
    )
    assert check_tree(root) == []


_LONG_BODY = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))


@pytest.mark.parametrize("top", [PACKAGE, "bench"])
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("x = 1\n" * (MAX_MODULE_LINES + 1), f"{MAX_MODULE_LINES + 1} lines", id="module"),
        pytest.param(f"def f():\n{_LONG_BODY}", f"f is {MAX_FUNCTION_LINES + 1} lines", id="function"),
        pytest.param(f"class C:\n    async def m(self):\n    {_LONG_BODY.replace(chr(10), chr(10) + '    ')}",
                     "m is", id="method"),
        pytest.param(f'def f():\n    """Long, but says nothing why."""\n{_LONG_BODY}', "f is", id="reason-missing"),
    ],
)
def test_the_size_check_catches(tmp_path: Path, top: str, text: str, expected: str) -> None:
    root = _plant(tmp_path, {f"{top}/big.py" if top != PACKAGE else "core/big.py": text})
    problems = check_rooms(root)
    assert len(problems) == 1 and expected in problems[0] and f"{top}/" in problems[0], problems


@pytest.mark.parametrize("top", [PACKAGE, "bench"])
def test_the_size_check_accepts_small_rooms_and_stated_reasons(tmp_path: Path, top: str) -> None:
    files = {
        "x.py": "x = 1\n" * MAX_MODULE_LINES,
        "y.py": f'def f():\n    """Long because a table reads best whole."""\n{_LONG_BODY}',
        "z.py": "def g():\n" + "".join(f"    y{i} = {i}\n" for i in range(MAX_FUNCTION_LINES - 1)),
    }
    root = _plant(tmp_path, {(f"{top}/{k}" if top != PACKAGE else f"core/{k}"): v for k, v in files.items()})
    assert check_rooms(root) == []
