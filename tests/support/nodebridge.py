"""A node netns of the test's own with one of the two bridge plugins, run as netplugin runs them.

The plugin runs inside the node through ``ip netns exec`` (the node's own /sys and sysctls): the
bash plugin as its executable, the native one through a small driver calling
:class:`~netplugin.plugins.bridge.bridge_plugin.NativeBridgePlugin`. Pods are netns of the test's too.
Everything (node, pods, the netns's iptables and nft state with them) is deleted by ``close()``.
Addresses: the pod subnet 10.205.X.0/24 with X free on this host; ``outside`` links the node to
an underlay host netns on 10.205.(X+1).0/24 (all inside namespaces created here).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from tests.support.nettest import free_third_octet, ip_in

__all__ = ["BASH_BRIDGE", "KINDS", "NodeBridge"]

REPO = Path(__file__).resolve().parents[2]
BASH_BRIDGE = REPO / "exec_plugins" / "bridge" / "bridge"
KINDS = ("bash", "native")

_NATIVE = r"""
import os, sys
from netplugin.core.names import PodRef
from netplugin.core.plugin import CallContext
from netplugin.plugins.bridge.bridge_plugin import NativeBridgePlugin
env = dict(os.environ)
ctx = CallContext(netns=env.get("NETPLUGIN_NETNS", ""), env=env, state_dir=env["NETPLUGIN_STATE_DIR"], timeout=30)
plugin = NativeBridgePlugin()
if sys.argv[1] == "init":
    plugin.init(ctx)
else:
    getattr(plugin, sys.argv[1])(PodRef(*sys.argv[2:5]), ctx)
"""


def _run(argv: Sequence[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


class NodeBridge:
    """One node netns, a bridge plugin of ``kind`` in it, its pods; ``close()`` removes everything."""

    def __init__(self, kind: str, tmp: Path) -> None:
        self.kind = kind
        self.tag = secrets.token_hex(3)
        self.node = f"np{self.tag}n"
        self.made: list[str] = []
        self.third = free_third_octet("10.205.0.0/16")
        self.subnet = f"10.205.{self.third}.0/24"
        self.gateway = f"10.205.{self.third}.1"
        self.pods: dict[str, str] = {}
        self.netns(self.node)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_")}
        self.env.update(
            NETPLUGIN_STATE_DIR=str(tmp / f"state-{self.tag}"),
            NETPLUGIN_BRIDGE_NAME=f"npbr{self.tag}",
            NETPLUGIN_BRIDGE_SUBNET=self.subnet,
            PYTHONPATH=str(REPO),
        )

    def netns(self, name: str) -> str:
        r = _run(["ip", "netns", "add", name])
        assert r.returncode == 0, r.stderr
        self.made.append(name)
        ip_in(name, "link", "set", "lo", "up")
        return name

    def in_node(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return _run(["ip", "netns", "exec", self.node, *argv])

    def sysctl(self, path: str, value: str | None = None) -> str:
        """Read (or first write) a sysctl file inside the node."""
        if value is not None:
            assert self.in_node("sh", "-c", f"echo {value} > {path}").returncode == 0
        return self.in_node("cat", path).stdout.strip()

    def call(self, action: str, pod: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
        full = {**self.env, "NETPLUGIN_ACTION": action, **env}
        args: list[str] = []
        if pod is not None:
            args = ["default", pod, f"{self.tag}{pod}"]
            full.update(NETPLUGIN_POD_NAMESPACE="default", NETPLUGIN_POD_NAME=pod, NETPLUGIN_INFRA_ID=args[2],
                        NETPLUGIN_NETNS=f"/run/netns/np{self.tag}{pod}")  # fmt: skip
        exe = [str(BASH_BRIDGE)] if self.kind == "bash" else [sys.executable, "-c", _NATIVE]
        return _run(["ip", "netns", "exec", self.node, *exe, action, *args], full)

    def init(self, **env: str) -> None:
        r = self.call("init", **env)
        assert r.returncode == 0, r.stderr

    def add_pod(self, name: str, **env: str) -> str:
        """A pod netns set up by the plugin; its IPv4 address."""
        ns = self.netns(f"np{self.tag}{name}")
        r = self.call("setup", name, **env)
        assert r.returncode == 0, r.stderr
        out = ip_in(ns, "-4", "-o", "addr", "show", "dev", "eth0").split()
        self.pods[name] = out[out.index("inet") + 1].split("/")[0]
        return self.pods[name]

    def pod_ns(self, name: str) -> str:
        return f"np{self.tag}{name}"

    def outside(self, mtu: int = 1500) -> tuple[str, str, str]:
        """An underlay host netns on the node's ``eth0`` (the node's default route): (netns, its IP, node IP)."""
        host = self.netns(f"np{self.tag}u")
        net = f"10.205.{(self.third + 1) % 256}"
        ip_in(self.node, "link", "add", "eth0", "mtu", str(mtu), "type", "veth", "peer", "name", "eth0", "mtu",
              str(mtu), "netns", host)  # fmt: skip
        for ns, addr in ((self.node, f"{net}.2"), (host, f"{net}.1")):
            ip_in(ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            ip_in(ns, "link", "set", "eth0", "up")
        ip_in(self.node, "route", "add", "default", "via", f"{net}.1")
        return host, f"{net}.1", f"{net}.2"

    def close(self) -> None:
        for ns in reversed(self.made):
            _run(["ip", "netns", "del", ns])
