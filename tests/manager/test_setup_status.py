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


@pytest.mark.parametrize(
    ("mac", "reported"),
    [
        ('"0a:58:0A:CB:01:02"', "0a:58:0a:cb:01:02"),  # lower-cased
        ('"0b:58:0a:cb:01:02"', None),  # multicast bit
        ('"ff:ff:ff:ff:ff:ff"', None),  # broadcast
        ('"00:00:00:00:00:00"', None),
        ('"0a:58:0a:cb:01"', None),  # five pairs
        ('"0a:58:0a:cb:01:0g"', None),
        ('"0a-58-0a-cb-01-02"', None),
        ("42", None),
    ],
    ids=["valid", "multicast", "broadcast", "zero", "short", "not-hex", "dashes", "not-a-string"],
)
def test_the_setup_documents_mac_is_reported_when_it_is_a_unicast_mac(
    plugin_dir: Any, make_manager: Any, mac: str, reported: str | None
) -> None:
    """A plugin's ``mac`` spares the CNI ADD a netns entry; anything but a unicast MAC is ignored."""
    p = plugin_dir.install("p")
    p.set("setup", stdout='{"kind":"PodNetworkStatus","ip":"10.203.1.5","mac":' + mac + '}')
    m = make_manager(plugin="p")
    status = m.setup(POD, CallOptions(want_status=True))
    assert status is not None and status.ip == "10.203.1.5" and status.mac == reported
    assert [c.split()[0] for c in p.calls()] == ["init", "setup"]  # an ignored mac costs no status exec
