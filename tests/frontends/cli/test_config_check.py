"""``netplugin config check [FILE]``: the daemon's reload check, asked from the command line.

Each case writes a config file, runs the real CLI, and checks the exit code, the key the message
names, and that nothing was made (no init marker, no state).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest


@pytest.mark.parametrize(
    ("text", "code", "said"),
    [
        pytest.param("plugin: scripted\n", 0, "ok: ", id="good"),
        pytest.param("plugins: [scripted, kubernetes.io/no-op]\n", 0, "ok: ", id="good-chain"),
        pytest.param("plugin: brdge\n", 3, "refused: plugin: network plugin 'brdge' not found", id="missing-plugin"),
        pytest.param("plugins: [scripted, gone]\n", 3, "refused: plugins: ", id="missing-chain-member"),
        pytest.param("plugin: unsafe\n", 3, "refused: plugin: ", id="untrusted-plugin"),
        pytest.param("plugin: scripted\nplugn: x\n", 2, "refused: plugn: unknown key", id="typo"),
        pytest.param("plugin: [unclosed\n", 2, "refused: config: ", id="not-yaml"),
        # the built-ins' own settings, read as their init (the reload) reads them: the variable named
        pytest.param(
            "plugin: netplugin.io/bridge\nenv: {NETPLUGIN_BRIDGE_SUBNET: 10.244.0.1/24}\n",
            2, "refused: env: netplugin.io/bridge: invalid NETPLUGIN_BRIDGE_SUBNET '10.244.0.1/24': host bits",
            id="bridge-subnet-host-bits",
        ),
        pytest.param(
            "plugins: [netplugin.io/bridge, netplugin.io/hostport]\n"
            "env: {NETPLUGIN_BRIDGE_SUBNET: 10.244.0.0/24, NETPLUGIN_HOSTPORT_LOCALHOST: maybe}\n",
            2, "refused: env: netplugin.io/hostport: invalid NETPLUGIN_HOSTPORT_LOCALHOST 'maybe'",
            id="hostport-localhost-maybe",
        ),
        pytest.param(
            "plugins: [netplugin.io/bridge, netplugin.io/hostport]\n"
            "env: {NETPLUGIN_BRIDGE_SUBNET: 10.244.0.0/24, NETPLUGIN_HOSTPORT_LOCALHOST: 'true'}\n",
            0, "ok: ", id="builtins-good",
        ),
    ],
)
def test_config_check(
    run_cli: Any, plugin_dir: Any, np_dirs: dict[str, str], tmp_path: Path, text: str, code: int, said: str
) -> None:
    plugin_dir.install("scripted")
    plugin_dir.install("unsafe", mode=0o777)
    config = tmp_path / "checked.yaml"
    config.write_text(text)
    out = run_cli("config", "check", str(config))
    assert out.returncode == code, out
    assert said in (out.stdout + out.stderr), out
    assert os.listdir(np_dirs["run_dir"]) == [] and os.listdir(np_dirs["state_dir"]) == []  # nothing ran
    doc = json.loads(run_cli("-o", "json", "config", "check", str(config)).stdout)
    assert doc["ok"] is (code == 0)
    if code:
        assert said.split("refused: ")[1].split(":")[0] == doc["key"]


def test_config_check_defaults_to_the_global_config(run_cli: Any, plugin_dir: Any, np_dirs: dict[str, str]) -> None:
    Path(np_dirs["config"]).write_text("plugin: brdge\n")
    out = run_cli("config", "check")
    assert out.returncode == 3 and np_dirs["config"] in out.stderr, out
