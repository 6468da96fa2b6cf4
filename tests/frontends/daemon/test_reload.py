"""SIGHUP re-reads the daemon's config file (issue 17): plugin settings are taken live, what needs a
restart is refused whole and said, and a broken file leaves the running settings alone.

The daemon runs with ``serve --config FILE`` (the unit's form); the test edits FILE, sends SIGHUP
(what ``systemctl reload`` sends) and reads the daemon's ``health``: its settings fingerprint
(``config``, what callers are compared with) and what the reload said (``settings``).
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from tests.support.waits import WITHIN, wait_for

BASE = "plugin: scripted\nenv:\n  NP_A: one\n"


@pytest.mark.parametrize(
    ("edited", "said", "env_after"),
    [
        pytest.param(BASE + "  NP_B: two\n", "settings changed (env): taken", {"NP_A": "one", "NP_B": "two"}, id="env"),
        pytest.param(
            BASE.replace("one", "1") + "rollback_on_failure: false\n",
            "settings changed (env, rollback_on_failure): taken",
            {"NP_A": "1"},
            id="two-keys",
        ),
        pytest.param(
            BASE + "host: none\n", "cannot change while the daemon runs", {"NP_A": "one"}, id="host-needs-restart"
        ),
        pytest.param(
            BASE + "  NP_B: two\ncluster_cidrs: [10.244.0.0/16]\n",
            "cluster_cidrs cannot change",
            {"NP_A": "one"},  # refused whole: not even the env is taken
            id="restart-key-with-others",
        ),
        pytest.param("plugin: [unclosed\n", "not reloaded: ", {"NP_A": "one"}, id="broken-file"),
        pytest.param(BASE, "settings unchanged", {"NP_A": "one"}, id="unchanged"),
    ],
)
def test_sighup_rereads_the_config_file(
    start_daemon: Any, plugin_dir: Any, tmp_path: Path, edited: str, said: str, env_after: dict[str, str]
) -> None:
    plugin_dir.install("scripted")
    config = tmp_path / "node.yaml"
    config.write_text(BASE)
    d = start_daemon("--config", str(config), env={"NETPLUGIN_CONFIG": "/nonexistent/ignored.yaml"})
    before = d.health()
    assert before["config_path"] == str(config) and before["config"]["env"] == {"NP_A": "one"}
    config.write_text(edited)
    d.signal(signal.SIGHUP)
    wait_for(lambda: d.health()["reloads"] == 1, "the reload to finish", WITHIN)
    after = d.health()
    assert said in after["settings"], after["settings"]
    assert after["config"]["env"] == env_after
    if "taken" not in said:
        assert after["config"] == before["config"]  # the running settings, whole
    assert after["plugin"] == "scripted" and after["pid"] == before["pid"]


@pytest.mark.parametrize(
    ("edited", "key"),
    [
        pytest.param("plugin: scrpted\n", "plugin: network plugin 'scrpted' not found", id="missing-plugin"),
        pytest.param("plugins: [scripted, gone]\n", "plugins: ", id="missing-chain-member"),
        pytest.param(BASE + "plugn: x\n", "plugn: unknown key", id="typo"),
    ],
)
def test_a_reload_that_cannot_be_served_is_refused_whole(
    start_daemon: Any, plugin_dir: Any, tmp_path: Path, cli: Any, edited: str, key: str
) -> None:
    plugin_dir.install("scripted")
    config = tmp_path / "node.yaml"
    config.write_text(BASE)
    d = start_daemon("--config", str(config))
    before = d.health()
    assert cli("health").returncode == 0
    config.write_text(edited)
    d.signal(signal.SIGHUP)
    wait_for(lambda: d.health()["reloads"] == 1, "the reload to finish", WITHIN)
    after = d.health()
    assert after["config"] == before["config"] and after["plugin"] == "scripted" and after["plugin_problem"] is None
    assert after["refused"].startswith("config on disk refused at ") and key in after["refused"], after["refused"]
    refused_lines = [line for line in d.output().splitlines() if "reload refused" in line]
    assert len(refused_lines) == 1 and key in refused_lines[0], d.output()
    probe = cli("health")
    assert probe.returncode == 7 and "config on disk refused at" in probe.stdout, probe
    # the running settings still serve a pod
    assert "ip" in d.call("setup", namespace="default", pod="web", infra_id="c1")
    # fixed: taken, and the refusal is over
    config.write_text(BASE + "  NP_B: two\n")
    d.signal(signal.SIGHUP)
    wait_for(lambda: d.health()["reloads"] == 2, "the second reload to finish", WITHIN)
    assert d.health()["refused"] is None and d.health()["config"]["env"] == {"NP_A": "one", "NP_B": "two"}
    assert cli("health").returncode == 0
