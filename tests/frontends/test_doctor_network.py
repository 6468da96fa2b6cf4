"""``netplugin doctor`` on a node's network for pods: bridge netfilter, the FORWARD policy, the MTU.

Each case is a node netns of the test's with the native bridge plugin initialised and one pod,
broken in one way; the real CLI runs inside the node (``ip netns exec``: its own /sys, sysctls and
iptables) and names the breakage in the right check, the others staying fine.
"""

from __future__ import annotations

import ipaddress
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from netplugin.nodenet.forward import Forward
from netplugin.plugins.bridge.sysctls import BRIDGE_NF_CALL
from tests.support.nodebridge import NodeBridge

pytestmark = pytest.mark.kernel
CHECKS = ("bridge_netfilter", "forward", "mtu")


@pytest.fixture
def node(node_factory: Callable[[str], NodeBridge]) -> NodeBridge:
    if not shutil.which("iptables"):
        pytest.skip("iptables is not installed")
    return node_factory("native")


def doctor(node: NodeBridge, tmp: Path, **env: str) -> dict[str, dict[str, Any]]:
    config = tmp / "netplugin.yaml"
    settings = {k: v for k, v in node.env.items() if k.startswith("NETPLUGIN_BRIDGE_")} | env
    config.write_text(
        f"plugin: netplugin.io/bridge\nstate_dir: {node.env['NETPLUGIN_STATE_DIR']}\nrun_dir: {tmp / 'run'}\n"
        "host: none\nenv:\n" + "".join(f"  {k}: {json.dumps(v)}\n" for k, v in settings.items())
    )
    argv = [sys.executable, "-m", "netplugin", "--config", str(config), "-o", "json", "doctor",
            "--cni-conf-dir", str(tmp), "--cni-bin-dir", str(tmp)]  # fmt: skip
    done = subprocess.run(["ip", "netns", "exec", node.node, *argv], capture_output=True, text=True, timeout=120,
                          env={**node.env, "NETPLUGIN_CONFIG": str(config)})  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr
    return {c["name"]: c for c in json.loads(done.stdout)["checks"]}


def _br_netfilter_off(node: NodeBridge) -> dict[str, str]:
    node.sysctl(BRIDGE_NF_CALL[4], "0")
    return {"NETPLUGIN_BRIDGE_BR_NETFILTER": "false"}


def _forward_drop(node: NodeBridge) -> dict[str, str]:
    assert node.in_node("iptables", "-P", "FORWARD", "DROP").returncode == 0
    return {}


def _mtu_above_the_underlay(node: NodeBridge) -> dict[str, str]:
    return {"NETPLUGIN_BRIDGE_MTU": "1500"}


CASES: list[tuple[str, Callable[[NodeBridge], dict[str, str]], str | None, str]] = [
    ("healthy", lambda n: {}, None, ""),
    ("br-netfilter-off", _br_netfilter_off, "bridge_netfilter", "bridge-nf-call-iptables off while bridge"),
    ("forward-drop", _forward_drop, "forward", "FORWARD policy is DROP and does not jump to NETPLUGIN-FORWARD"),
    ("mtu-above-underlay", _mtu_above_the_underlay, "mtu", "MTU 1500 (configured) is above the underlay's 1400"),
]


@pytest.mark.parametrize(("case", "breakage", "check", "words"), CASES, ids=[c[0] for c in CASES])
def test_doctor_names_what_breaks_pod_networking(
    node: NodeBridge, tmp_path: Path, case: str, breakage: Callable[[NodeBridge], dict[str, str]],
    check: str | None, words: str,
) -> None:  # fmt: skip
    node.outside(mtu=1400)
    env = breakage(node)
    node.init(**env)
    node.add_pod("a", **env)
    checks = doctor(node, tmp_path, **env)
    for name in CHECKS:
        if name == check:
            assert not checks[name]["ok"] and words in checks[name]["problem"], checks[name]
            assert checks[name]["fix"]
        else:
            assert checks[name]["ok"], checks[name]
    if check == "forward":  # netplugin's chain is the fix
        Forward(netns=f"/run/netns/{node.node}").apply([ipaddress.ip_network(node.subnet)])
        assert doctor(node, tmp_path)["forward"]["ok"]


#: what kube-network-policies keeps while it runs (its controller's default table); the real agent's
#: own table is what tests/cluster/test_networkpolicy.py's doctor sees
AGENT_TABLE = (
    "add table inet kube-network-policies",
    "add chain inet kube-network-policies postrouting { type filter hook postrouting priority srcnat - 5; }",
)


@pytest.mark.parametrize(
    ("agent", "br_netfilter", "subnet_node", "words"),
    [
        (False, True, False, "no NetworkPolicy agent seen (looked for kube-network-policies, "),
        (True, True, False, "kube-network-policies (nftables table inet kube-network-policies)"),
        (True, False, False, "kube-network-policies (nftables table inet kube-network-policies)"),
        # the shipped config's SUBNET=node: no subnet in the settings, the families come from the node
        (True, False, True, "kube-network-policies (nftables table inet kube-network-policies)"),
    ],
    ids=["no-agent", "agent", "agent-without-br-netfilter", "agent-without-br-netfilter-subnet-node"],
)
def test_doctor_names_the_policy_agent_and_warns_when_bridged_traffic_bypasses_it(
    node: NodeBridge, tmp_path: Path, agent: bool, br_netfilter: bool, subnet_node: bool, words: str
) -> None:
    env = {} if br_netfilter else _br_netfilter_off(node)
    node.init(**env)
    node.add_pod("a", **env)
    if agent:
        for command in AGENT_TABLE:
            done = node.in_node("nft", command)
            assert done.returncode == 0, done.stderr
    checks = doctor(node, tmp_path, **env, **({"NETPLUGIN_BRIDGE_SUBNET": "node"} if subnet_node else {}))
    check = checks["policy"]
    assert words in check["found"], check
    if agent and not br_netfilter:
        assert not check["ok"], check
        assert "bridge-nf-call-iptables off while kube-network-policies enforces NetworkPolicy" in check["problem"]
        assert "NETPLUGIN_BRIDGE_BR_NETFILTER=true" in check["fix"]
        assert not checks["bridge_netfilter"]["ok"], checks["bridge_netfilter"]
    else:
        assert check["ok"], check
