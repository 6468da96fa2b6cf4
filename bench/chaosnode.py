"""A node in a network namespace of its own, with the shipped daemon and pods up, to break and watch repaired.

Used by the chaos test (``tests/frontends/daemon/test_chaos.py``) and the time-to-repair figure
(:mod:`bench.repair`). The node namespace has an underlay (a veth pair inside it) and a static cluster of
itself and a peer, so the daemon keeps a ``proto 78`` route and the egress table; its chain is
``netplugin.io/bridge`` then ``netplugin.io/hostport`` and the first pod has a hostPort, so the
hostPort table exists. The daemon is ``python -m netplugin serve`` as the unit runs it. Nothing
here touches the machine's own namespace: every command runs in the node's or a pod's namespace.

A dual-stack node (``dual_stack=True``) adds IPv6: the bridge's second subnet (:data:`POD_CIDR6`, in
the egress tests' fd00:10:206::/48), an underlay address (:data:`UNDERLAY6`), and each pod's IPv6
address (:attr:`ChaosNode.ip6`).

Each breakage (:data:`BREAKAGES`) is what an admin or a firewall reload does; :meth:`ChaosNode.
time_to_repair` breaks it and waits (polling the namespace's kernel state, generously bounded)
until it is back.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from netplugin.frontends.wire.client import NotSent, exchange

__all__ = [
    "BREAKAGES",
    "BUILTIN_CHAIN",
    "EXEC_CHAIN",
    "GATEWAY4",
    "GATEWAY6",
    "UNDERLAY4",
    "UNDERLAY6",
    "ChaosNode",
    "veth_of",
]

REPO = Path(__file__).resolve().parents[1]
#: the node's underlay address (its own, not on the bridge) and the bridge's gateway
UNDERLAY4 = "10.206.0.71"
GATEWAY4 = "10.206.143.1"
_UNDERLAY = f"{UNDERLAY4}/24"
_POD_CIDR = "10.206.143.0/24"
_GATEWAY = f"{GATEWAY4}/24"
#: a dual-stack node's IPv6 pod subnet (the /64 named after the IPv4 /24's third octet, 143 = 0x8f)
_POD_CIDR6 = "fd00:10:206:8f::/64"
GATEWAY6 = "fd00:10:206:8f::1"
UNDERLAY6 = "fd00:10:206::71"
_PEER_CIDR = "10.206.144.0/24"
_HOST_PORT = 18080
_SHAPED = "kubernetes.io/ingress-bandwidth"
#: the chain the daemon runs by default: the built-in bridge and hostport members
BUILTIN_CHAIN = ("netplugin.io/bridge", "netplugin.io/hostport")
#: the shipped bash plugins: the bridge, then bandwidth shaping the first pod (its annotation)
EXEC_CHAIN = ("bridge", "bandwidth")


def veth_of(infra_id: str) -> str:
    """The bridge plugins' host veth name: "np" + the first 12 hex digits of FNV-1a-64(infra id)."""
    h = 0xCBF29CE484222325
    for b in infra_id.encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"np{h:016x}"[:14]


def _run(*argv: str, check: bool = True) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout


class ChaosNode:
    """The node (``with ChaosNode(pods=3) as node``): daemon up, pods set up, all removed at exit."""

    def __init__(
        self, pods: int = 3, chain: tuple[str, ...] = BUILTIN_CHAIN, tag: str | None = None, dual_stack: bool = False
    ) -> None:
        #: every netns and link name starts with it (a bench run's tag: its leftover check finds them)
        self.tag = tag or f"npc{secrets.token_hex(3)}"
        self.ns = f"{self.tag}-node"
        self.bridge = f"{self.tag}b"
        self.npods = pods
        self.chain = chain
        self.pods: list[tuple[str, str]] = []  #: (infra id = its netns name, its IPv4 address)
        self.dual_stack = dual_stack
        self.ip6: dict[str, str] = {}  #: infra id -> its IPv6 address (a dual-stack node's)
        self.dir = Path(tempfile.mkdtemp(prefix="netplugin-chaos-"))
        self.sock = str(self.dir / "run" / "netplugin.sock")
        self.log = self.dir / "daemon.log"
        self.proc: subprocess.Popen[bytes] | None = None

    # --- life cycle ---------------------------------------------------------------------------------

    def __enter__(self) -> ChaosNode:
        try:
            self._node()
            self._start()
            for i in range(self.npods):
                self._pod(i)
            if self.dual_stack:  # the kernel adds the bridge's link-local address once a port gives it carrier
                self.wait(self.bridge_ok, 10, "the bridge with its link-local address")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for infra, _addr in self.pods:
            _run("ip", "netns", "del", infra, check=False)
        _run("ip", "netns", "del", self.ns, check=False)
        shutil.rmtree(self.dir, ignore_errors=True)

    def _node(self) -> None:
        _run("ip", "netns", "add", self.ns)
        self.ip("link", "set", "lo", "up")
        self.ip("link", "add", "ul0", "type", "veth", "peer", "name", "ul1")  # no dummy module everywhere
        self.ip("link", "set", "ul1", "up")
        self.ip("addr", "add", _UNDERLAY, "dev", "ul0")
        if self.dual_stack:
            self.ip("addr", "add", f"{UNDERLAY6}/64", "dev", "ul0", "nodad")
        self.ip("link", "set", "ul0", "up")
        nodes, pods = self.dir / "nodes", self.dir / "pods"
        nodes.mkdir()
        pods.mkdir()
        for name, cidr, addr in (("me", _POD_CIDR, "10.206.0.71"), ("peer", _PEER_CIDR, "10.206.0.72")):
            doc = {"kind": "Node", "metadata": {"name": name}, "spec": {"podCIDRs": [cidr]},
                   "status": {"addresses": [{"type": "InternalIP", "address": addr}]}}  # fmt: skip
            (nodes / f"{name}.json").write_text(json.dumps(doc))
        # a hostPort only where a member maps it: a pod asking for one the chain cannot map fails its ADD
        mapped = any(m.endswith("hostport") for m in self.chain)
        ports = [{"containerPort": 8080, "hostPort": _HOST_PORT, "protocol": "TCP"}] if mapped else []
        for i in range(self.npods):
            spec = {"containers": [{"name": "c", "ports": ports if i == 0 else []}]}
            meta = {"namespace": "chaos", "name": f"p{i}", "annotations": {_SHAPED: "10M"} if i == 0 else {}}
            doc = {"kind": "Pod", "metadata": meta, "spec": spec}
            (pods / f"p{i}.json").write_text(json.dumps(doc))
        (self.dir / "netplugin.yaml").write_text(
            f"state_dir: {self.dir}/state\nrun_dir: {self.dir}/run\nplugin_dir: {REPO / 'exec_plugins'}\nhost: static\n"
            f"pods_dir: {pods}\nnodes_dir: {nodes}\nnode_name: me\nmetrics_address: none\n"
            f"cluster_cidrs: [10.206.128.0/17]\nplugins: [{', '.join(self.chain)}]\n"
            f"env:\n  NETPLUGIN_BRIDGE_NAME: {self.bridge}\n  NETPLUGIN_BRIDGE_SUBNET: '{self.subnet}'\n"
            f"  NETPLUGIN_BRIDGE_STATE_DIR: {self.dir}/bridge\n  NETPLUGIN_BRIDGE_MTU: '1500'\n"
        )

    @property
    def subnet(self) -> str:
        """The bridge's SUBNET setting."""
        return f"{_POD_CIDR},{_POD_CIDR6}" if self.dual_stack else _POD_CIDR

    @property
    def gateways(self) -> set[str]:
        """The bridge's gateway addresses (CIDR form)."""
        return {_GATEWAY, f"{GATEWAY6}/64"} if self.dual_stack else {_GATEWAY}

    def _start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_")}
        env["PYTHONPATH"] = str(REPO)
        argv = ["ip", "netns", "exec", self.ns, sys.executable, "-m", "netplugin", "serve"]
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [*argv, "--config", str(self.dir / "netplugin.yaml")],
                env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.wait(lambda: os.path.exists(self.sock), 60, "the daemon's socket")

    def _pod(self, i: int) -> None:
        infra = f"{self.tag}p{i}"
        _run("ip", "netns", "add", infra)
        self.pods.append((infra, ""))
        answer = self.request({"op": "setup", "namespace": "chaos", "pod": f"p{i}", "infra_id": infra})
        if not answer.get("ok", True) or "error" in answer:
            raise RuntimeError(f"setup of pod p{i}: {answer}")
        addrs = json.loads(_run("ip", "-n", infra, "-j", "addr", "show", "dev", "eth0", "scope", "global"))
        by_family = {a["family"]: a["local"] for a in addrs[0]["addr_info"] if "local" in a}  # filtered out: {}
        self.pods[i] = (infra, by_family["inet"])
        if self.dual_stack:
            self.ip6[infra] = by_family["inet6"]

    # --- talking to it ------------------------------------------------------------------------------

    def request(self, req: dict[str, Any]) -> dict[str, Any]:
        answer: dict[str, Any] = exchange(self.sock, {"v": 1, **req}, timeout=60)
        return answer

    def health(self) -> dict[str, Any]:
        try:
            result: dict[str, Any] = self.request({"op": "health"})["result"]
        except NotSent:
            return {}
        return result

    def ip(self, *args: str) -> str:
        return _run("ip", "-n", self.ns, *args)

    def nft_tables(self) -> str:
        return _run("ip", "netns", "exec", self.ns, "nft", "list", "tables")

    def ping(self, src: str, dst: str, count: int = 1, source: str | None = None) -> bool:
        """Whether ``dst`` answers from the netns ``src`` (from its address ``source``, else the kernel's pick)."""
        argv = ["ip", "netns", "exec", src, "ping", "-q", "-c", str(count), "-i", "0.05", "-W", "1"]
        argv += [*(["-I", source] if source else []), dst]
        return subprocess.run(argv, capture_output=True, timeout=60).returncode == 0

    @staticmethod
    def wait(pred: Callable[[], bool], within: float, what: str) -> float:
        """Seconds until ``pred()`` holds (polled every 2 ms); AssertionError after ``within``."""
        start = time.monotonic()
        while not pred():
            if time.monotonic() - start > within:
                raise AssertionError(f"not back after {within:.0f}s: {what}")
            time.sleep(0.002)
        return time.monotonic() - start

    # --- what the kernel holds ------------------------------------------------------------------------

    def _link(self, name: str) -> dict[str, Any] | None:
        done = subprocess.run(["ip", "-n", self.ns, "-j", "-d", "link", "show", "dev", name],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        return json.loads(done.stdout)[0] if done.returncode == 0 and done.stdout.strip() else None

    def port_ok(self, infra: str) -> bool:
        link = self._link(veth_of(infra))
        slave = (link or {}).get("linkinfo", {}).get("info_slave_data", {})
        return link is not None and link.get("master") == self.bridge and bool(slave.get("hairpin"))

    def bridge_ok(self) -> bool:
        """The bridge is up with its MTU and gateway addresses (and, with IPv6, a link-local address:
        the source of the neighbour solicitations for what the node forwards to pods), every port on it."""
        link = self._link(self.bridge)
        if link is None or "UP" not in link.get("flags", []) or link.get("mtu") != 1500:
            return False
        addrs = json.loads(self.ip("-j", "addr", "show", "dev", self.bridge))
        have = {f"{a['local']}/{a['prefixlen']}" for x in addrs for a in x.get("addr_info", [])}
        link_local = not self.dual_stack or any(a.startswith("fe80:") for a in have)
        return self.gateways <= have and link_local and all(self.port_ok(infra) for infra, _ in self.pods)

    def tables_ok(self) -> bool:
        tables = self.nft_tables()
        hostport = "netplugin.io/hostport" not in self.chain or "table inet netplugin_hostport" in tables
        return "table inet netplugin\n" in tables and hostport

    def qdisc_ok(self) -> bool:
        return "qdisc tbf " in _run(
            "ip", "netns", "exec", self.ns, "tc", "qdisc", "show", "dev", veth_of(self.pods[0][0])
        )

    def routes_ok(self) -> bool:
        return [r["dst"] for r in json.loads(self.ip("-j", "route", "show", "proto", "78") or "[]")] == [_PEER_CIDR]

    def time_to_repair(self, kind: str, within: float = 10.0) -> float:
        """Break ``kind`` (a key of :data:`BREAKAGES`), then seconds until the kernel state is back."""
        breaks, repaired = BREAKAGES[kind]
        assert repaired(self), f"{kind}: not intact before the breakage"
        breaks(self)
        return self.wait(lambda: repaired(self), within, kind)


def _tc_del(node: ChaosNode) -> None:
    _run("ip", "netns", "exec", node.ns, "tc", "qdisc", "del", "dev", veth_of(node.pods[0][0]), "root")


def _link_local_del(node: ChaosNode) -> None:
    addrs = json.loads(node.ip("-j", "-6", "addr", "show", "dev", node.bridge, "scope", "link"))[0]["addr_info"]
    [link_local] = [f"{a['local']}/{a['prefixlen']}" for a in addrs if "local" in a]  # filtered out: {}
    node.ip("addr", "del", link_local, "dev", node.bridge)


def _hairpin_off(node: ChaosNode) -> None:
    node.ip("link", "set", "dev", veth_of(node.pods[0][0]), "type", "bridge_slave", "hairpin", "off")


#: kind -> (how it is broken, whether it is back); the kinds of ``netplugin_repairs_total`` they hit
BREAKAGES: dict[str, tuple[Callable[[ChaosNode], object], Callable[[ChaosNode], bool]]] = {
    "hairpin": (_hairpin_off, lambda n: n.port_ok(n.pods[0][0])),
    "bridge": (lambda n: n.ip("link", "del", n.bridge), ChaosNode.bridge_ok),
    "bridge down": (lambda n: n.ip("link", "set", "dev", n.bridge, "down"), ChaosNode.bridge_ok),
    "ipv4 flush": (lambda n: n.ip("-4", "addr", "flush", "dev", n.bridge), ChaosNode.bridge_ok),
    # dual-stack only:
    "ipv6 flush": (lambda n: n.ip("-6", "addr", "flush", "dev", n.bridge), ChaosNode.bridge_ok),
    "link-local del": (_link_local_del, ChaosNode.bridge_ok),
    "nft flush": (lambda n: _run("ip", "netns", "exec", n.ns, "nft", "flush", "ruleset"), ChaosNode.tables_ok),
    "route flush": (lambda n: n.ip("route", "flush", "proto", "78"), ChaosNode.routes_ok),
    "qdisc": (_tc_del, ChaosNode.qdisc_ok),  # the exec chain only: bandwidth shapes the first pod
}
