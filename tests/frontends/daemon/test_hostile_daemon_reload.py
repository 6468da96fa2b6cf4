"""Hostile node, round 3: a SIGHUP that changes the plugin must not orphan the pods set up before it.

The daemon runs with ``serve --config FILE``; a pod is set up under ``plugins: [a]``, the file then
says ``[b]`` and the daemon is reloaded. The reload is taken, health names ``a`` with the pod that
still needs it, ``pods`` marks the pod, and its teardown runs a's teardown (not b's).
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

from netplugin.core.names import PodRef
from netplugin.store.state import StateStore
from tests.support.waits import WITHIN, wait_for

POD = PodRef("default", "web-0", "infra0")


def _configure(config: Path, chain: list[str], netns_dir: Path, log: Path) -> None:
    doc = {"plugins": chain, "netns_template": str(netns_dir / "{infra_id}"), "env": {"NETPLUGIN_TEST_LOG": str(log)}}
    config.write_text(json.dumps(doc))


def _teardowns(log: Path) -> list[str]:
    lines = log.read_text().splitlines() if log.exists() else []
    return [" ".join(line.split()[:2]) for line in lines if line.split()[1:2] == ["teardown"]]


def test_a_sighup_that_drops_a_plugin_in_use_is_taken_and_named_in_health(
    start_daemon: Any, plugin_dir: Any, netns_dir: Path, np_dirs: dict[str, str], tmp_path: Path
) -> None:
    store = StateStore(np_dirs["state_dir"])
    plugin_dir.install("a")
    plugin_dir.install("b")
    (netns_dir / POD.infra_id).touch()
    config, log = tmp_path / "node.yaml", tmp_path / "calls.log"
    _configure(config, ["a"], netns_dir, log)
    d = start_daemon("--config", str(config))
    d.call("setup", namespace=POD.namespace, pod=POD.name, infra_id=POD.infra_id)
    assert d.health()["plugins_still_needed"] == {}
    _configure(config, ["b"], netns_dir, log)
    d.signal(signal.SIGHUP)
    wait_for(lambda: d.health()["reloads"] == 1, "the reload to finish", WITHIN)
    health = d.health()
    assert health["plugin"] == "b"  # the reload is taken
    assert health["plugins_still_needed"] == {"a": [str(POD)]}
    pods = d.call("pods")
    assert [p["chain_differs"] for p in pods["listing"]["pods"]] == [True]
    assert "(configured now: b)" in pods["table"]
    log.unlink()
    d.call("teardown", namespace=POD.namespace, pod=POD.name, infra_id=POD.infra_id)
    assert _teardowns(log) == ["a teardown"]  # the pod's own plugin, not the configured one
    assert store.get(POD) is None
    assert d.health()["plugins_still_needed"] == {}
    assert "no longer configured but 1 pod(s) still need it" in d.output()
