"""The daemon's log: one line per pod action with its fields, errors with their data, text or JSON."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.support.waits import WITHIN, wait_for

POD = ("default", "web-0", "infra0")
STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"


def _json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line]


def _actions(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [doc for doc in lines if doc["logger"] == "netplugin.pods"]


@pytest.fixture
def json_daemon(start_daemon: Any, plugin_dir: Any) -> Any:
    """A daemon with the scripted plugin, logging JSON (config key through its variable) at info."""
    plugin = plugin_dir.install("scripted")
    env = {"NETPLUGIN_PLUGIN": "scripted", "NETPLUGIN_LOG_FORMAT": "json"}
    return start_daemon(env=env), plugin, env


def test_each_pod_action_is_one_line_with_its_fields(json_daemon: Any, cli: Any) -> None:
    d, _, env = json_daemon
    for action in ("setup", "status", "teardown"):
        assert cli(action, *POD, env=env, mode="always").returncode == 0
    d.stop()
    lines = _json_lines(d.output())
    assert all(re.fullmatch(STAMP, doc["time"]) for doc in lines), lines
    # status is debug (the kubelet asks at every pod sync): at info, setup and teardown only, once each.
    acts = _actions(lines)
    assert [(a["action"], a["level"], a["outcome"]) for a in acts] == [
        ("setup", "info", "ok"),
        ("teardown", "info", "ok"),
    ]
    for a in acts:
        assert (a["pod"], a["infra_id"], a["chain"]) == ("default/web-0", "infra0", "scripted")
        assert isinstance(a["duration_ms"], float) and a["duration_ms"] > 0
        assert a["msg"] == f"{a['action']} default/web-0: ok"


def test_a_failed_action_carries_the_errors_data(json_daemon: Any, cli: Any) -> None:
    d, plugin, env = json_daemon
    plugin.set("setup", exit=3, stderr="no bridge here")
    r = cli("-o", "json", "setup", *POD, env=env, mode="always")
    assert r.returncode == 1
    answer = json.loads(r.stderr)
    d.stop()
    [line] = _actions(_json_lines(d.output()))
    assert (line["level"], line["outcome"], line["error"]) == ("error", "error", "PluginFailed")
    # The line says what the error answer says: every field of the error's data, its message as msg.
    for key, value in answer.items():
        if key not in ("message", "exit_code"):
            assert line[key] == value, key
    assert line["msg"].endswith(answer["message"])
    assert "no bridge here" in json.dumps(line)
    # Logged once: the daemon's request handler does not log the same failure again.
    assert sum("no bridge here" in text for text in d.output().splitlines()) == 1


def test_text_lines_end_with_key_value_fields(start_daemon: Any, cli: Any, plugin_dir: Any) -> None:
    plugin_dir.install("scripted")
    env = {"NETPLUGIN_PLUGIN": "scripted"}
    d = start_daemon(env=env)
    # A caller's own log settings are no behaviour setting: the daemon runs the call (not declined).
    assert cli("--log-format", "json", "setup", *POD, env=env, mode="auto").returncode == 0
    d.stop()
    assert "declined" not in d.output()
    [line] = [ln for ln in d.output().splitlines() if " setup default/web-0: ok " in ln]
    assert re.fullmatch(
        STAMP + r" INFO setup default/web-0: ok action=setup pod=default/web-0 infra_id=infra0 chain=scripted"
        r" outcome=ok duration_ms=[0-9.]+",
        line,
    ), line


def test_log_level_shows_debug_or_hides_info(start_daemon: Any, cli: Any, plugin_dir: Any) -> None:
    plugin_dir.install("scripted")
    env = {"NETPLUGIN_PLUGIN": "scripted", "NETPLUGIN_LOG_LEVEL": "debug"}
    d = start_daemon(env=env)
    assert cli("status", *POD, env=env, mode="always").returncode == 0
    d.stop()
    assert re.search(STAMP + r" DEBUG status default/web-0: ok ", d.output())
    # warning hides the daemon's info lines (and -v, which asks for info, does not override it)
    env["NETPLUGIN_LOG_LEVEL"] = "warning"
    quiet = start_daemon(env=env)
    assert cli("setup", *POD, env=env, mode="always").returncode == 0
    quiet.stop()
    assert " INFO " not in quiet.output() and " DEBUG " not in quiet.output()


def test_a_declined_call_is_not_logged_as_a_fault(start_daemon: Any, cli: Any, plugin_dir: Any) -> None:
    plugin_dir.install("scripted")
    plugin_dir.install("other")
    d = start_daemon(env={"NETPLUGIN_PLUGIN": "scripted"})
    # Other settings: the daemon declines, the CLI does it itself (use_daemon: auto).
    r = cli("setup", *POD, env={"NETPLUGIN_PLUGIN": "other"}, mode="auto")
    assert r.returncode == 0, r.stderr
    d.stop()
    out = d.output()
    assert re.search(STAMP + r" INFO declined setup default/web-0.*different settings \(plugin\)", out), out
    assert "unavailable" not in out and " WARNING " not in out


def test_a_bad_log_level_is_a_usage_error_naming_it(run_cli: Any) -> None:
    r = run_cli("--log-level", "loud", "pods")
    assert r.returncode == 2
    assert "--log-level" in r.stderr and "loud" in r.stderr and "debug, info, warning, error" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize(
    ("edited", "expect"),
    [
        pytest.param("log_level: debug\n", STAMP + r" DEBUG status default/web-0: ok ", id="level-debug"),
        pytest.param(
            "log_format: json\n", r'\{"time":"[^"]+","level":"info",[^\n]*"msg":"setup default/web-0: ok"', id="json"
        ),
    ],
)
def test_a_reload_applies_the_log_settings(
    start_daemon: Any, cli: Any, plugin_dir: Any, tmp_path: Path, edited: str, expect: str
) -> None:
    plugin_dir.install("scripted")
    config = tmp_path / "reload.yaml"
    config.write_text("plugin: scripted\n")
    d = start_daemon("--config", str(config))
    config.write_text("plugin: scripted\n" + edited)
    d.signal(signal.SIGHUP)
    wait_for(lambda: d.health()["reloads"] == 1, "the reload to finish", WITHIN)
    assert "taken" in d.health()["settings"]
    env = {"NETPLUGIN_CONFIG": str(config)}
    for action in ("setup", "status"):
        assert cli(action, *POD, env=env, mode="always").returncode == 0
    d.stop()
    before, _, after = d.output().partition("reload: ")
    assert not re.search(expect, before)  # the lines started as text at info
    assert re.search(expect, after), after
