"""The bounded YAML/JSON loaders (issue 13, class 4): hostile documents fail cleanly and cheaply.

Each hostile case runs in a child process with an address-space limit, so a regression shows as
a failed test (MemoryError, segfault, hang) rather than taking the test run down with it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
import yaml.cyaml

from netplugin.core import _yaml
from netplugin.core._yaml import MAX_DEPTH, MAX_NODES, DocumentError, load_json, load_yaml, read_document

REPO = Path(__file__).resolve().parents[2]
#: address space for the child: enough for Python + yaml, far less than any bomb needs
CHILD_AS = 512 << 20


def laughs(levels: int = 9) -> str:
    doc = 'a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    for i in range(1, levels):
        doc += f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]\n"
    return doc


def nested(depth: int) -> list[Any]:
    out: list[Any] = []
    for _ in range(depth - 1):
        out = [out]
    return out


HOSTILE_YAML = {
    # name: (document, words of the error)
    "deep flow (segfaulted libyaml's composer)": ("[" * 100_000, f"nested more than {MAX_DEPTH} levels"),
    "deep flow, closed": ("[" * 5000 + "]" * 5000, "nested more than"),
    "deep block": ("".join("  " * i + "a:\n" for i in range(300)) + "  " * 300 + "b: 1\n", "nested more than"),
    "compact sequences": ("- " * 50_000 + "x\n", "nested more than"),
    "billion laughs": (laughs(), "nodes (aliases expanded)"),
    "laughs in a merge": (laughs(7) + "m: {<<: *a6}\n" + "n: [*a6, *a6, *a6, *a6, *a6, *a6, *a6]\n", "nodes"),
    "recursive alias": ("a: &x [1, *x]\n", "undefined or recursive alias 'x'"),
    "one long string aliased many times": (
        "s: &s '" + "x" * 200_000 + "'\n" + "".join(f"k{i}: *s\n" for i in range(100)),
        "characters of text (aliases expanded)",
    ),
    "wide document": ("[" + "0," * (MAX_NODES + 10) + "0]", f"more than {MAX_NODES} nodes"),
}


def run_bounded(code: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a child limited to CHILD_AS bytes of address space."""
    prelude = (
        "import resource\n"
        f"resource.setrlimit(resource.RLIMIT_AS, ({CHILD_AS}, {CHILD_AS}))\n"
        "resource.setrlimit(resource.RLIMIT_CORE, (0, 0))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


@pytest.mark.parametrize("name", list(HOSTILE_YAML))
def test_hostile_yaml_is_refused_in_bounded_memory(name: str, tmp_path: Path) -> None:
    doc, words = HOSTILE_YAML[name]
    path = tmp_path / "doc.yaml"
    path.write_text(doc)
    done = run_bounded(
        f"""
        from netplugin.core._yaml import DocumentError, load_yaml
        try:
            load_yaml(open({str(path)!r}, "rb").read())
        except DocumentError as e:
            print("refused:", e)
        else:
            print("accepted")
        """
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("refused:"), done.stdout
    assert words in done.stdout
    assert len(done.stdout) < 300  # the reason is one short line, quoting nothing big


def test_the_unbounded_loader_really_fails_on_these(tmp_path: Path) -> None:
    # The premise of the tests above: libyaml's own composer dies on deep nesting (SIGSEGV), or, in a
    # libyaml with a depth limit of its own (PyYAML 6.0.4's), refuses it, in words of its own.
    if not hasattr(yaml, "CSafeLoader"):
        pytest.skip("PyYAML built without libyaml")
    done = run_bounded("import yaml\nyaml.load('[' * 100000, Loader=yaml.CSafeLoader)\n")
    died = done.returncode < 0 or "RecursionError" in done.stderr or "MemoryError" in done.stderr
    assert died or "exceeded maximum nesting depth" in done.stderr, done.stderr[-500:]


def test_duplicate_keys_name_the_key_and_both_lines() -> None:
    with pytest.raises(DocumentError) as info:
        load_yaml("a: 1\nb:\n  x: 1\n  'x': 2\n")
    assert str(info.value) == "duplicate key 'x' (first on line 3) (line 4, column 3)"
    with pytest.raises(DocumentError, match="duplicate key 1 "):
        load_yaml("1: a\n0x1: b\n")  # equal values, different spellings


def test_merge_keys_may_be_overridden_but_not_repeated() -> None:
    base = "base: &b {x: 1, y: 2}\n"
    assert load_yaml(base + "d: {<<: *b, x: 3}\n")["d"] == {"x": 3, "y": 2}
    with pytest.raises(DocumentError, match="duplicate key 'x'"):
        load_yaml(base + "d: {<<: *b, x: 3, x: 4}\n")


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ("", None),
        ("~\n", None),
        ("a: 1\nb: [x, {c: d}]\n", {"a": 1, "b": ["x", {"c": "d"}]}),
        ("a: &v [1, 2]\nb: *v\n", {"a": [1, 2], "b": [1, 2]}),
        ("t: !!str 1\nd: 2001-12-14\n", {"t": "1", "d": __import__("datetime").date(2001, 12, 14)}),
        ("[" * MAX_DEPTH + "]" * MAX_DEPTH, nested(MAX_DEPTH)),
    ],
)
def test_ordinary_documents_load_as_pyyaml_loads_them(doc: str, expected: Any) -> None:
    assert load_yaml(doc) == expected
    assert load_yaml(doc) == yaml.safe_load(doc)


@pytest.mark.parametrize(
    ("doc", "words"),
    [
        ("a: !!python/object/apply:os.system ['true']\n", "could not determine a constructor"),
        ("a: 1\n---\nb: 2\n", "expected a single document"),
        ("a: [1,\n", "line "),
        ("? [1, 2]\n: x\n", "unhashable"),
        (b"a: \xff\n", "invalid"),
        ("a: " + "1" * 5000 + "\n", "cannot decode"),  # int() digit limit: ValueError, not a crash
    ],
)
def test_bad_documents_are_one_line_errors(doc: str | bytes, words: str) -> None:
    with pytest.raises(DocumentError) as info:
        load_yaml(doc)
    assert words in str(info.value)
    assert "\n" not in str(info.value)


def test_size_limit_is_checked_before_parsing() -> None:
    with pytest.raises(DocumentError, match="larger than the limit of 10 bytes"):
        load_yaml("a: 123456789\n", max_bytes=10)
    with pytest.raises(DocumentError, match="larger than the limit"):
        load_json(b"[1, 2, 3, 4]", max_bytes=5)


def test_the_c_parser_is_used_and_the_python_one_is_bounded_too(monkeypatch: pytest.MonkeyPatch) -> None:
    c_parser = getattr(yaml.cyaml, "CParser", None) if hasattr(yaml, "CSafeLoader") else None
    if c_parser is not None:
        assert issubclass(_yaml._loader_class(), c_parser)
    monkeypatch.setattr(_yaml, "_LOADER", None)
    monkeypatch.delattr("yaml.cyaml.CParser", raising=False)
    assert not any("CParser" in c.__name__ for c in _yaml._loader_class().__mro__)
    assert load_yaml("a: [1, {b: c}]\n") == {"a": [1, {"b": "c"}]}
    with pytest.raises(DocumentError, match="nested more than"):
        load_yaml("[" * 5000)
    with pytest.raises(DocumentError, match="duplicate key"):
        load_yaml("a: 1\na: 2\n")


# --- JSON ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("doc", "words"),
    [
        ("[" * 100_000, "nested more than"),
        ('{"a":' * (MAX_DEPTH + 1) + "1" + "}" * (MAX_DEPTH + 1), f"nested more than {MAX_DEPTH}"),
        ('{"a": 1, "a": 2}', "duplicate key 'a'"),
        ("[" + "0," * MAX_NODES + "0]", "nodes"),
        ('{"a": 1', "Expecting"),
        (b'"\xff"', "utf-8"),
        ("1" * 5000, "digits"),
    ],
)
def test_hostile_json(doc: str | bytes, words: str) -> None:
    with pytest.raises(DocumentError) as info:
        load_json(doc)
    assert words in str(info.value)


def test_json_duplicates_allowed_when_asked() -> None:
    assert load_json('{"a": 1, "a": 2}', duplicates=True) == {"a": 2}


# --- reading files -------------------------------------------------------------------------------


def test_read_document_never_blocks_and_stops_at_the_limit(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(DocumentError, match="not a regular file"):
        read_document(str(fifo), 100)
    with pytest.raises(DocumentError, match="larger than the limit of 100 bytes"):
        read_document("/dev/zero", 100)
    with pytest.raises(DocumentError, match="not a regular file"):
        read_document(str(tmp_path), 100)
    (tmp_path / "f").write_bytes(b"x" * 100)
    assert read_document(str(tmp_path / "f"), 100) == b"x" * 100
    assert read_document("/dev/null", 100) == b""
