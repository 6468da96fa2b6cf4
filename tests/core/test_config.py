"""netplugin.core.config: file < environment < flags, and every bad value named with its key and source."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

import netplugin.core.config as config_mod
from netplugin.core import plaindata
from netplugin.core._yaml import load_yaml
from netplugin.core.config import Config, load_config
from netplugin.core.defaults import DEFAULT_PLUGIN_DIR, DEFAULT_STATE_DIR, DEFAULT_TIMEOUTS
from netplugin.core.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "etc" / "netplugin.yaml"


@pytest.fixture
def cfg_file(tmp_path: Path) -> Any:
    def write(text: str) -> str:
        p = tmp_path / "netplugin.yaml"
        p.write_text(text)
        return str(p)

    return write


@pytest.fixture
def no_default_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The default config path points at a file that does not exist (the machine's own is never read)."""
    missing = str(tmp_path / "etc-netplugin" / "netplugin.yaml")
    monkeypatch.setattr(config_mod, "DEFAULT_CONFIG", missing)
    return missing


# --- precedence ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("file", "env", "flag", "expected"),
    [
        pytest.param(None, None, None, "default", id="default"),
        pytest.param("file", None, None, "file", id="file"),
        pytest.param("file", "env", None, "env", id="env-over-file"),
        pytest.param(None, "env", None, "env", id="env"),
        pytest.param("file", "env", "flag", "flag", id="flag-over-env"),
        pytest.param("file", None, "flag", "flag", id="flag-over-file"),
    ],
)
@pytest.mark.parametrize(
    ("key", "var", "values"),
    [
        (
            "plugin_dir",
            "NETPLUGIN_PLUGIN_DIR",
            {"default": DEFAULT_PLUGIN_DIR, "file": "/f", "env": "/e", "flag": "/l"},
        ),
        (
            "state_dir",
            "NETPLUGIN_STATE_DIR",
            {"default": DEFAULT_STATE_DIR, "file": "/f", "env": "/e", "flag": "/l"},
        ),
        ("plugin", "NETPLUGIN_PLUGIN", {"default": None, "file": "from-file", "env": "from-env", "flag": "x.io/f"}),
        ("timeout", "NETPLUGIN_TIMEOUT", {"default": None, "file": 5.0, "env": 6.0, "flag": 7.0}),
    ],
)
def test_precedence_file_env_flag(
    cfg_file: Any,
    no_default_file: str,
    key: str,
    var: str,
    values: dict[str, Any],
    file: str | None,
    env: str | None,
    flag: str | None,
    expected: str,
) -> None:
    path = cfg_file(f"{key}: {json.dumps(values[file])}\n") if file else None
    environ = {var: str(values[env])} if env else {}
    overrides = {key: values[flag] if flag else None}
    cfg = load_config(path, environ=environ, overrides=overrides)
    assert getattr(cfg, key) == values[expected]


def test_precedence_through_the_cli(plugin_dir: Any, run_cli: Any, np_dirs: dict[str, str]) -> None:
    for name in ("from-file", "from-env", "from-flag"):
        plugin_dir.install(name)
    Path(np_dirs["config"]).write_text("plugin: from-file\n")
    chosen = {
        "file": run_cli("-o", "json", "init"),
        "env": run_cli("-o", "json", "init", env={"NETPLUGIN_PLUGIN": "from-env"}),
        "flag": run_cli("--plugin", "from-flag", "-o", "json", "init", env={"NETPLUGIN_PLUGIN": "from-env"}),
    }
    for r in chosen.values():
        assert r.returncode == 0, r.stderr
    assert {k: json.loads(r.stdout)["plugin"] for k, r in chosen.items()} == {
        "file": "from-file",
        "env": "from-env",
        "flag": "from-flag",
    }


def test_config_file_named_by_environment(cfg_file: Any, no_default_file: str) -> None:
    path = cfg_file("run_dir: /from-env-file\n")
    cfg = load_config(environ={"NETPLUGIN_CONFIG": path})
    assert cfg.run_dir == "/from-env-file"
    assert cfg.config_path == path


def test_explicit_path_beats_netplugin_config(cfg_file: Any, tmp_path: Path) -> None:
    path = cfg_file("run_dir: /explicit\n")
    cfg = load_config(path, environ={"NETPLUGIN_CONFIG": str(tmp_path / "missing.yaml")})
    assert cfg.run_dir == "/explicit"


def test_unset_flags_do_not_override(cfg_file: Any) -> None:
    cfg = load_config(cfg_file("state_dir: /f\n"), environ={}, overrides={"state_dir": None, "timeout": None})
    assert cfg.state_dir == "/f"
    assert cfg.timeout is None


def test_base_config_is_the_starting_point(no_default_file: str) -> None:
    cfg = load_config(environ={"NETPLUGIN_RUN_DIR": "/r"}, base=Config(state_dir="/base"))
    assert (cfg.state_dir, cfg.run_dir) == ("/base", "/r")


# --- files --------------------------------------------------------------------------------------------------


def test_missing_default_file_is_fine(no_default_file: str) -> None:
    cfg = load_config(environ={})
    assert cfg == Config()
    assert cfg.config_path is None


def test_present_default_file_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    default = tmp_path / "netplugin.yaml"
    default.write_text("kill_grace: 0.5\n")
    monkeypatch.setattr(config_mod, "DEFAULT_CONFIG", str(default))
    cfg = load_config(environ={})
    assert cfg.kill_grace == 0.5
    assert cfg.config_path == str(default)


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_missing_explicit_file_is_an_error(tmp_path: Path, how: str) -> None:
    missing = str(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError) as info:
        if how == "argument":
            load_config(missing, environ={})
        else:
            load_config(environ={"NETPLUGIN_CONFIG": missing})
    assert info.value.key == "config"
    assert missing in info.value.message
    assert "No such file or directory" in info.value.message


def test_missing_explicit_file_is_exit_2_via_cli(run_cli: Any, tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.yaml")
    r = run_cli("--config", missing, "init")
    assert r.returncode == 2
    assert missing in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("plugin: [unclosed\n", "not valid YAML"),
        ("- a\n- b\n", "must be a mapping at the top level, got list"),
        ("just a string\n", "must be a mapping at the top level, got str"),
        ("a: !!python/object/apply:os.system ['true']\n", "not valid YAML"),
        ("a: \x80\n", "not valid YAML"),
    ],
)
def test_broken_file_is_a_config_error(tmp_path: Path, text: str, words: str) -> None:
    p = tmp_path / "bad.yaml"
    p.write_bytes(text.encode("latin-1"))
    with pytest.raises(ConfigError) as info:
        load_config(str(p), environ={})
    assert words in info.value.message
    assert info.value.source == str(p)


@pytest.mark.parametrize("text", ["", "# only a comment\n", "---\n"])
def test_empty_file_gives_defaults(cfg_file: Any, text: str) -> None:
    path = cfg_file(text)
    cfg = load_config(path, environ={})
    assert plaindata.replace(cfg, config_path=None) == Config()


def test_yaml_keys_may_use_dashes(cfg_file: Any) -> None:
    cfg = load_config(
        cfg_file("plugin-dir: /p\nkill-grace: 1\nrollback-on-failure: false\nmax_output: 8192\n"), environ={}
    )
    assert (cfg.plugin_dir, cfg.kill_grace, cfg.rollback_on_failure, cfg.max_output) == ("/p", 1.0, False, 8192)


def test_shipped_example_config_loads() -> None:
    if not SHIPPED.exists():
        pytest.skip(f"{SHIPPED} is not written yet")
    cfg = load_config(str(SHIPPED), environ={})
    assert cfg.config_path == str(SHIPPED)
    raw = load_yaml(SHIPPED.read_bytes())
    # every key of the example took effect (none was silently dropped)
    for key, value in raw.items():
        got = getattr(cfg, key.replace("-", "_"))
        got = dict(got) if isinstance(got, dict) else list(got) if isinstance(got, tuple) else got
        assert got == value or (not isinstance(value, list | dict) and got == float(value)), key


def test_config_yaml_goes_through_the_bounded_loader(cfg_file: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # (the loader itself: tests/core/test_yaml.py) a duplicate key is refused with its lines
    with pytest.raises(ConfigError) as info:
        load_config(cfg_file("state_dir: /a\nplugin_dir: /p\nstate_dir: /b\n"), environ={})
    assert "duplicate key 'state_dir' (first on line 1) (line 3, column 1)" in info.value.reason
    with pytest.raises(ValueError):
        load_yaml("a: !!python/object/apply:os.system ['true']\n")


# --- unknown keys and bad values ----------------------------------------------------------------------------


def test_unknown_file_key_names_key_and_file(cfg_file: Any) -> None:
    path = cfg_file("plugn: bridge\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    err = info.value
    assert (err.key, err.source) == ("plugn", path)
    assert err.message.startswith(f"config key 'plugn' (in {path}): unknown key")
    assert "plugin" in err.reason  # the known keys are listed


def test_unknown_flag_names_the_flag() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(environ={}, overrides={"plugin_dirr": "/x"}, base=Config())
    assert (info.value.key, info.value.source) == ("--plugin-dirr", "command line")


def test_unknown_netplugin_environment_variables_are_plugin_settings(no_default_file: str) -> None:
    cfg = load_config(environ={"NETPLUGIN_BRIDGE_SUBNET": "10.200.1.0/24", "NETPLUGIN_WHATEVER": "x"})
    assert cfg == Config()


BAD_VALUES = [
    # (key, YAML value, words of the reason)
    ("timeout", "-1", "positive, finite number of seconds"),
    ("timeout", "0", "positive, finite number of seconds"),
    ("timeout", "abc", "must be a number of seconds"),
    ("timeout", ".inf", "positive, finite"),
    ("timeout", "100000", "at most 86400 seconds"),
    ("timeout", "true", "must be a number of seconds"),
    ("timeouts", "{bogus: 1}", "unknown action 'bogus'"),
    ("timeouts", "{setup: -1}", "setup: must be a positive"),
    ("timeouts", "[1, 2]", "must be a mapping of action to seconds"),
    ("kill_grace", "-1", "positive"),
    ("kube_timeout", "0", "positive"),
    ("inherit_env", "maybe", "must be true or false"),
    ("check_permissions", "2", "must be true or false"),
    ("rollback_on_failure", "[]", "must be true or false"),
    ("host", "x", "must be one of static, none, kube"),
    ("use_daemon", "sometimes", "must be one of auto, never, always"),
    ("netns_template", "'{bad}'", "only field is {infra_id}"),
    ("netns_template", "'/run/netns/{}'", "only field is {infra_id}"),
    ("netns_template", "'/run/netns/{infra_id'", "only field is {infra_id}"),
    ("env", "[a, b]", "must be a mapping of variable name to string value"),
    ("env", "just-a-string", "must be a mapping"),
    ("env", "{A: [1]}", "A: value must be a string"),
    ("env", "{A: true}", "A: value must be a string"),
    ("env", "{'A=B': x}", "bad variable name 'A=B'"),
    ("max_output", "100", "between 4096 and 1073741824 bytes"),
    ("max_output", "lots", "must be a number of bytes"),
    ("plugin", "-bad", "is not a valid plugin name"),
    ("plugin", "a/b/c", "is not a valid plugin name"),
    ("plugin_dir", "''", "must be a non-empty string"),
    ("state_dir", "[/a]", "must be a non-empty string"),
    ("metrics_address", "nope", "must be HOST:PORT"),
    ("metrics_address", "'127.0.0.1:99999'", "must be HOST:PORT"),
    # issue 13: numbers are ASCII and sensible; templates are checked by their fields, never formatted
    ("timeout", "1e-320", "at least 0.001 seconds"),
    ("timeout", "'\u0663'", "written in ASCII digits"),  # ARABIC-INDIC DIGIT THREE: float() takes it
    ("timeout", "'\uff13'", "written in ASCII digits"),  # FULLWIDTH DIGIT THREE
    ("timeout", "'1_0'", "written in ASCII digits"),
    ("timeout", "'nan'", "written in ASCII digits"),
    ("timeouts", "{setup: 0.0001}", "setup: must be at least 0.001 seconds"),
    ("max_output", "'\u0664\u0660\u0669\u0666'", "written in ASCII digits"),
    ("metrics_address", "'127.0.0.1:\u00b2'", "must be HOST:PORT"),
    ("netns_template", "'/run/netns/{infra_id:>999999999}'", "no conversion or format spec"),
    ("netns_template", "'/run/netns/{infra_id!r}'", "no conversion or format spec"),
    ("netns_template", "'/run/netns/{infra_id.__class__}'", "found '{infra_id.__class__}'"),
    ("netns_template", "'/run/netns/{infra_id[0]}'", "only field is {infra_id}"),
]


@pytest.mark.parametrize(("key", "value", "words"), BAD_VALUES, ids=[f"{k}={v}" for k, v, _ in BAD_VALUES])
def test_bad_value_in_file_names_key_value_and_file(cfg_file: Any, key: str, value: str, words: str) -> None:
    path = cfg_file(f"{key}: {value}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    err = info.value
    assert (err.key, err.source) == (key, path)
    assert words in err.reason
    assert "(got " in err.reason  # the offending value is quoted


@pytest.mark.parametrize(
    ("var", "value", "words"),
    [
        ("NETPLUGIN_TIMEOUT", "abc", "number of seconds"),
        ("NETPLUGIN_TIMEOUT", "-1", "positive"),
        ("NETPLUGIN_INHERIT_ENV", "maybe", "true or false"),
        ("NETPLUGIN_HOST", "x", "one of static, none, kube"),
        ("NETPLUGIN_NETNS_TEMPLATE", "{bad}", "{infra_id}"),
        ("NETPLUGIN_PLUGIN", "-bad", "plugin name"),
        ("NETPLUGIN_PLUGIN_DIR", "/a\0b", "NUL"),
        ("NETPLUGIN_USE_DAEMON", "yes", "one of auto"),
        ("NETPLUGIN_TIMEOUT", "1e-320", "at least 0.001"),
        ("NETPLUGIN_TIMEOUT", "\u0663", "written in ASCII digits"),
        ("NETPLUGIN_NETNS_TEMPLATE", "{infra_id:>2000000000}", "format spec"),
    ],
)
def test_bad_value_in_environment_names_the_variable(no_default_file: str, var: str, value: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(environ={var: value})
    err = info.value
    assert (err.key, err.source) == (var, "environment")
    assert words in err.reason
    assert repr(value) in err.reason


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("timeout", "abc", "number of seconds"),
        ("timeout", "-1", "positive"),
        ("timeout", "1e-320", "at least 0.001 seconds"),
        ("timeout", "\u0663", "written in ASCII digits"),
        ("timeout", "\u0661\u0660", "written in ASCII digits"),
        ("plugin", "UPPER/x", "prefix 'UPPER'"),
        ("plugin_dir", "", "non-empty"),
    ],
)
def test_bad_flag_names_the_flag(no_default_file: str, key: str, value: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(environ={}, overrides={key: value})
    flag = "--" + key.replace("_", "-")
    assert (info.value.key, info.value.source) == (flag, "command line")
    assert info.value.message.startswith(f"config key {flag!r} (in command line): ")
    assert words in info.value.reason


# --- good values --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("timeout", "1.5", 1.5),
        ("timeout", "''", None),
        ("timeouts", "{setup: 5}", {**DEFAULT_TIMEOUTS, "setup": 5.0}),
        ("kill_grace", "0", 0.0),
        ("inherit_env", "no", False),
        ("inherit_env", "'off'", False),
        ("check_permissions", "'TRUE'", True),
        ("env", "{A: 1, B: x, C: 1.5}", {"A": "1", "B": "x", "C": "1.5"}),
        ("max_output", "4096", 4096),
        ("host", "none", "none"),
        ("netns_template", "/proc/{infra_id}/ns/net", "/proc/{infra_id}/ns/net"),
        ("netns_template", "'/x/{{lit}}/{infra_id}'", "/x/{{lit}}/{infra_id}"),
        ("timeout", "' 2.5 '", 2.5),
        ("timeout", "1e2", 100.0),
        ("timeout", "0.001", 0.001),
        ("plugin", "''", None),
        ("plugin", "vendor.example/x", "vendor.example/x"),
        ("kubeconfig", "''", None),
        ("socket", "/tmp/s.sock", "/tmp/s.sock"),
    ],
)
def test_good_values(cfg_file: Any, key: str, value: str, expected: Any) -> None:
    cfg = load_config(cfg_file(f"{key}: {value}\n"), environ={})
    got = getattr(cfg, key)
    assert (dict(got) if isinstance(got, dict) else got) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1", True),
        ("true", True),
        ("yes", True),
        ("on", True),
        ("True", True),
        ("0", False),
        ("false", False),
        ("no", False),
        ("off", False),
        ("FALSE", False),
    ],
)
def test_boolean_environment_variables(no_default_file: str, value: str, expected: bool) -> None:
    cfg = load_config(environ={"NETPLUGIN_INHERIT_ENV": value, "NETPLUGIN_ROLLBACK": value})
    assert cfg.inherit_env is expected
    assert cfg.rollback_on_failure is expected


# --- the Config object --------------------------------------------------------------------------------------


def test_timeout_for_uses_the_override_or_the_per_action_limit() -> None:
    cfg = Config(timeouts={**DEFAULT_TIMEOUTS, "setup": 12.0})
    assert [cfg.timeout_for(a) for a in ("init", "setup", "teardown", "status")] == [10.0, 12.0, 30.0, 10.0]
    forced = plaindata.replace(cfg, timeout=0.5)
    assert {forced.timeout_for(a) for a in ("init", "setup", "teardown", "status")} == {0.5}


def test_derived_paths() -> None:
    cfg = Config(run_dir="/r", netns_template="/var/run/netns/np-{infra_id}")
    assert cfg.socket_path == "/r/netplugin.sock"
    assert plaindata.replace(cfg, socket="/s.sock").socket_path == "/s.sock"
    assert cfg.netns_path("abc") == "/var/run/netns/np-abc"


def test_config_is_frozen_and_serialisable() -> None:
    cfg = Config(env={"A": "1"})
    with pytest.raises(plaindata.FrozenInstanceError):
        cfg.plugin = "x"  # type: ignore[misc]
    d = json.loads(json.dumps(cfg.to_dict()))
    assert d["env"] == {"A": "1"}
    assert d["timeouts"] == DEFAULT_TIMEOUTS
    assert set(d) == {f.name for f in plaindata.fields(Config)}


# --- cluster_cidrs (egress, issue 11) -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("[10.244.0.0/16, 'fd00:10:244::/48']", ("10.244.0.0/16", "fd00:10:244::/48")),
        ("'10.244.0.0/16, FD00:10:244::/48'", ("10.244.0.0/16", "fd00:10:244::/48")),
        ("''", ()),
        ("[]", ()),
    ],
)
def test_cluster_cidrs_good(cfg_file: Any, value: str, expected: tuple[str, ...]) -> None:
    assert load_config(cfg_file(f"cluster_cidrs: {value}\n"), environ={}).cluster_cidrs == expected


def test_cluster_cidrs_from_the_environment(no_default_file: str) -> None:
    cfg = load_config(environ={"NETPLUGIN_CLUSTER_CIDRS": "10.244.0.0/16,fd00:10:244::/48"})
    assert cfg.cluster_cidrs == ("10.244.0.0/16", "fd00:10:244::/48")
    assert load_config(environ={}).cluster_cidrs == ()


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("[10.244.0.1/16]", "'10.244.0.1/16' is not a network in CIDR form (10.244.0.1/16 has host bits set)"),
        ("'10.244.0.0/16,'", "'' is not a network in CIDR form"),
        ("{a: 1}", "must be a list of networks"),
        ("[10.244.0.0/16, 7]", "7 is not a network in CIDR form"),
    ],
)
def test_cluster_cidrs_bad(cfg_file: Any, value: str, words: str) -> None:
    path = cfg_file(f"cluster_cidrs: {value}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    assert (info.value.key, info.value.source) == ("cluster_cidrs", path)
    assert words in info.value.reason


def test_node_settings(tmp_path: Any) -> None:
    cfg_file = tmp_path / "n.yaml"
    cfg_file.write_text("node_name: worker-1.example\nnode_routes: false\nnode_resync: 5\n")
    cfg = load_config(str(cfg_file), environ={"NETPLUGIN_NODES_DIR": "/srv/nodes", "NODE_NAME": "ignored-here"})
    got = (cfg.node_name, cfg.node_routes, cfg.node_resync, cfg.nodes_dir)
    assert got == ("worker-1.example", False, 5.0, "/srv/nodes")
    assert load_config(os.devnull, environ={}).node_name is None  # resolved later: NODE_NAME, then the hostname
    cfg_file.write_text("node_name: Worker_1\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(cfg_file), environ={})
    assert "node_name" in str(info.value) and "DNS-1123" in str(info.value)


# --- hostile files (issue 13): bounded time and memory, a ConfigError naming the key -----------------------


def test_dash_and_underscore_spellings_of_one_key_clash(cfg_file: Any) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(cfg_file("state-dir: /a\nstate_dir: /b\n"), environ={})
    assert info.value.key == "state_dir"
    assert "given twice, as 'state-dir' and 'state_dir'" in info.value.reason


def test_alias_bomb_under_a_known_key_is_refused_small(cfg_file: Any) -> None:
    # Nine levels of nine aliases: 9**9 strings once expanded. Refused while composing, and the
    # error quotes nothing of the value.
    lines = ['env: [&a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f", &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    with pytest.raises(ConfigError) as info:
        load_config(cfg_file("".join(lines) + "]\n"), environ={})
    assert info.value.key == "config"
    assert "nodes (aliases expanded)" in info.value.reason
    assert len(info.value.message) < 400


def test_a_value_is_quoted_short_in_errors(cfg_file: Any) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(cfg_file("timeout: [" + ", ".join(["x" * 50] * 1000) + "]\n"), environ={})
    assert "(got ['xxxx" in info.value.reason
    assert len(info.value.message) < 300


def test_oversized_fifo_and_device_config_files(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_bytes(b"# " + b"x" * config_mod.MAX_CONFIG_BYTES + b"\n")
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)  # nobody writes: a plain open() would block for ever
    for path, words in ((big, "larger than the limit"), (fifo, "not a regular file"), ("/dev/zero", "larger")):
        with pytest.raises(ConfigError) as info:
            load_config(str(path), environ={})
        assert (info.value.key, info.value.source) == ("config", str(path))
        assert words in info.value.reason
    assert load_config("/dev/null", environ={}).config_path == "/dev/null"  # an empty config


def test_netns_template_width_is_never_formatted(monkeypatch: pytest.MonkeyPatch) -> None:
    # Validation must not call str.format (which would allocate the width); parse() alone checks it.
    calls: list[str] = []
    real = str.format

    class Spy(str):
        def format(self, *a: Any, **k: Any) -> str:
            calls.append(str(self))
            return real(self, *a, **k)

    with pytest.raises(ConfigError):
        load_config(environ={"NETPLUGIN_NETNS_TEMPLATE": Spy("/n/{infra_id:>999999999999}")})
    assert calls == []
