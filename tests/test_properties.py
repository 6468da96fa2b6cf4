"""Property-based tests: every parser and validator of outside input answers with a value or its
documented error class, never with another exception; and the CLI never ends in a traceback.

Parsers covered: names.validate_*, PodRef, plugin.parse_status, config.load_config (files, the
environment, flags), state.parse_record (and the files a StateStore scans), host.load_manifest,
and netplugin.frontends.cli.main on random argv (in-process, plus a few real processes).
"""

from __future__ import annotations

import contextlib
import io
import ipaddress
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from netplugin.core.config import ENV_VARS, Config, load_config
from netplugin.core.errors import ConfigError, HostError, InvalidArgument, PluginOutputError, StateError
from netplugin.core.execplugin.status import parse_status
from netplugin.core.names import PodRef, validate_infra_id, validate_namespace, validate_plugin_name, validate_pod_name
from netplugin.core.plugin import PodNetworkStatus
from netplugin.hosts.static import load_manifest
from netplugin.store.records import KIND, PodRecord, parse_record, record_filename
from netplugin.store.state import StateStore

REPO = Path(__file__).resolve().parents[1]
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# JSON values, nested a little.
json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=30),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)),
    max_leaves=12,
)
# Text that stresses validators: the characters that matter to them, and any others.
name_text = st.one_of(
    st.text(max_size=300),
    st.text(alphabet="abcXYZ019-._/~ \n\0", max_size=300),
    st.from_regex(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", fullmatch=True),
)

LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
INFRA = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\Z")


# --- names ------------------------------------------------------------------------------------------


@SETTINGS
@given(value=name_text)
def test_validators_return_the_value_or_raise_invalid_argument(value: str) -> None:
    for validate, field in [
        (validate_namespace, "namespace"),
        (validate_pod_name, "pod name"),
        (validate_infra_id, "infra container id"),
        (validate_plugin_name, "plugin name"),
    ]:
        try:
            assert validate(value) == value
        except InvalidArgument as e:
            assert e.field == field and e.reason and field in e.message
            continue
        if validate is validate_namespace:
            assert LABEL.match(value) and len(value) <= 63
        if validate is validate_infra_id:
            assert INFRA.match(value) and len(value) <= 256
        if validate is validate_pod_name:
            assert len(value) <= 253 and "_" not in value and "/" not in value


@SETTINGS
@given(ns=name_text, name=name_text, infra=name_text)
def test_podref_is_valid_or_invalid_argument_and_its_file_name_is_safe(ns: str, name: str, infra: str) -> None:
    try:
        ref = PodRef(ns, name, infra)
    except InvalidArgument:
        return
    fname = record_filename(ref)
    assert "/" not in fname and "\0" not in fname and len(fname.encode()) <= 255 - 40


# --- plugin status ------------------------------------------------------------------------------------------


def _check_status(data: bytes) -> None:
    try:
        result = parse_status(data, plugin="p", pod="ns/pod")
    except PluginOutputError as e:
        assert e.action == "status" and e.plugin == "p" and "network plugin 'p' status" in e.message
        return
    assert result is None or isinstance(result, PodNetworkStatus)
    if result is not None:
        ipaddress.ip_address(result.ip)


@SETTINGS
@given(data=st.binary(max_size=400))
def test_parse_status_on_any_bytes(data: bytes) -> None:
    _check_status(data)


@SETTINGS
@given(doc=json_values, extra=st.dictionaries(st.sampled_from(["ip", "kind", "apiVersion", "x"]), json_values))
def test_parse_status_on_json_documents(doc: Any, extra: dict[str, Any]) -> None:
    _check_status(json.dumps(doc).encode())
    _check_status(json.dumps({"kind": "PodNetworkStatus", **extra}).encode())


@SETTINGS
@given(ip=st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6)))
def test_parse_status_accepts_every_address(ip: Any) -> None:
    result = parse_status(json.dumps({"ip": str(ip)}).encode(), plugin="p")
    assert result is not None and ipaddress.ip_address(result.ip) == ip


# --- config -------------------------------------------------------------------------------------------------

CONFIG_KEYS = [
    "plugin_dir", "plugin", "state_dir", "run_dir", "timeout", "timeouts", "kill_grace", "netns_template",
    "inherit_env", "env", "check_permissions", "rollback_on_failure", "max_output", "host", "pods_dir",
    "kubeconfig", "kube_timeout", "socket", "metrics_address", "use_daemon", "nonsense-key",
]


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="np-prop-") as d:
        yield Path(d)


def _load(path: Path, environ: dict[str, str] | None = None, overrides: dict[str, Any] | None = None) -> None:
    try:
        cfg = load_config(str(path), environ=environ or {}, overrides=overrides)
    except ConfigError as e:
        assert isinstance(e.key, str) and e.reason and "config key" in e.message
        return
    assert isinstance(cfg, Config)
    for action in ("init", "setup", "teardown", "status"):
        assert cfg.timeout_for(action) > 0
    cfg.netns_path("abc")


@SETTINGS
@given(text=st.text(max_size=300))
def test_load_config_on_any_text(scratch: Path, text: str) -> None:
    p = scratch / "text.yaml"
    p.write_text(text)
    _load(p)


@SETTINGS
@given(data=st.binary(max_size=300))
def test_load_config_on_any_bytes(scratch: Path, data: bytes) -> None:
    p = scratch / "bytes.yaml"
    p.write_bytes(data)
    _load(p)


@SETTINGS
@given(doc=st.one_of(json_values, st.dictionaries(st.sampled_from(CONFIG_KEYS), json_values, max_size=6)))
def test_load_config_on_yaml_documents(scratch: Path, doc: Any) -> None:
    p = scratch / "doc.yaml"
    p.write_text(yaml.safe_dump(doc))
    _load(p)


@SETTINGS
@given(
    environ=st.dictionaries(st.sampled_from(sorted(ENV_VARS)), st.text(max_size=40).filter(lambda s: "\0" not in s),
                            max_size=5),
    overrides=st.dictionaries(st.sampled_from(CONFIG_KEYS[:-1]), json_scalars, max_size=4),
)
def test_load_config_from_environment_and_flags(scratch: Path, environ: dict[str, str],
                                                overrides: dict[str, Any]) -> None:
    p = scratch / "empty.yaml"
    p.write_text("")
    _load(p, environ=environ, overrides=overrides)


# --- state files ----------------------------------------------------------------------------------------------

VALID = {
    "version": 1, "kind": KIND, "namespace": "default", "name": "web-0", "infra_id": "abc",
    "uid": None, "plugin": "p", "plugin_version": "sha256:00", "netns": "/var/run/netns/abc",
    "netns_existed": True, "host_known": False, "state": "ready", "ip": "10.0.0.2",
    "created": "2024-01-01T00:00:00.000Z", "updated": "2024-01-01T00:00:01.000Z", "ready_at": None,
    "owner": {"pid": 10, "start": 5, "boot_id": "x"},
}
VALID_PATH = "/state/pods/" + record_filename(PodRef("default", "web-0", "abc"))


def _check_record(data: bytes, path: str = VALID_PATH) -> PodRecord | None:
    try:
        rec = parse_record(data, path)
    except StateError as e:
        assert e.path == path and e.reason and path in e.message
        return None
    assert isinstance(rec, PodRecord)
    assert parse_record(rec.encode(), path) == rec, "what parses, round-trips"
    return rec


@SETTINGS
@given(data=st.binary(max_size=500))
def test_parse_record_on_any_bytes(data: bytes) -> None:
    _check_record(data)


@SETTINGS
@given(doc=json_values)
def test_parse_record_on_json_documents(doc: Any) -> None:
    _check_record(json.dumps(doc).encode())


@SETTINGS
@given(
    changes=st.dictionaries(st.sampled_from([*sorted(VALID), "extra"]), json_values, min_size=1, max_size=3),
    drop=st.sets(st.sampled_from(sorted(VALID)), max_size=2),
    owner=st.dictionaries(st.sampled_from(["pid", "start", "boot_id", "x"]), json_values, max_size=3),
)
def test_parse_record_on_mutated_records(changes: dict[str, Any], drop: set[str], owner: dict[str, Any]) -> None:
    doc = dict(VALID, **changes)
    for k in drop:
        doc.pop(k, None)
    _check_record(json.dumps(doc).encode())
    _check_record(json.dumps(dict(VALID, owner=dict(VALID["owner"], **owner))).encode())  # type: ignore[arg-type]


@SETTINGS
@given(
    ns=st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True),
    name=st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,30}[a-z0-9])?", fullmatch=True),
    infra=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,80}", fullmatch=True),
    ip=st.one_of(st.none(), st.ip_addresses().map(str)),
    state=st.sampled_from(["setting-up", "ready", "tearing-down"]),
    uid=st.one_of(st.none(), st.text(min_size=1, max_size=40)),
    flags=st.tuples(st.booleans(), st.booleans()),
)
def test_valid_records_round_trip(ns: str, name: str, infra: str, ip: str | None, state: str, uid: str | None,
                                  flags: tuple[bool, bool]) -> None:
    try:
        ref = PodRef(ns, name, infra)
    except InvalidArgument:
        assume(False)
        return
    doc = dict(VALID, namespace=ns, name=name, infra_id=infra, ip=ip, state=state, uid=uid,
               netns_existed=flags[0], host_known=flags[1])
    rec = _check_record(json.dumps(doc).encode(), "/s/pods/" + record_filename(ref))
    assert rec is not None and rec.ref == ref and rec.ip == ip and rec.state == state
    # Under another pod's file name the same content is refused: it would alias that pod.
    assert _check_record(json.dumps(doc).encode(), "/s/pods/other_pod_x.json") is None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(files=st.dictionaries(
    st.from_regex(r"[A-Za-z0-9_.~-]{1,40}", fullmatch=True).filter(lambda s: s not in (".", "..", "corrupt")),
    st.one_of(st.binary(max_size=200), json_values.map(lambda v: json.dumps(v).encode())),
    max_size=6,
))
def test_a_store_scan_never_fails_on_what_is_in_its_dir(files: dict[str, bytes]) -> None:
    with tempfile.TemporaryDirectory(prefix="np-prop-") as d:
        pods = Path(d) / "pods"
        pods.mkdir()
        for fname, data in files.items():
            (pods / fname).write_bytes(data)
        scan = StateStore(d).scan()
        seen = {Path(r.path).name for r in scan.records} | {Path(c.path).name for c in scan.corrupt}
        seen |= {Path(t).name for t in scan.stale_temps}
        assert seen <= set(files)


# --- pod manifests ------------------------------------------------------------------------------------------


def _check_manifest(path: Path) -> None:
    try:
        pod = load_manifest(str(path))
    except HostError as e:
        assert str(path) in e.message
        return
    assert isinstance(pod["metadata"]["name"], str) and pod["metadata"]["name"]
    assert isinstance(pod["metadata"]["namespace"], str) and pod["metadata"]["namespace"]


pod_docs = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {"kind": st.one_of(st.just("Pod"), json_values)},
        optional={"metadata": st.one_of(
            json_values,
            st.fixed_dictionaries({}, optional={"name": json_values, "namespace": json_values, "uid": json_values}),
        )},
    ),
)


@SETTINGS
@given(doc=pod_docs, suffix=st.sampled_from([".json", ".yaml"]))
def test_load_manifest_on_documents(scratch: Path, doc: Any, suffix: str) -> None:
    p = scratch / f"pod{suffix}"
    p.write_text(json.dumps(doc) if suffix == ".json" else yaml.safe_dump(doc))
    _check_manifest(p)


@SETTINGS
@given(data=st.binary(max_size=300), suffix=st.sampled_from([".json", ".yaml", ".yml"]))
def test_load_manifest_on_any_bytes(scratch: Path, data: bytes, suffix: str) -> None:
    p = scratch / f"raw{suffix}"
    p.write_bytes(data)
    _check_manifest(p)


# --- the CLI ------------------------------------------------------------------------------------------------

COMMANDS = ["plugins", "init", "setup", "teardown", "status", "pods", "gc"]
WORDS = [
    *COMMANDS, "--plugin", "--plugin-dir", "--state-dir", "--run-dir", "--config", "--timeout", "-o", "--output",
    "json", "text", "-v", "--dry-run", "--no-host-check", "--force", "--help", "--version", "default", "web-0",
    "abc", "sc", "0.5", "-1", "nan", "", "Bad_NS", "a" * 300,
]
# Never random: commands that start long-running or machine-changing work.
FORBIDDEN = {"serve", "demo", "bench"}
# Relative paths only (the CLI runs in a scratch cwd): random text must not name a real system dir.
safe_text = st.text(max_size=20).filter(lambda s: not s.startswith(("/", "~")) and ".." not in s and "\0" not in s)
argvs = st.lists(st.one_of(st.sampled_from(WORDS), safe_text), max_size=8).filter(
    lambda a: not FORBIDDEN & set(a))
DOCUMENTED_EXITS = {0, 1, 2, 3, 4, 5}


@pytest.fixture(scope="module")
def cli_home() -> Iterator[dict[str, str]]:
    """A private exec dir (with the scriptable plugin as "sc"), state, run and pods dirs, and config."""
    import shutil

    with tempfile.TemporaryDirectory(prefix="np-prop-cli-") as d:
        root = Path(d)
        exec_dir = root / "exec"
        (exec_dir / "sc").mkdir(parents=True)
        shutil.copy(REPO / "tests" / "testplugins" / "scriptable", exec_dir / "sc" / "sc")
        os.chmod(exec_dir, 0o755)
        os.chmod(exec_dir / "sc", 0o755)
        os.chmod(exec_dir / "sc" / "sc", 0o755)
        for sub in ("state", "run", "pods", "cwd"):
            (root / sub).mkdir()
        (root / "netplugin.yaml").write_text("timeouts: {setup: 5, teardown: 5, status: 5, init: 5}\n")
        env = {
            "NETPLUGIN_PLUGIN_DIR": str(exec_dir), "NETPLUGIN_STATE_DIR": str(root / "state"),
            "NETPLUGIN_RUN_DIR": str(root / "run"), "NETPLUGIN_PODS_DIR": str(root / "pods"),
            "NETPLUGIN_CONFIG": str(root / "netplugin.yaml"), "NETPLUGIN_USE_DAEMON": "never",
            "NETPLUGIN_NETNS_TEMPLATE": str(root / "netns-{infra_id}"),
        }
        yield {**env, "_cwd": str(root / "cwd")}


@contextlib.contextmanager
def _cli_environment(home: dict[str, str]) -> Iterator[None]:
    saved_env = dict(os.environ)
    saved_cwd = os.getcwd()
    try:
        for k in [k for k in os.environ if k.startswith("NETPLUGIN_")]:
            del os.environ[k]
        os.environ.update({k: v for k, v in home.items() if not k.startswith("_")})
        os.chdir(home["_cwd"])
        yield
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)


def run_main(argv: list[str]) -> tuple[int, str, str]:
    from netplugin.frontends.cli.app import main

    out, err = io.StringIO(), io.StringIO()
    code: Any = None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as e:
            code = e.code
    return (code if isinstance(code, int) else (0 if code is None else 1)), out.getvalue(), err.getvalue()


@settings(max_examples=250, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(argv=argvs)
def test_cli_never_ends_in_a_traceback(cli_home: dict[str, str], argv: list[str]) -> None:
    with _cli_environment(cli_home):
        code, out, err = run_main(argv)
    assert "Traceback" not in err and "Traceback" not in out, (argv, err)
    assert code in DOCUMENTED_EXITS, (argv, code, err)
    if code:
        assert err.strip(), f"a failure says why: {argv}"


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(argv=argvs)
def test_cli_process_never_ends_in_a_traceback(cli_home: dict[str, str], argv: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_")}
    env.update({k: v for k, v in cli_home.items() if not k.startswith("_")}, PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-m", "netplugin", *argv], env=env, cwd=cli_home["_cwd"],
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert "Traceback" not in r.stderr, (argv, r.stderr)
    assert r.returncode in DOCUMENTED_EXITS, (argv, r.returncode, r.stderr)
