"""MTU=auto (the default): the bridge and the pods get the underlay's MTU, found by init and recorded.

The kernel test runs both bridge plugins in a node netns of the test's whose underlay link has
MTU 1400 (a loopback of 65536, and the bridge's own ports, must not count); the rule itself is
checked on a table of links.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from netplugin.plugins.bridge.mtu import DEFAULT_MTU, NodeLink, underlay_mtu
from tests.support.nettest import ip_in
from tests.support.nodebridge import KINDS, NodeBridge

UP, LOOPBACK = 0x1, 0x8


@pytest.mark.parametrize(
    ("links", "want"),
    [
        pytest.param([], DEFAULT_MTU, id="no-links"),
        pytest.param([NodeLink("lo", 1, UP | LOOPBACK, 65536)], DEFAULT_MTU, id="loopback-only"),
        pytest.param([NodeLink("eth0", 2, UP, 1460), NodeLink("eth1", 3, UP, 9000)], 1460, id="smallest-up"),
        pytest.param([NodeLink("eth0", 2, 0, 1280), NodeLink("eth1", 3, UP, 1500)], 1500, id="down-ignored"),
        pytest.param(
            [NodeLink("cbr0", 4, UP, 1000), NodeLink("vethx", 5, UP, 1000, master=4), NodeLink("eth0", 2, UP, 1450)],
            1450,
            id="the-bridge-and-its-ports-ignored",
        ),
        pytest.param([NodeLink("np0123456789ab", 6, UP, 1200), NodeLink("eth0", 2, UP, 1450)], 1450,
                     id="pod-veths-ignored"),
    ],
)
def test_the_underlay_mtu_is_the_smallest_of_the_nodes_own_up_links(links: list[NodeLink], want: int) -> None:
    assert underlay_mtu(links, "cbr0") == want


def _mtu(ns: str, dev: str) -> int:
    words = ip_in(ns, "-o", "link", "show", "dev", dev).split()
    return int(words[words.index("mtu") + 1])


@pytest.mark.kernel
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("configured", "want"), [(None, 1400), ("1300", 1300)], ids=["auto", "configured"])
def test_pods_get_the_underlays_mtu_unless_one_is_configured(
    node_factory: Callable[[str], NodeBridge], kind: str, configured: str | None, want: int
) -> None:
    node = node_factory(kind)
    node.outside(mtu=1400)
    env = {"NETPLUGIN_BRIDGE_MTU": configured} if configured else {}
    node.init(**env)
    node.add_pod("a", **env)
    assert _mtu(node.pod_ns("a"), "eth0") == want
    assert _mtu(node.node, node.env["NETPLUGIN_BRIDGE_NAME"]) == want
    record = Path(node.env["NETPLUGIN_STATE_DIR"]) / "bridge" / node.env["NETPLUGIN_BRIDGE_NAME"] / "mtu"
    assert (record.read_text() if record.exists() else None) == (None if configured else "1400\n")
    # the pod's own veth on the bridge does not count at the next init: still the underlay's
    node.init(**env)
    assert _mtu(node.node, node.env["NETPLUGIN_BRIDGE_NAME"]) == want
