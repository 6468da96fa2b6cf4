"""netplugin.frontends.rpc: the same text and values as the json module, from _json alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from netplugin.frontends import rpc as wire

REPO = Path(__file__).resolve().parents[2]

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
values = st.recursive(scalars, lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=25)


@given(values)
def test_dumps_and_loads_match_json(value: Any) -> None:
    assert wire.dumps(value) == json.dumps(value, separators=(",", ":"))
    assert wire.dumps(value, sort_keys=True) == json.dumps(value, sort_keys=True)
    assert wire.loads(json.dumps(value)) == value
    assert wire.loads(json.dumps(value, indent=2).encode()) == value


@pytest.mark.parametrize("bad", ["", "{", "{} x", "[1,]", "{not json", '"\\x"', "\ufeff{}", "nul", "1 2"])
def test_bad_documents_raise_what_json_raises(bad: str) -> None:
    with pytest.raises(ValueError):
        wire.loads(bad)
    with pytest.raises(ValueError):
        json.loads(bad)


def test_unserializable_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        wire.dumps({"a": object()})


def test_it_imports_neither_json_nor_re() -> None:
    code = "import sys; from netplugin.frontends import rpc as wire; wire.loads('{\"a\": [1]}'); wire.dumps({}); "
    code += "print(sorted(m for m in ('json', 're', 'typing') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-I", "-S", "-c", f"import sys; sys.path.insert(0, {str(REPO)!r}); {code}"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
