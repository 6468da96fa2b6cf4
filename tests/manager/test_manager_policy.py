"""Manager policy decisions that sit between init and the pod actions."""

from __future__ import annotations

from typing import Any

import pytest

from netplugin.core.errors import PluginFailed
from netplugin.core.names import PodRef

POD = PodRef("default", "web-0", "infra1")


def test_teardown_still_runs_when_init_fails(plugin_dir: Any, make_manager: Any) -> None:
    p = plugin_dir.install("broken-init")
    p.set("init", exit=1, stderr="init cannot reach its backend")
    m = make_manager(plugin="broken-init", state=False)
    m.teardown(POD)  # the plugin's teardown succeeds, so teardown succeeds
    assert p.calls() == ["init", "teardown default web-0 infra1"]


def test_failed_teardown_after_failed_init_names_both(plugin_dir: Any, make_manager: Any) -> None:
    p = plugin_dir.install("broken")
    p.set("init", exit=1, stderr="no backend")
    p.set("teardown", exit=2, stderr="still no backend")
    m = make_manager(plugin="broken", state=False)
    with pytest.raises(PluginFailed) as exc:
        m.teardown(POD)
    assert exc.value.action == "teardown"
    assert "no backend" in exc.value.details["init_error"]


def test_setup_does_not_run_when_init_fails(plugin_dir: Any, make_manager: Any) -> None:
    p = plugin_dir.install("broken-setup")
    p.set("init", exit=1)
    m = make_manager(plugin="broken-setup", state=False)
    with pytest.raises(PluginFailed) as exc:
        m.setup(POD)
    assert exc.value.action == "init"
    assert p.calls() == ["init"]


@pytest.mark.parametrize(
    ("first", "second", "reruns"),
    [
        ({"NETPLUGIN_BRIDGE_SUBNET": "10.200.1.0/24"}, {"NETPLUGIN_BRIDGE_SUBNET": "10.200.1.0/24"}, False),
        ({"NETPLUGIN_BRIDGE_SUBNET": "10.200.1.0/24"}, {"NETPLUGIN_BRIDGE_SUBNET": "10.200.2.0/24"}, True),
        ({}, {"NETPLUGIN_BRIDGE_NAME": "npbr1"}, True),
    ],
    ids=["same-settings", "new-subnet", "new-key"],
)
def test_init_reruns_when_plugin_settings_change(
    plugin_dir: Any, make_manager: Any, first: dict[str, str], second: dict[str, str], reruns: bool
) -> None:
    p = plugin_dir.install("settings")
    assert make_manager(plugin="settings", state=False, env=first).init() is True
    assert make_manager(plugin="settings", state=False, env=second).init() is reruns
    assert p.calls().count("init") == (2 if reruns else 1)
