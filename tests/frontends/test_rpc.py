"""netplugin.frontends.wire: the codec (the json module's text and values, from _json alone) and the messages."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from netplugin.frontends.wire import codec, fingerprint
from netplugin.frontends.wire import protocol as wire

REPO = Path(__file__).resolve().parents[2]

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
values = st.recursive(scalars, lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=25)


@given(values)
def test_dumps_and_loads_match_json(value: Any) -> None:
    assert codec.dumps(value) == json.dumps(value, separators=(",", ":"))
    assert codec.dumps(value, sort_keys=True) == json.dumps(value, sort_keys=True)
    assert codec.loads(json.dumps(value)) == value
    assert codec.loads(json.dumps(value, indent=2).encode()) == value


@pytest.mark.parametrize("bad", ["", "{", "{} x", "[1,]", "{not json", '"\\x"', "\ufeff{}", "nul", "1 2"])
def test_bad_documents_raise_what_json_raises(bad: str) -> None:
    with pytest.raises(ValueError):
        codec.loads(bad)
    with pytest.raises(ValueError):
        json.loads(bad)


def test_unserializable_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        codec.dumps({"a": object()})


def test_it_imports_neither_json_nor_re() -> None:
    code = "import sys; from netplugin.frontends.wire import codec; codec.loads('{\"a\": [1]}'); codec.dumps({}); "
    code += "print(sorted(m for m in ('json', 're', 'typing') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-I", "-S", "-c", f"import sys; sys.path.insert(0, {str(REPO)!r}); {code}"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# --- the messages: the bytes on the wire are the protocol's, whoever builds them ---------------------


def test_request_lines_are_the_protocols_bytes() -> None:
    settings = wire.settings("/c.yaml", {"NETPLUGIN_PLUGIN": "p", "HOME": "/root"}, {"run_dir": "/r"})
    assert wire.encode_line(wire.pod_request("setup", "ns", "web-0", "abc", settings=settings)) == (
        b'{"v":1,"op":"setup","namespace":"ns","pod":"web-0","infra_id":"abc","settings":'
        b'{"config_path":"/c.yaml","environ":{"NETPLUGIN_PLUGIN":"p"},"overrides":{"run_dir":"/r"}}}\n'
    )
    env = {"CNI_COMMAND": "ADD", "NETPLUGIN_X": "1", "PATH": "/bin"}
    assert wire.encode_line(wire.cni_request(env, "{}")) == (
        b'{"v":1,"op":"cni","environ":{"CNI_COMMAND":"ADD","NETPLUGIN_X":"1"},"stdin":"{}"}\n'
    )
    assert wire.request("gc", dry_run=None, check_host=False) == {"v": 1, "op": "gc", "check_host": False}


class _Status:
    ip = "10.203.0.9"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "PodNetworkStatus", "ip": self.ip}


REF = {"namespace": "ns", "pod": "web-0", "infra_id": "abc"}


@pytest.mark.parametrize(
    ("op", "status", "result", "output"),
    [
        ("setup", _Status(), {"ip": "10.203.0.9"}, ({**REF, "ip": "10.203.0.9"}, None)),
        ("setup", None, {"ip": None}, ({**REF, "ip": None}, None)),
        ("teardown", None, None, (REF, None)),
        ("status", _Status(), {"kind": "PodNetworkStatus", "ip": "10.203.0.9"},
         ({"kind": "PodNetworkStatus", "ip": "10.203.0.9"}, "10.203.0.9")),
        ("status", None, None, (None, None)),
    ],
)
def test_pod_results_and_what_the_cli_prints(op: str, status: Any, result: Any, output: Any) -> None:
    assert wire.pod_result(op, status) == result
    assert wire.pod_output(op, "ns", "web-0", "abc", result) == output


@pytest.mark.parametrize(
    ("theirs", "differ"),
    [
        ({"plugin": "a", "state_dir": "/s"}, []),
        ({"plugin": "b", "state_dir": "/s"}, ["plugin"]),
        ({"plugin": "a"}, ["state_dir"]),
        ({"plugin": "a", "state_dir": "/s", "extra": 1}, ["extra"]),
        ("not an object", ["plugin", "state_dir"]),
    ],
)
def test_differing_settings(theirs: object, differ: list[str]) -> None:
    assert fingerprint.differing_settings({"plugin": "a", "state_dir": "/s"}, theirs) == differ
