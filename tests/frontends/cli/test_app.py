"""The ``netplugin`` command line, run as a real process: exit codes, streams, JSON, cold start."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import netplugin
from netplugin.core.errors import (
    ConfigError,
    DiscoveryError,
    HostError,
    InvalidArgument,
    NetpluginError,
    PluginFailed,
    PluginInvalid,
    PluginNotFound,
    PluginOutputError,
    PluginTimeout,
    StateError,
    SystemFailure,
)
from netplugin.frontends.wire.codes import EXIT_CODES, exit_code_for

POD = ["default", "web-0", "abc123"]


class Case:
    """One row of the exit-code table: how to prepare the node, the argv, and what must come out."""

    def __init__(self, args: list[str], code: int, words: str | None = None, *,
                 prepare: Callable[[Any, dict[str, str], Path], dict[str, str] | None] | None = None,
                 runs_plugin: bool = True, mode: int = 0o755) -> None:
        self.args, self.code, self.words = args, code, words
        self.prepare, self.runs_plugin, self.mode = prepare, runs_plugin, mode


def _steer(action: str, **files: Any) -> Callable[[Any, dict[str, str], Path], None]:
    def prepare(p: Any, dirs: dict[str, str], tmp: Path) -> None:
        p.set(action, **files)

    return prepare


def _env(**env: str) -> Callable[[Any, dict[str, str], Path], dict[str, str]]:
    def prepare(p: Any, dirs: dict[str, str], tmp: Path) -> dict[str, str]:
        return {k: v.format(tmp=tmp) for k, v in env.items()}

    return prepare


def _config_file(text: str) -> Callable[[Any, dict[str, str], Path], None]:
    def prepare(p: Any, dirs: dict[str, str], tmp: Path) -> None:
        Path(dirs["config"]).write_text(text)

    return prepare


def _plugin_dir_is_a_file(p: Any, dirs: dict[str, str], tmp: Path) -> dict[str, str]:
    (tmp / "a-file").write_text("")
    return {"NETPLUGIN_PLUGIN_DIR": str(tmp / "a-file")}


def _broken_manifest(p: Any, dirs: dict[str, str], tmp: Path) -> None:
    Path(dirs["pods_dir"], "broken.yaml").write_text("metadata: {name: web-0, labels: [unclosed\n")  # names the pod


PLUGIN = ["--plugin", "p"]

CASES: dict[str, Case] = {
    "ok-setup": Case([*PLUGIN, "setup", *POD], 0),
    "ok-teardown": Case([*PLUGIN, "teardown", *POD], 0),
    "ok-status": Case([*PLUGIN, "status", *POD], 0),
    "ok-init": Case([*PLUGIN, "init"], 0),
    "ok-plugins": Case(["plugins"], 0, runs_plugin=False),
    "plugin-failed": Case([*PLUGIN, "setup", *POD], 1, "network plugin 'p' setup failed: exit status 7; stderr: 'boom'",
                          prepare=_steer("setup", exit=7, stderr="boom\n")),
    "plugin-killed": Case([*PLUGIN, "teardown", *POD], 1, "teardown failed: killed by signal SIGKILL",
                          prepare=_steer("teardown", exit="signal:KILL")),
    "plugin-left-processes": Case([*PLUGIN, "setup", *POD], 1, "left 1 process(es) running",
                                  prepare=_steer("setup", spawn=1)),
    "bad-status-output": Case([*PLUGIN, "status", *POD], 1, "status for pod default/web-0: output is not JSON",
                              prepare=_steer("status", stdout="10.1.2.3\n")),
    "failed-init": Case([*PLUGIN, "status", *POD], 1, "network plugin 'p' init failed: exit status 1",
                        prepare=_steer("init", exit=1)),
    "bad-namespace": Case([*PLUGIN, "setup", "Bad_NS", "web-0", "abc"], 2, "invalid namespace 'Bad_NS'",
                          runs_plugin=False),
    "bad-pod-name": Case([*PLUGIN, "teardown", "default", "Web_0", "abc"], 2, "invalid pod name 'Web_0'",
                         runs_plugin=False),
    "bad-infra-id": Case([*PLUGIN, "status", "default", "web-0", "a/b"], 2, "invalid infra container id 'a/b'",
                         runs_plugin=False),
    "dash-infra-id": Case([*PLUGIN, "setup", "--", "default", "web-0", "-abc"], 2,
                          "invalid infra container id '-abc'", runs_plugin=False),
    "long-namespace": Case([*PLUGIN, "setup", "n" * 64, "web-0", "abc"], 2, "invalid namespace", runs_plugin=False),
    "missing-argument": Case([*PLUGIN, "setup", "default", "web-0"], 2, "Missing argument 'INFRA_ID'",
                             runs_plugin=False),
    "extra-argument": Case([*PLUGIN, "setup", *POD, "more"], 2, "Got unexpected extra argument",
                           runs_plugin=False),
    "unknown-option": Case([*PLUGIN, "setup", "--bogus", *POD], 2, "--bogus", runs_plugin=False),
    "unknown-command": Case(["frobnicate"], 2, "No such command 'frobnicate'", runs_plugin=False),
    "bad-output-format": Case(["-o", "xml", *PLUGIN, "init"], 2, "Invalid value for '-o'", runs_plugin=False),
    "bad-timeout-flag": Case(["--timeout", "abc", *PLUGIN, "setup", *POD], 2,
                             "config key '--timeout' (in command line): must be a number of seconds (got 'abc')",
                             runs_plugin=False),
    "bad-plugin-name": Case(["--plugin", "a/b/c", "setup", *POD], 2, "config key '--plugin'", runs_plugin=False),
    "bad-env-value": Case([*PLUGIN, "setup", *POD], 2, "config key 'NETPLUGIN_HOST' (in environment)",
                          prepare=_env(NETPLUGIN_HOST="x"), runs_plugin=False),
    "bad-config-key": Case([*PLUGIN, "setup", *POD], 2, "config key 'plugn'",
                           prepare=_config_file("plugn: p\n"), runs_plugin=False),
    "bad-config-yaml": Case([*PLUGIN, "setup", *POD], 2, "not valid YAML",
                            prepare=_config_file("plugin: [p\n"), runs_plugin=False),
    "missing-config-file": Case(["--config", "/nonexistent/netplugin.yaml", *PLUGIN, "init"], 2,
                                "/nonexistent/netplugin.yaml", runs_plugin=False),
    "not-found": Case(["--plugin", "nope", "setup", *POD], 3, "network plugin 'nope' not found (available: ",
                      runs_plugin=False),
    "not-executable": Case([*PLUGIN, "setup", *POD], 3, "network plugin 'p' is invalid: not executable",
                           mode=0o644, runs_plugin=False),
    "unsafe-permissions": Case([*PLUGIN, "setup", *POD], 3, "is invalid: unsafe permissions", mode=0o777,
                               runs_plugin=False),
    "timeout": Case(["--timeout", "0.5", *PLUGIN, "setup", *POD], 4,
                    "network plugin 'p' setup timed out after 0.5s", prepare=_steer("setup", sleep=5)),
    "missing-plugin-dir": Case([*PLUGIN, "setup", *POD], 5, "cannot read plugin dir {tmp}/missing",
                               prepare=_env(NETPLUGIN_PLUGIN_DIR="{tmp}/missing"), runs_plugin=False),
    "plugin-dir-is-a-file": Case([*PLUGIN, "init"], 5, "cannot read plugin dir", prepare=_plugin_dir_is_a_file,
                                 runs_plugin=False),
    "host-error-on-setup": Case([*PLUGIN, "setup", *POD], 5, "broken.yaml", prepare=_broken_manifest),
}


def _run_case(case: Case, plugin_dir: Any, np_dirs: dict[str, str], tmp_path: Path, run_cli: Any,
              extra: list[str] | None = None) -> tuple[Any, subprocess.CompletedProcess[str]]:
    p = plugin_dir.install("p", mode=case.mode)
    env = (case.prepare(p, np_dirs, tmp_path) if case.prepare else None) or {}
    r = run_cli(*(extra or []), *case.args, env=env)
    return p, r


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_exit_codes_and_messages(case: Case, plugin_dir: Any, np_dirs: dict[str, str], tmp_path: Path,
                                 run_cli: Any) -> None:
    p, r = _run_case(case, plugin_dir, np_dirs, tmp_path, run_cli)
    assert r.returncode == case.code, r.stderr
    assert "Traceback" not in r.stderr
    if case.code == 0:
        assert r.stderr == ""
    else:
        assert r.stdout == ""  # data only on success; messages go to stderr
        assert case.words is not None and case.words.format(tmp=tmp_path) in r.stderr
        if case.code != 2 or not re.search(r"Usage:|Error: ", r.stderr):
            assert r.stderr.startswith("netplugin: error: ")
            assert r.stderr.count("\n") == 1  # one line, for logs
    if not case.runs_plugin:
        assert p.calls() == []


JSON_CASES = ["plugin-failed", "bad-namespace", "bad-config-key", "not-found", "timeout", "missing-plugin-dir",
              "bad-status-output"]


@pytest.mark.parametrize("name", JSON_CASES)
def test_json_error_document_on_stderr(name: str, plugin_dir: Any, np_dirs: dict[str, str], tmp_path: Path,
                                       run_cli: Any) -> None:
    case = CASES[name]
    _, r = _run_case(case, plugin_dir, np_dirs, tmp_path, run_cli, extra=["-o", "json"])
    assert r.returncode == case.code
    assert r.stdout == ""
    doc = json.loads(r.stderr)
    assert doc["exit_code"] == case.code
    assert case.words is not None and case.words.format(tmp=tmp_path) in doc["message"]
    assert doc["error"] in {"PluginFailed", "InvalidArgument", "ConfigError", "PluginNotFound", "PluginTimeout",
                            "DiscoveryError", "PluginOutputError"}


def test_json_error_document_carries_the_details(plugin_dir: Any, run_cli: Any) -> None:
    p = plugin_dir.install("p")
    p.set("setup", exit=3, stderr="no such bridge\n")
    p.set("teardown", exit=4, stderr="cannot either\n")
    r = run_cli("-o", "json", "--plugin", "p", "setup", *POD)
    doc = json.loads(r.stderr)
    assert doc["error"] == "PluginFailed"
    assert (doc["plugin"], doc["action"], doc["exit_status"], doc["pod"]) == ("p", "setup", 3, "default/web-0")
    assert doc["stderr_tail"] == "no such bridge"
    assert "teardown failed: exit status 4" in doc["rollback_error"]


def test_json_error_for_bad_input_names_the_field(run_cli: Any) -> None:
    r = run_cli("-o", "json", "setup", "default", "web-0", "a b")
    assert r.returncode == 2
    doc = json.loads(r.stderr)
    assert (doc["error"], doc["field"], doc["value"]) == ("InvalidArgument", "infra container id", "a b")


# --- data on stdout -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stdout", "text", "json_doc"),
    [
        ('{"ip":"10.203.0.9"}', "10.203.0.9\n",
         {"apiVersion": "v1beta1", "kind": "PodNetworkStatus", "ip": "10.203.0.9"}),
        ('{"ip":"FD00::0009"}', "fd00::9\n", {"apiVersion": "v1beta1", "kind": "PodNetworkStatus", "ip": "fd00::9"}),
        ("", "", None),
    ],
)
def test_status_prints_the_ip_alone_or_nothing(plugin_dir: Any, run_cli: Any, stdout: str, text: str,
                                               json_doc: dict[str, str] | None) -> None:
    p = plugin_dir.install("p")
    p.set("status", stdout=stdout, stderr="plugin chatter\n")
    r = run_cli("--plugin", "p", "status", *POD)
    assert (r.returncode, r.stdout, r.stderr) == (0, text, "")
    r = run_cli("--plugin", "p", "-o", "json", "status", *POD)
    assert r.returncode == 0
    assert json.loads(r.stdout) == json_doc


@pytest.mark.parametrize(
    ("command", "doc"),
    [
        ("setup", {"namespace": "default", "pod": "web-0", "infra_id": "abc123", "ip": None}),
        ("teardown", {"namespace": "default", "pod": "web-0", "infra_id": "abc123"}),
    ],
)
def test_pod_commands_print_data_only_in_json(plugin_dir: Any, run_cli: Any, command: str,
                                              doc: dict[str, Any]) -> None:
    plugin_dir.install("p")
    text = run_cli("--plugin", "p", command, *POD)
    assert (text.returncode, text.stdout, text.stderr) == (0, "", "")
    js = run_cli("--plugin", "p", "-o", "json", command, *POD)
    assert js.returncode == 0
    assert json.loads(js.stdout) == doc


def test_output_format_from_the_environment(plugin_dir: Any, run_cli: Any) -> None:
    plugin_dir.install("p")
    r = run_cli("--plugin", "p", "init", env={"NETPLUGIN_OUTPUT": "json"})
    assert json.loads(r.stdout) == {"plugin": "p", "ran": True}


def test_version(run_cli: Any) -> None:
    r = run_cli("--version")
    assert (r.returncode, r.stdout) == (0, f"netplugin {netplugin.__version__}\n")


@pytest.mark.parametrize("args", [["--help"], ["-h"], ["setup", "--help"]])
def test_help(run_cli: Any, args: list[str]) -> None:
    r = run_cli(*args)
    assert r.returncode == 0
    assert r.stdout.startswith("Usage: netplugin")


def test_verbose_init_says_what_happened(plugin_dir: Any, run_cli: Any) -> None:
    plugin_dir.install("p")
    assert "init ran for p" in run_cli("-v", "--plugin", "p", "init").stderr
    assert "init already done for p" in run_cli("-v", "--plugin", "p", "init").stderr


# --- the error -> exit code table itself --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("err", "code"),
    [
        (PluginFailed("x", plugin="p", action="setup"), 1),
        (PluginOutputError("x", plugin="p", action="status"), 1),
        (PluginTimeout(plugin="p", action="setup", timeout=1), 4),
        (InvalidArgument("namespace", "X", "bad"), 2),
        (ConfigError("k", "bad"), 2),
        (PluginNotFound("p"), 3),
        (PluginInvalid("p", "bad"), 3),
        (DiscoveryError("/x", "gone"), 5),
        (SystemFailure("cannot lock", "/x", "EIO"), 5),
        (StateError("/x", "corrupt"), 5),
        (HostError("down"), 5),
        (NetpluginError("other"), 5),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Exception) else str(v),
)
def test_exit_code_for(err: NetpluginError, code: int) -> None:
    assert exit_code_for(err) == code
    assert set(EXIT_CODES.values()) <= {1, 2, 3, 4, 5, 6, 70}


# --- cold start ---------------------------------------------------------------------------------------------

HEAVY = ["pyroute2", "lightkube", "prometheus_client", "psutil", "yaml"]

COLD = """
import json, sys
import netplugin.core.config
if {no_config}:
    netplugin.core.config.DEFAULT_CONFIG = {missing!r}   # the machine's own file is never read here
import netplugin.frontends.cli.app
try:
    netplugin.frontends.cli.app.main(["--plugin", "trivial", "setup", "default", "web-0", "abc123"])
except SystemExit as e:
    code = e.code
print(json.dumps({{"code": code, "loaded": [m for m in {heavy!r} if m in sys.modules]}}))
"""

TRIVIAL = '#!/bin/sh\necho "$@" >> "$(dirname "$0")/calls.log"\n'
LEAVES_A_CHILD = TRIVIAL + 'if [ "$1" = setup ]; then sleep 300 & fi\n'


def _cold_env(cli_env: dict[str, str], with_config: bool) -> dict[str, str]:
    env = {k: v for k, v in cli_env.items() if k not in ("NETPLUGIN_USE_DAEMON", "NETPLUGIN_CONFIG")}
    if with_config:
        env["NETPLUGIN_CONFIG"] = cli_env["NETPLUGIN_CONFIG"]
    return env


@pytest.mark.parametrize(
    ("script", "with_config", "code", "loaded", "rollback"),
    [
        pytest.param(TRIVIAL, False, 0, [], [], id="no-config-file"),
        pytest.param(TRIVIAL, True, 0, ["yaml"], [], id="with-config-file"),
        pytest.param(LEAVES_A_CHILD, False, 1, [], ["teardown default web-0 abc123"], id="kill-path"),
    ],
)
def test_cold_start_imports(plugin_dir: Any, cli_env: dict[str, str], tmp_path: Path, script: str,
                            with_config: bool, code: int, loaded: list[str], rollback: list[str]) -> None:
    p = plugin_dir.install("trivial", script=script)
    src = COLD.format(no_config=not with_config, missing=str(tmp_path / "none.yaml"), heavy=HEAVY)
    r = subprocess.run([sys.executable, "-c", src], env=_cold_env(cli_env, with_config), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.splitlines()[-1])
    assert out["code"] == code
    assert out["loaded"] == loaded  # pyroute2, lightkube, prometheus_client never; psutil not even to kill
    assert p.calls() == ["init", "setup default web-0 abc123", *rollback]


def test_cold_start_import_time_is_reported(plugin_dir: Any, cli_env: dict[str, str], tmp_path: Path) -> None:
    plugin_dir.install("trivial", script=TRIVIAL)
    src = COLD.format(no_config=True, missing=str(tmp_path / "none.yaml"), heavy=HEAVY)
    r = subprocess.run([sys.executable, "-X", "importtime", "-c", src], env=_cold_env(cli_env, False),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    rows = [line.split("|") for line in r.stderr.splitlines() if line.startswith("import time:")][1:]
    total_us = sum(int(row[0].split(":")[1]) for row in rows)
    names = {row[2].strip() for row in rows}
    assert "netplugin.frontends.cli" in names and "click" in names
    assert not names & set(HEAVY)
    print(f"\ncold-start import time (python -X importtime, sum of self): {total_us / 1000:.1f} ms "
          f"over {len(rows)} modules")
