"""Hostile node, round 3: a malformed action mask from ``init`` is a plugin-output error, never a crash.

A member's ``init`` may print ``{"actions": [...]}``; a list holding anything but action names
(a nested list, an object, a number, null) used to raise TypeError inside netplugin (exit 70,
"internal error"). It must be the plugin's fault: exit 1 naming the plugin and the field.
"""

from __future__ import annotations

from typing import Any

import pytest

MASKS = [
    pytest.param('{"actions": [["setup"]]}', id="nested-list"),
    pytest.param('{"actions": ["setup", ["teardown"]]}', id="name-then-list"),
    pytest.param('{"actions": [{"setup": 1}]}', id="object"),
    pytest.param('{"actions": [1, 2]}', id="numbers"),
    pytest.param('{"actions": [null]}', id="null"),
    pytest.param('{"actions": [true]}', id="bool"),
]


@pytest.mark.parametrize("mask", MASKS)
def test_a_malformed_action_mask_is_a_plugin_output_error(plugin_dir: Any, run_cli: Any, mask: str) -> None:
    p = plugin_dir.install("masked")
    p.set("init", stdout=mask)
    r = run_cli("--plugin", "masked", "init")
    assert r.returncode == 1, (r.returncode, r.stderr)  # the plugin failed, not netplugin (70)
    assert "internal error" not in r.stderr and "TypeError" not in r.stderr, r.stderr
    assert "masked" in r.stderr and "'actions' must be a list of action names" in r.stderr, r.stderr
