"""Hostile node, round 3: what a member prints must not crash netplugin or hand out another pod's IP.

* A member's ``init`` may print ``{"actions": [...]}``; a list holding anything but action names
  (a nested list, an object) used to raise TypeError inside netplugin (exit 70, "internal
  error"). It is the plugin's fault: exit 1 naming the plugin and the field.
* A member's setup document may report addresses; one that another live pod holds (its record
  exists) used to be taken without a word. That setup now fails and is rolled back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from netplugin.core.errors import PluginOutputError
from netplugin.core.names import PodRef
from netplugin.store.state import StateStore
from tests.support.nettest import live_netns_file

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


# --- an address another live pod holds is refused ---------------------------------------------------------

A = PodRef("default", "a-0", "infraa")
B = PodRef("default", "b-0", "infrab")


def _doc(*ips: str) -> str:
    return json.dumps({"kind": "PodNetworkStatus", "ip": ips[0], "ips": list(ips)})


@pytest.fixture
def two_pods(plugin_dir: Any, make_manager: Any, netns_dir: Path) -> tuple[Any, Any]:
    for ref in (A, B):
        live_netns_file(netns_dir / ref.infra_id)
    member = plugin_dir.install("m1")
    plugin_dir.install("m2")
    m = make_manager(plugins=["m1", "m2"], netns_template=str(netns_dir / "{infra_id}"))
    return m, member


@pytest.mark.parametrize(
    ("a_ips", "b_ips", "clash"),
    [
        pytest.param(("10.1.2.3",), ("10.1.2.3",), "10.1.2.3", id="same-ipv4"),
        pytest.param(("10.1.2.3", "fd00::3"), ("10.1.2.4", "fd00::3"), "fd00::3", id="same-ipv6-second"),
        pytest.param(("fd00::3",), ("fd00:0::3",), "fd00::3", id="same-ipv6-spelled-otherwise"),
        pytest.param(("10.1.2.3",), ("10.1.2.30",), None, id="another-ip"),
    ],
)
def test_a_member_claiming_another_live_pods_ip_fails_that_setup(
    two_pods: tuple[Any, Any], store: StateStore, a_ips: tuple[str, ...], b_ips: tuple[str, ...], clash: str | None
) -> None:
    m, member = two_pods
    member.set("setup", stdout=_doc(*a_ips))
    m.setup(A)
    member.set("setup", stdout=_doc(*b_ips))
    if clash is None:
        m.setup(B)
        return
    with pytest.raises(PluginOutputError) as info:
        m.setup(B)
    assert clash in info.value.message and "another live pod" in info.value.message
    assert info.value.plugin == "m1" and info.value.details.get("rolled_back") is True
    assert store.get(B) is None  # rolled back
    rec = store.get(A)
    assert rec is not None and rec.ip == a_ips[0]  # the holder is untouched
    m.teardown(A)  # once A is gone, its address is free
    m.setup(B)
    assert store.get(B) is not None


def test_a_claim_whose_pod_is_gone_is_taken_over_and_a_repeated_setup_keeps_its_own(
    two_pods: tuple[Any, Any], store: StateStore
) -> None:
    m, member = two_pods
    member.set("setup", stdout=_doc("10.9.9.9"))
    m.setup(A)
    m.setup(A)  # the same pod again: its own claim
    store.remove(A)  # its record gone without a teardown (as after gc set it aside)
    m.setup(B)
    assert store.get(B) is not None
