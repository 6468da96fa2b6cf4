"""The CLI's fast path (netplugin.frontends.cli.entry): setup/teardown/status through the daemon without click.

It must print exactly what the full CLI prints (same text, JSON, messages and exit codes), import
nothing but the standard library's few modules, and leave everything it cannot serve to the full CLI.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from netplugin.frontends.cli import app as full_cli
from netplugin.frontends.cli import entry as thin
from tests.frontends.fastpath import outside_allowed

REPO = Path(__file__).resolve().parents[3]
POD = ("default", "web-0", "infra0")


def test_exit_codes_are_the_full_clis() -> None:
    assert thin.EXIT_CODES == full_cli.EXIT_CODES


@pytest.mark.parametrize(
    ("argv", "served"),
    [
        (["setup", "ns", "pod", "id"], True),
        (["-o", "json", "status", "ns", "pod", "id"], True),
        (["--output=json", "--run-dir", "/r", "teardown", "ns", "pod", "id"], True),
        (["--config", "/c.yaml", "--plugin=x", "setup", "ns", "pod", "id"], True),
        (["-v", "setup", "ns", "pod", "id"], False),
        (["setup", "ns", "pod"], False),
        (["setup", "ns", "pod", "id", "extra"], False),
        (["setup", "--help"], False),
        (["pods"], False),
        (["-o", "yaml", "setup", "ns", "pod", "id"], False),
        (["--plugin"], False),
    ],
)
def test_only_plain_pod_commands_take_the_fast_path(argv: list[str], served: bool) -> None:
    assert (thin.parse_pod_command(argv, {}) is not None) is served


def _both(cli: Any, *args: str, env: dict[str, str]) -> tuple[Any, Any]:
    """The same command through the daemon (fast path) and alone (use_daemon: never)."""
    return cli(*args, env=env), cli(*args, mode="never", env=env)


def test_output_and_errors_match_the_full_cli(start_daemon: Any, cli: Any, plugin_dir: Any) -> None:
    p = plugin_dir.install("scripted")
    p.set("status", stdout='{"ip": "10.203.0.7"}')
    start_daemon(env={"NETPLUGIN_PLUGIN": "scripted"})
    env = {"NETPLUGIN_PLUGIN": "scripted"}
    for args in (
        ("-o", "json", "setup", *POD),
        ("setup", *POD),
        ("status", *POD),
        ("-o", "json", "status", *POD),
        ("-o", "json", "teardown", *POD),
        ("teardown", *POD),
    ):
        served, alone = _both(cli, *args, env=env)
        assert (served.returncode, served.stdout, served.stderr) == (alone.returncode, alone.stdout, alone.stderr)
    p.set("setup", exit=3, stderr="np: no more addresses")
    for args in (("setup", *POD), ("-o", "json", "setup", *POD)):
        served, alone = _both(cli, *args, env=env)
        assert served.returncode == alone.returncode == 1
        assert served.stdout == alone.stdout
        if "json" in args:
            assert json.loads(served.stderr) == json.loads(alone.stderr)
        else:
            assert served.stderr == alone.stderr
            assert "no more addresses" in served.stderr
    # each of the 4 setup commands ran once through the daemon and once alone
    assert len([line for line in p.calls() if line.startswith("setup")]) == 8


def test_the_fast_path_imports_neither_click_nor_the_library(
    start_daemon: Any, cli_env: dict[str, str], plugin_dir: Any
) -> None:
    p = plugin_dir.install("scripted")
    p.set("status", stdout='{"ip": "10.203.0.7"}')
    start_daemon(env={"NETPLUGIN_PLUGIN": "scripted"})
    code = (
        "import sys\n"
        "from netplugin.frontends.cli import entry as thin\n"
        "try:\n"
        "    thin.main(['status', 'default', 'web-0', 'infra0'])\n"
        "except SystemExit as e:\n"
        "    print(e.code, sorted(sys.modules), file=sys.stderr)\n"
    )
    env = {**cli_env, "NETPLUGIN_USE_DAEMON": "auto", "NETPLUGIN_PLUGIN": "scripted"}
    done = subprocess.run([sys.executable, "-S", "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout == "10.203.0.7\n", done.stderr
    status, _, modules = done.stderr.strip().partition(" ")
    assert status == "0"
    assert outside_allowed(eval(modules)) == []
    assert "netplugin.frontends.wire.codes" in eval(modules)  # the check sees the fast path's own imports


def test_a_refusing_daemon_leaves_the_work_to_the_full_cli(start_daemon: Any, cli: Any, plugin_dir: Any) -> None:
    p = plugin_dir.install("scripted")
    p.set("status", stdout='{"ip": "10.203.0.7"}')
    start_daemon(env={"NETPLUGIN_PLUGIN": "scripted"})
    # Another plugin: the daemon refuses, the full CLI runs the action alone.
    other = plugin_dir.install("other")
    r = cli("setup", *POD, env={"NETPLUGIN_PLUGIN": "other"})
    assert r.returncode == 0, r.stderr
    assert other.env_of("setup")["NP_TEST_ORIGIN"] == "cli"
    # A bad setting: the same usage error (exit 2) as alone, naming the key.
    served, alone = _both(cli, "setup", *POD, env={"NETPLUGIN_PLUGIN": "scripted", "NETPLUGIN_TIMEOUT": "soon"})
    assert served.returncode == alone.returncode == 2
    assert served.stderr == alone.stderr and "NETPLUGIN_TIMEOUT" in served.stderr
