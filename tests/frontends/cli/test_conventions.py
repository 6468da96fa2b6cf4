"""Conventions users of a CLI expect: completion, ``-o`` anywhere, JSON usage errors, --version, extras."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import netplugin

REPO = Path(__file__).resolve().parents[3]


def _run(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("NETPLUGIN_", "_NETPLUGIN"))}
    full.update({"PYTHONPATH": str(REPO), **(env or {})})
    return subprocess.run(
        [sys.executable, "-m", "netplugin", *args],
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


# --- completion ----------------------------------------------------------------------------------


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_prints_the_shells_hook(shell: str) -> None:
    out = _run("completion", shell)
    assert out.returncode == 0, out.stderr
    assert "_NETPLUGIN_COMPLETE" in out.stdout
    assert f"{shell}_complete" in out.stdout  # the hook asks netplugin back in its own format


def test_completion_env_var_prints_the_bash_hook() -> None:
    out = _run(env={"_NETPLUGIN_COMPLETE": "bash_source"})
    assert out.returncode == 0, out.stderr
    # the same script; click versions differ in the one newline that ends it
    assert out.stdout.rstrip("\n") == _run("completion", "bash").stdout.rstrip("\n")


def test_completion_answers_commands_and_options() -> None:
    words = _run(env={"_NETPLUGIN_COMPLETE": "bash_complete", "COMP_WORDS": "netplugin pl", "COMP_CWORD": "1"})
    assert words.returncode == 0, words.stderr
    assert "plain,plugins" in words.stdout.splitlines()
    opts = _run(env={"_NETPLUGIN_COMPLETE": "bash_complete", "COMP_WORDS": "netplugin pods --o", "COMP_CWORD": "2"})
    assert "plain,--output" in opts.stdout.splitlines()


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_bash_sources_the_completion_and_completes(tmp_path: Path) -> None:
    # A real bash: source the hook, then run the completion function it registered.
    shim = tmp_path / "netplugin"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m netplugin "$@"\n')
    shim.chmod(0o755)
    script = (
        'eval "$(netplugin completion bash)"\n'
        "COMP_WORDS=(netplugin tear); COMP_CWORD=1\n"
        "_netplugin_completion netplugin\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    env = {"PATH": f"{tmp_path}:{os.environ['PATH']}", "PYTHONPATH": str(REPO)}
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["teardown"]


# --- output format -------------------------------------------------------------------------------


def test_output_option_is_accepted_after_the_subcommand(tmp_path: Path) -> None:
    before = _run("-o", "json", "--plugin-dir", str(tmp_path), "plugins")
    after = _run("--plugin-dir", str(tmp_path), "plugins", "-o", "json")
    assert before.returncode == after.returncode == 0, after.stderr
    assert json.loads(after.stdout) == json.loads(before.stdout)
    # The later one wins, as with any repeated option.
    text = _run("-o", "json", "--plugin-dir", str(tmp_path), "plugins", "--output=text")
    assert text.stdout.splitlines()[1].split()[:2] == ["kubernetes.io/no-op", "ok"]  # the table, after its header


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["-o", "json", "setup", "default"], id="missing-argument"),
        pytest.param(["setup", "default", "-o", "json"], id="missing-argument-option-after"),
        pytest.param(["-o", "json", "bogus"], id="unknown-command"),
        pytest.param(["--bogus", "-o", "json", "pods"], id="unknown-option-before-o"),
        pytest.param(["-o", "json", "gc", "--bogus"], id="unknown-subcommand-option"),
        pytest.param(["-o", "json", "demo", "--pods", "0"], id="bad-value"),
    ],
)
def test_usage_errors_are_json_under_o_json(args: list[str]) -> None:
    out = _run(*args)
    assert out.returncode == 2
    assert out.stdout == ""
    err = json.loads(out.stderr)
    assert err["error"] == "UsageError"
    assert err["exit_code"] == 2
    assert err["message"]


def test_usage_errors_are_json_with_netplugin_output_json() -> None:
    out = _run("setup", env={"NETPLUGIN_OUTPUT": "json"})
    assert out.returncode == 2
    assert json.loads(out.stderr)["message"] == "Missing argument 'NAMESPACE'."


def test_usage_errors_stay_text_without_json() -> None:
    out = _run("setup")
    assert out.returncode == 2
    assert "Error: Missing argument 'NAMESPACE'." in out.stderr
    assert "Usage: netplugin setup" in out.stderr


@pytest.mark.parametrize("args", [["--version", "-o", "json"], ["-o", "json", "--version"], ["--version", "-ojson"]])
def test_version_as_json(args: list[str]) -> None:
    out = _run(*args)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["version"] == netplugin.__version__
    assert doc["python"] == ".".join(map(str, sys.version_info[:3]))


def test_version_as_text() -> None:
    out = _run("--version")
    assert (out.returncode, out.stdout) == (0, f"netplugin {netplugin.__version__}\n")


# --- a missing exec dir, a missing extra ---------------------------------------------------------


def test_plugins_lists_builtins_and_warns_when_the_exec_dir_is_missing(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir"
    for fmt in ("text", "json"):
        out = _run("--plugin-dir", str(missing), "plugins", "-o", fmt)
        assert out.returncode == 0, out.stderr
        assert f"exec plugin dir {missing} does not exist" in out.stderr
        names = (
            [c["name"] for c in json.loads(out.stdout)]
            if fmt == "json"
            else [line.split()[0] for line in out.stdout.splitlines()[1:]]  # under the header
        )
        assert names == ["kubernetes.io/no-op", "netplugin.io/bridge", "netplugin.io/hostport"]


def test_unreadable_exec_dir_is_still_an_error(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    out = _run("--plugin-dir", str(not_a_dir), "plugins")
    assert out.returncode == 5
    assert f"cannot read plugin dir {not_a_dir}" in out.stderr


def _without(modules: list[str], tmp_path: Path) -> dict[str, str]:
    """An environment whose Python cannot import ``modules`` (a meta path finder refuses them)."""
    blocker = tmp_path / "blocker"
    blocker.mkdir(exist_ok=True)
    (blocker / "sitecustomize.py").write_text(
        "import sys\n"
        f"BLOCKED = {modules!r}\n"
        "class _Block:\n"
        "    @staticmethod\n"
        "    def find_spec(name, path=None, target=None):\n"
        "        if name.split('.')[0] in BLOCKED:\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, _Block)\n"
    )
    return {"PYTHONPATH": f"{REPO}:{blocker}"}


def test_serve_without_the_daemon_extra_names_the_extra(tmp_path: Path) -> None:
    # The real thing (a venv without the extra) is tested in tests/deploy/test_package.py.
    env = _without(["prometheus_client"], tmp_path)
    for args in (["serve"], ["-o", "json", "serve"]):
        out = _run("--run-dir", str(tmp_path / "run"), *args, env=env)
        assert out.returncode == 5, out.stderr
        text = out.stderr if args == ["serve"] else json.loads(out.stderr)["message"]
        assert "netplugin[daemon]" in text and "prometheus_client" in text
    assert not (tmp_path / "run").exists()  # nothing was started


def test_native_plugin_without_the_daemon_extra_names_the_extra(tmp_path: Path, cli_env: dict[str, str]) -> None:
    env = {**cli_env, **_without(["pyroute2"], tmp_path)}
    out = _run("--plugin", "netplugin.io/bridge", "setup", "default", "web-0", "abc123", env=env)
    assert out.returncode == 5, out.stderr
    assert "pyroute2" in out.stderr and "'daemon' extra" in out.stderr
    assert "Traceback" not in out.stderr


def test_missing_extra_error_is_exit_5_not_70() -> None:
    from netplugin.core.extras import MissingExtra, extra_for, require
    from netplugin.frontends.wire.codes import exit_code_for

    assert extra_for("prometheus_client.exposition") == "daemon"
    assert extra_for("json") is None
    with pytest.raises(MissingExtra) as e:
        require("a feature", "netplugin_surely_absent_module")
    assert exit_code_for(e.value) == 5


# --- integer options (issue 13): ASCII digits only ----------------------------------------------


@pytest.mark.parametrize(
    ("args", "option"), [(["demo", "--pods", "\u0663"], "--pods"), (["demo", "--nodes", "\u0663"], "--nodes")]
)
def test_integer_options_take_ascii_digits_only(args: list[str], option: str) -> None:
    out = _run("-o", "json", *args)
    assert out.returncode == 2, out.stderr
    doc = json.loads(out.stdout or out.stderr)
    assert option in doc["message"] and "ASCII digits" in doc["message"]
