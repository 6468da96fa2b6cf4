"""Hostile node, round 3: ``bandwidth`` shapes only the pod's veth, takes 1P, reads escaped annotations.

Everything runs inside a "node" network namespace the test makes (``ip netns exec``): its ``lo``,
a veth with both ends in it, one into a stranger's namespace and one into the pod's. Attacks:

* an earlier member reports ``hostInterface`` ``lo`` (the node's own), a veth whose peer is on the
  node, one into another namespace, or a missing name: netplugin refuses the setup document before
  a later member runs (``invalid 'hostInterface'``, rolled back), and ``bandwidth`` run directly
  refuses anything but a veth into another namespace: no qdisc is ever put on such an interface;
* the documented maximum rate, 1P, and a runtime burst of 18 digits: capped to what tc holds;
* an annotation value with JSON escapes is decoded (``"\\u0031\\u0030M"`` is 10M; ``"10M\\n"`` is
  refused as no quantity instead of read as no annotation and silently left unshaped);
* teardown removes every qdisc setup made on the veth, also while the veth stays.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.bridgenet import EXEC_PLUGINS

pytestmark = pytest.mark.kernel
BANDWIDTH = EXEC_PLUGINS / "bandwidth" / "bandwidth"
IN, OUT = "kubernetes.io/ingress-bandwidth", "kubernetes.io/egress-bandwidth"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@dataclass(frozen=True)
class Node:
    ns: str  #: the node's netns name (everything runs in it)
    pod_ns: str  #: the pod's netns name
    pod_veth: str  #: node end of the veth into the pod
    local_veth: str  #: a veth with both ends on the node
    stranger_veth: str  #: node end of a veth into a third namespace

    def run(self, argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ip", "netns", "exec", self.ns, *argv], capture_output=True, text=True, timeout=60,
                              **kw)  # fmt: skip

    def qdiscs(self, dev: str) -> str:
        return self.run(["tc", "qdisc", "show", "dev", dev]).stdout

    def bandwidth(self, action: str, host: str, stdin: str, **env: str) -> subprocess.CompletedProcess[str]:
        full = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "NETPLUGIN_INFRA_ID": self.ns,
                "NETPLUGIN_PREV_HOST_INTERFACE": host, **env}  # fmt: skip
        return self.run([str(BANDWIDTH), action, "default", "web-0", self.ns], input=stdin, env=full)


@pytest.fixture
def node() -> Iterator[Node]:
    tag = secrets.token_hex(3)
    ns, pod, other = f"npb{tag}n", f"npb{tag}p", f"npb{tag}o"
    for n in (ns, pod, other):
        _ip("netns", "add", n)
    try:
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", ns, "link", "add", "hpod", "type", "veth", "peer", "name", "eth0", "netns", pod)
        _ip("-n", ns, "link", "add", "hloc", "type", "veth", "peer", "name", "hloc2")
        _ip("-n", ns, "link", "add", "hout", "type", "veth", "peer", "name", "eth0", "netns", other)
        for dev in ("hpod", "hloc", "hout"):
            _ip("-n", ns, "link", "set", dev, "up")
        yield Node(ns, pod, "hpod", "hloc", "hout")
    finally:
        for n in (ns, pod, other):
            subprocess.run(["ip", "netns", "del", n], capture_output=True, timeout=30)


def _pod(annotations: dict[str, str]) -> str:
    return json.dumps({"metadata": {"annotations": annotations}})


# --- bandwidth run directly: only a veth into another namespace is shaped --------------------------------


@pytest.mark.parametrize("which", ["lo", "local", "missing"])
def test_bandwidth_refuses_to_shape_anything_but_the_pods_veth(node: Node, which: str) -> None:
    host = {"lo": "lo", "local": node.local_veth, "missing": "npnosuch0"}[which]
    r = node.bandwidth("setup", host, _pod({IN: "10M", OUT: "10M"}))
    assert r.returncode == 1, r
    assert "not a veth into the pod's network namespace" in r.stderr or "does not exist" in r.stderr, r.stderr
    if which != "missing":
        shown = node.qdiscs(host)
        assert "tbf" not in shown and "ingress" not in shown, shown


@pytest.mark.parametrize(
    ("annotations", "env"),
    [
        pytest.param({IN: "1P"}, {}, id="ingress-1P"),
        pytest.param({IN: "1P", OUT: "1P"}, {}, id="both-1P"),
        pytest.param({IN: "1000T"}, {}, id="ingress-1000T"),
        pytest.param({}, {"NETPLUGIN_BANDWIDTH_INGRESS_RATE": "1000000000000000",
                          "NETPLUGIN_BANDWIDTH_INGRESS_BURST": "999999999999999999"}, id="runtime-1P-huge-burst"),
        pytest.param({IN: "1k"}, {"NETPLUGIN_BANDWIDTH_INGRESS_RATE": "1000",
                                  "NETPLUGIN_BANDWIDTH_INGRESS_BURST": "999999999999"}, id="runtime-1k-huge-burst"),
    ],
)
def test_rates_up_to_the_documented_maximum_are_shaped_and_torn_down(
    node: Node, annotations: dict[str, str], env: dict[str, str]
) -> None:
    r = node.bandwidth("setup", node.pod_veth, _pod(annotations), **env)
    assert r.returncode == 0, r.stderr
    assert "tbf" in node.qdiscs(node.pod_veth)
    r = node.bandwidth("teardown", node.pod_veth, "", **env)
    assert r.returncode == 0, r.stderr
    left = node.qdiscs(node.pod_veth)  # the veth stays: every qdisc setup made is gone anyway
    assert "tbf" not in left and "ingress" not in left, left


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        pytest.param("\\u0031\\u0030M", True, id="unicode-escapes"),
        pytest.param("10\\u004d", True, id="escaped-suffix"),
        pytest.param("10M\\n", False, id="newline"),
        pytest.param('10M\\"', False, id="quote"),
        pytest.param("\\\\10M", False, id="backslash"),
    ],
)
def test_an_escaped_annotation_value_is_decoded_never_ignored(node: Node, value: str, parsed: bool) -> None:
    raw = '{"metadata":{"annotations":{"' + IN + '":"' + value + '"}}}'
    r = node.bandwidth("setup", node.pod_veth, raw)
    if parsed:
        assert r.returncode == 0, r.stderr
        assert "rate 10Mbit" in node.qdiscs(node.pod_veth)
    else:
        assert r.returncode == 1 and f"invalid {IN}" in r.stderr, r  # not silently left unshaped


# --- netplugin vouches for hostInterface before a later member sees it ---------------------------------------


@pytest.mark.parametrize("which", ["lo", "local", "stranger", "missing", "pod"])
def test_netplugin_passes_on_only_a_veth_into_the_pods_netns(
    node: Node, plugin_dir: Any, cli_env: dict[str, str], np_dirs: dict[str, str], which: str
) -> None:
    host = {"lo": "lo", "local": node.local_veth, "stranger": node.stranger_veth, "missing": "npnosuch0",
            "pod": node.pod_veth}[which]  # fmt: skip
    first, second = plugin_dir.install("m1"), plugin_dir.install("m2")
    first.set("setup", stdout=json.dumps({"kind": "PodNetworkStatus", "ip": "10.1.2.3", "hostInterface": host}))
    Path(np_dirs["config"]).write_text("plugins: [m1, m2]\nnetns_template: /run/netns/{infra_id}\n")
    r = node.run([sys.executable, "-m", "netplugin", "setup", "default", "web-0", node.pod_ns], env=cli_env)
    if which == "pod":
        assert r.returncode == 0, r.stderr
        assert second.env_of("setup")["NETPLUGIN_PREV_HOST_INTERFACE"] == host
        return
    assert r.returncode == 1, r
    assert f"invalid 'hostInterface' '{host}'" in r.stderr, r.stderr
    assert not (second.dir / "setup.env").exists()  # m2 never saw it
    assert [c.split()[0] for c in first.calls()][-2:] == ["setup", "teardown"]  # m1 rolled back
    assert os.path.exists(f"/run/netns/{node.pod_ns}")
