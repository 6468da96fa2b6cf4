"""The contract's optional extension: a setup that prints the PodNetworkStatus document needs no status call."""

from __future__ import annotations

from typing import Any

import pytest

from netplugin.core.names import PodRef
from netplugin.core.plugin import PodNetworkStatus
from netplugin.manager.manager import CallOptions

POD = PodRef("default", "web-0", "abc123")
STATUS = '{"ip":"10.203.1.9"}'


@pytest.mark.parametrize(
    ("setup_out", "from_setup"),
    [
        ('{"apiVersion":"v1beta1","kind":"PodNetworkStatus","ip":"10.203.1.2","ips":["10.203.1.2"]}', True),
        ('  {"kind":"PodNetworkStatus","ip":"10.203.1.2"}\n', True),
        ('{"ip":"10.203.1.2"}', False),  # no kind: not the extension, as before
        ('{"kind":"PodNetworkStatus","ip":"10.203.1.300"}', False),  # invalid: status says what is wrong
        ("configured eth0 with 10.203.1.2", False),  # a plugin's chatter on stdout, as before
        ("", False),
    ],
    ids=["document", "whitespace", "no-kind", "invalid", "chatter", "empty"],
)
def test_setup_status_comes_from_setup_when_it_prints_the_document(
    plugin_dir: Any, make_manager: Any, setup_out: str, from_setup: bool
) -> None:
    p = plugin_dir.install("p")
    p.set("setup", stdout=setup_out)
    p.set("status", stdout=STATUS)
    m = make_manager(plugin="p")
    status = m.setup(POD, CallOptions(want_status=True))
    calls = [c.split()[0] for c in p.calls()]
    if from_setup:
        assert status == PodNetworkStatus("10.203.1.2", ("10.203.1.2",)) or status == PodNetworkStatus("10.203.1.2")
        assert calls == ["init", "setup"]  # no second exec
    else:
        assert status == PodNetworkStatus("10.203.1.9")
        assert calls == ["init", "setup", "status"]
    record = m.state.get(POD)
    assert record is not None and record.ip == status.ip


def test_without_want_status_a_setup_document_is_still_recorded(plugin_dir: Any, make_manager: Any) -> None:
    p = plugin_dir.install("p")
    p.set("setup", stdout='{"kind":"PodNetworkStatus","ip":"10.203.1.4"}')
    m = make_manager(plugin="p")
    assert m.setup(POD) == PodNetworkStatus("10.203.1.4")
    assert [c.split()[0] for c in p.calls()] == ["init", "setup"]
    assert m.state.get(POD).ip == "10.203.1.4"
