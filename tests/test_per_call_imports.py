"""The per-call import set (tests/frontends/fastpath.py) holds: a call run in its own process loads
nothing outside it, and only its modules use ``core/plaindata`` instead of ``dataclasses`` or
import inside functions (elsewhere only a heavy optional package is imported where it is needed)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from netplugin.core.extras import EXTRA_OF_MODULE
from tests.frontends.fastpath import PER_CALL

REPO = Path(__file__).resolve().parents[1]
#: prints the netplugin modules the call loaded (on stderr, after the call's own output)
_REPORT = (
    "import atexit, sys\n"
    "atexit.register(lambda: print('MODULES', sorted(m for m in sys.modules if m.startswith('netplugin')),"
    " file=sys.stderr))\n"
)
CLI = _REPORT + "sys.argv[0] = 'netplugin'\nfrom netplugin.frontends.cli.entry import main\nmain()\n"
CNI = _REPORT + "from netplugin.frontends.cni import main\nmain()\n"


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def plaindata_users(root: Path) -> set[str]:
    """The modules under ``root`` that import ``netplugin.core.plaindata`` (in any way)."""
    out = set()
    for path in sorted((root / "netplugin").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module is not None:
                named = [f"{node.module}.{a.name}" for a in node.names]
                if node.module == "netplugin.core.plaindata" or "netplugin.core.plaindata" in named:
                    out.add(_module_name(path, root))
            elif isinstance(node, ast.Import) and any(a.name == "netplugin.core.plaindata" for a in node.names):
                out.add(_module_name(path, root))
    return out - {"netplugin.core.plaindata"}


def test_only_the_per_call_set_uses_plaindata() -> None:
    users = plaindata_users(REPO)
    assert users, "the scan found no user of plaindata: it no longer sees the imports"
    assert sorted(users - PER_CALL) == []


#: what a module outside the per-call set may import inside a function: an optional extra's package
#: (named by its error when absent), lightkube's HTTP client with it, and the daemon's server in
#: ``netplugin serve`` once require() has named the extra it needs
OPTIONAL_IMPORTS = frozenset(EXTRA_OF_MODULE) | {"httpx2"}
NAMED_EXCEPTIONS = frozenset({("netplugin.frontends.cli.commands.service", "netplugin.frontends.daemon.server")})


def function_imports(root: Path) -> set[tuple[str, str]]:
    """(module, imported module) for every import inside a function of the package under ``root``."""
    out = set()
    for path in sorted((root / "netplugin").rglob("*.py")):
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and node.module is not None:
                    out.add((_module_name(path, root), node.module))
                elif isinstance(node, ast.Import):
                    out.update((_module_name(path, root), a.name) for a in node.names)
    return out


def outside_the_per_call_set(found: set[tuple[str, str]]) -> list[tuple[str, str]]:
    """The imports of ``found`` that are neither in the per-call set nor of an optional package."""
    return sorted(
        (module, imported)
        for module, imported in found
        if module not in PER_CALL
        and imported.split(".", 1)[0] not in OPTIONAL_IMPORTS
        and (module, imported) not in NAMED_EXCEPTIONS
    )


def test_only_the_per_call_set_imports_inside_functions() -> None:
    found = function_imports(REPO)
    assert any(module in PER_CALL for module, _ in found), "the scan found no import inside a function"
    assert outside_the_per_call_set(found) == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("def f():\n    import json\n", [("netplugin.agent.planted", "json")]),
        ("async def f():\n    from netplugin.core import names\n", [("netplugin.agent.planted", "netplugin.core")]),
        ("def f():\n    import pyroute2\n", []),
        ("import json\n", []),
    ],
    ids=["stdlib-in-a-function", "own-module-in-a-coroutine", "optional-package", "module-level"],
)
def test_the_function_import_check_catches(tmp_path: Path, text: str, expected: list[tuple[str, str]]) -> None:
    (tmp_path / "netplugin" / "agent").mkdir(parents=True)
    (tmp_path / "netplugin" / "agent" / "planted.py").write_text(text)
    assert outside_the_per_call_set(function_imports(tmp_path)) == expected


@pytest.fixture
def netns() -> Iterator[str]:
    """A network namespace of this test's own (a setup refuses the caller's)."""
    name = f"np-percall-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def _loaded(code: str, args: list[str], env: dict[str, str], stdin: str = "") -> tuple[int, list[str]]:
    done = subprocess.run(
        [sys.executable, "-c", code, *args], input=stdin, capture_output=True, text=True, env=env, check=False
    )
    line = next(ln for ln in done.stderr.splitlines() if ln.startswith("MODULES "))
    modules: list[str] = ast.literal_eval(line.removeprefix("MODULES "))
    return done.returncode, modules


@pytest.mark.parametrize("plugin", ["", "example.com/nop"], ids=["builtin-noop", "exec-plugin"])
def test_a_cli_call_run_alone_stays_in_the_per_call_set(
    plugin: str, cli_env: dict[str, str], plugin_dir: Any, netns: str
) -> None:
    if plugin:
        plugin_dir.install(plugin, script="#!/bin/sh\nexit 0\n")
    env = {**cli_env, "NETPLUGIN_PLUGIN": plugin} if plugin else cli_env
    for action in ("setup", "status", "teardown"):
        code, modules = _loaded(CLI, [action, "default", "p1", netns], env)
        assert code == 0, action
        assert sorted(set(modules) - PER_CALL) == [], action


def test_a_cni_call_run_alone_stays_in_the_per_call_set(np_dirs: dict[str, str], netns: str) -> None:
    conf = {
        "cniVersion": "1.0.0",
        "name": "percall",
        "type": "netplugin-cni",
        "plugin": "kubernetes.io/no-op",
        "stateDir": np_dirs["state_dir"],
        "runDir": np_dirs["run_dir"],
        "netplugin": {"use_daemon": "never"},
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NETPLUGIN_", "CNI_"))}
    env.update(
        PYTHONPATH=str(REPO),
        NETPLUGIN_CONFIG=np_dirs["config"],
        CNI_CONTAINERID="percall1",
        CNI_NETNS=f"/var/run/netns/{netns}",
        CNI_IFNAME="eth0",
        CNI_PATH="/nonexistent",
        CNI_ARGS="K8S_POD_NAMESPACE=default;K8S_POD_NAME=p1",
    )
    for command in ("ADD", "DEL"):
        code, modules = _loaded(CNI, [], {**env, "CNI_COMMAND": command}, json.dumps(conf))
        assert code == 0, command
        assert sorted(set(modules) - PER_CALL) == [], command
