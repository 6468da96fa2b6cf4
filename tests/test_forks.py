"""No test forks the pytest process and runs Python before exec.

The pytest process holds grpc once the containerd tests have run (their CRI client). A
``preexec_fn`` (or ``os.fork``) makes the child run grpc's fork handlers, which can abort it with
SIGABRT before it ever execs: a test then fails for a reason that has nothing to do with netplugin.
Limits, umasks and signal dispositions for a child are set by argv wrappers (prlimit, env) or
around the call instead.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCANNED = [p for d in ("tests", "bench") for p in sorted((REPO / d).rglob("*.py"))]


def _forks(tree: ast.AST) -> list[str]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "preexec_fn":
            found.append((node.value.lineno, "preexec_fn="))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in {"fork", "forkpty"}
              and isinstance(node.func.value, ast.Name) and node.func.value.id in {"os", "pty"}):
            found.append((node.lineno, f"{node.func.value.id}.{node.func.attr}()"))
    return [f"line {n}: {what}" for n, what in sorted(found)]


def test_no_fork_without_exec() -> None:
    found = {str(p.relative_to(REPO)): f for p in SCANNED if (f := _forks(ast.parse(p.read_text(), str(p))))}
    assert found == {}


def test_the_scan_finds_a_fork() -> None:
    code = "import os, subprocess\nsubprocess.run(['true'], preexec_fn=os.setsid)\nos.fork()\n"
    assert _forks(ast.parse(code)) == ["line 2: preexec_fn=", "line 3: os.fork()"]
