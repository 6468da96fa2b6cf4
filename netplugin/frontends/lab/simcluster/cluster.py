"""A cluster on one machine: nodes as network namespaces on a shared underlay, one daemon each.

Layout (every name carries the run's random tag, so runs never meet)::

    netns np<tag>u   "the underlay": bridge br0 10.206.0.1/24 fd6e:7031:1a00::1/64,
                     the test API server listening there, and an address "outside the
                     cluster" (10.206.1.1, fd6e:7031:1a00:1::1) on its lo
    netns np<tag>n1  node-1: eth0 10.206.0.11 fd6e:7031:1a00::11 (a veth to br0),
                     default routes via the underlay, forwarding on, its own
                     ``netplugin serve`` (host: kube, node_name: node-1)
    netns np<tag>n2  node-2 ...
    netns np<tag>p…  one per pod ("infra container"), wired by the node's plugin

Node i has the pod CIDRs 10.206.(128+i).0/24 and fd6e:7031:1a00:(8000+i)::/64, registered
as its Node object; the cluster CIDRs are 10.206.128.0/17 and fd6e:7031:1a00:8000::/49.
Nothing here touches the machine's own namespace: all links, addresses and routes live in
namespaces this module creates and deletes.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from netplugin.core.defaults import socket_path
from netplugin.core.errors import NetpluginError, SystemFailure
from netplugin.core.execplugin.invoke import run
from netplugin.frontends.lab.demo import find_plugin_source
from netplugin.frontends.lab.simcluster.apiserver import ApiServer, make_node, make_pod
from netplugin.frontends.lab.simcluster.nsexec import ip, ip_json, netns_exists, socket_in_netns
from netplugin.frontends.lab.simcluster.sessions import stop_session
from netplugin.frontends.wire.client import request

__all__ = ["CLUSTER_CIDRS", "OUTSIDE_V4", "OUTSIDE_V6", "SimCluster", "SimNode", "SimPod"]

UNDERLAY_V4 = ipaddress.ip_network("10.206.0.0/24")
UNDERLAY_V6 = ipaddress.ip_network("fd6e:7031:1a00::/64")
OUTSIDE_V4 = "10.206.1.1"
OUTSIDE_V6 = "fd6e:7031:1a00:1::1"
CLUSTER_CIDRS = ("10.206.128.0/17", "fd6e:7031:1a00:8000::/49")
MAX_NODES = 120
_PROXY_VARS = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")
_ROUTE_PROTO = "78"


def node_addresses(i: int) -> tuple[str, str]:
    """The underlay addresses (IPv4, IPv6) of node ``i`` (1-based)."""
    return str(UNDERLAY_V4.network_address + 10 + i), str(UNDERLAY_V6.network_address + 0x10 + i)


def node_pod_cidrs(i: int) -> tuple[str, str]:
    return f"10.206.{128 + i}.0/24", f"fd6e:7031:1a00:{0x8000 + i:x}::/64"


@dataclass
class SimNode:
    index: int
    name: str
    netns: str
    ipv4: str
    ipv6: str
    pod_cidrs: tuple[str, ...]
    root: Path
    daemon: subprocess.Popen[bytes] | None = None

    @property
    def config_path(self) -> Path:
        return self.root / "netplugin.yaml"

    @property
    def socket_path(self) -> Path:
        return Path(socket_path(None, str(self.root / "run")))

    @property
    def log_path(self) -> Path:
        return self.root / "daemon.log"

    @property
    def internal_ips(self) -> tuple[str, str]:
        return (self.ipv4, self.ipv6)


@dataclass
class SimPod:
    node: SimNode
    namespace: str
    name: str
    infra_id: str
    ips: list[str] = field(default_factory=list)

    def ip(self, version: int) -> str | None:
        return next((a for a in self.ips if ipaddress.ip_address(a).version == version), None)


class SimCluster:
    """The simulated cluster; use as a context manager (everything is removed on exit)."""

    def __init__(
        self,
        *,
        plugin: str = "bridge",
        plugin_source: Path | None = None,
        tag: str | None = None,
        extra_config: dict[str, Any] | None = None,
        node_subnets: bool = True,
        bookmark_interval: float = 1.0,
        progress: Callable[[str], None] = lambda _msg: None,
    ) -> None:
        self.tag = tag or secrets.token_hex(3)
        self.plugin = plugin
        self.plugin_source = plugin_source
        self.extra_config = dict(extra_config or {})
        #: the bridge plugin takes its subnets from the Node (``subnet: node``); False: the IPv4 CIDR, written out
        self.node_subnets = node_subnets
        self.progress = progress
        self.underlay = f"np{self.tag}u"
        self.nodes: dict[str, SimNode] = {}
        self.pods: dict[tuple[str, str], SimPod] = {}
        self.root = Path(tempfile.mkdtemp(prefix=f"netplugin-sim-{self.tag}-"))
        os.chmod(self.root, 0o755)
        self._netns: list[str] = []
        self.api: ApiServer | None = None
        self._bookmark_interval = bookmark_interval
        self.env = {k: v for k, v in os.environ.items() if k not in _PROXY_VARS}
        self.env.pop("NETPLUGIN_CONFIG", None)

    # --- life cycle --------------------------------------------------------------------------------

    def __enter__(self) -> SimCluster:
        try:
            self._make_underlay()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _add_netns(self, name: str) -> None:
        ip("netns", "add", name)
        self._netns.append(name)
        ip("-n", name, "link", "set", "lo", "up")
        # Addresses are usable at once (no duplicate address detection wait) in a lab of our own.
        self.sysctl(name, "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0")

    def sysctl(self, netns: str, *settings: str) -> None:
        done = run(["ip", "netns", "exec", netns, "sysctl", "-qw", *settings], env=self.env, timeout=20)
        if done.returncode != 0:
            raise SystemFailure("sysctl in netns", netns, done.stderr.decode(errors="replace").strip())

    def _make_underlay(self) -> None:
        u = self.underlay
        self._add_netns(u)
        ip("-n", u, "link", "add", "br0", "type", "bridge")
        ip("-n", u, "link", "set", "br0", "up")
        ip("-n", u, "addr", "add", f"{UNDERLAY_V4.network_address + 1}/{UNDERLAY_V4.prefixlen}", "dev", "br0")
        ip("-n", u, "addr", "add", f"{UNDERLAY_V6.network_address + 1}/{UNDERLAY_V6.prefixlen}", "dev", "br0")
        # "Outside the cluster": addresses of the underlay namespace itself (on lo: no dummy
        # link needed), reached by the nodes through their default routes.
        ip("-n", u, "addr", "add", f"{OUTSIDE_V4}/32", "dev", "lo")
        ip("-n", u, "addr", "add", f"{OUTSIDE_V6}/128", "dev", "lo")
        self._start_api()

    def _start_api(self) -> None:
        """The API server the nodes' daemons use, listening in the underlay at its first address."""
        u = self.underlay
        sock = socket_in_netns(u, socket.AF_INET, (str(UNDERLAY_V4.network_address + 1), 0))
        self.api = ApiServer(sock=sock, bookmark_interval=self._bookmark_interval)
        self.progress(f"underlay {u}: API server at {self.api.url}")

    def close(self) -> None:
        """Stop every daemon, remove every namespace this cluster made, and the temp dir."""
        for node in list(self.nodes.values()):
            self._stop_daemon(node)
        for name in reversed(self._netns):
            if netns_exists(name):
                ip("netns", "del", name, check=False)
        self._netns.clear()
        if self.api is not None:
            self.api.close()
            self.api = None
        shutil.rmtree(self.root, ignore_errors=True)

    # --- nodes -------------------------------------------------------------------------------------

    def add_node(self, index: int | None = None, *, start: bool = True, register: bool = True) -> SimNode:
        """Create node ``index`` (default: the next free one): netns, underlay link, config, daemon."""
        assert self.api is not None
        if index is None:
            used = {n.index for n in self.nodes.values()}
            index = next(i for i in range(1, MAX_NODES + 1) if i not in used)
        if not 1 <= index <= MAX_NODES:
            raise ValueError(f"node index must be 1..{MAX_NODES}, got {index}")
        v4, v6 = node_addresses(index)
        node = SimNode(
            index, f"node-{index}", f"np{self.tag}n{index}", v4, v6, node_pod_cidrs(index), self.root / f"node-{index}"
        )
        node.root.mkdir(mode=0o755)
        self.nodes[node.name] = node
        self._add_netns(node.netns)
        self.sysctl(node.netns, "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")
        port = f"np{self.tag}u{index}"
        ip("-n", self.underlay, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", node.netns)
        ip("-n", self.underlay, "link", "set", port, "master", "br0", "up")
        ip("-n", node.netns, "link", "set", "eth0", "up")
        ip("-n", node.netns, "addr", "add", f"{v4}/{UNDERLAY_V4.prefixlen}", "dev", "eth0")
        ip("-n", node.netns, "addr", "add", f"{v6}/{UNDERLAY_V6.prefixlen}", "dev", "eth0")
        ip("-n", node.netns, "route", "add", "default", "via", str(UNDERLAY_V4.network_address + 1))
        ip("-n", node.netns, "-6", "route", "add", "default", "via", str(UNDERLAY_V6.network_address + 1))
        self._write_config(node)
        if register:
            self.register(node)
        if start:
            self.start_daemon(node)
        return node

    def register(self, node: SimNode) -> None:
        assert self.api is not None
        self.api.apply(make_node(node.name, list(node.pod_cidrs), list(node.internal_ips)))

    def _write_config(self, node: SimNode) -> None:
        assert self.api is not None
        for d in ("exec", "state", "run"):
            (node.root / d).mkdir(mode=0o755)
        if self.plugin == "bridge":
            source = self.plugin_source
            if source is None:
                source = find_plugin_source()
            shutil.copytree(source / "bridge", node.root / "exec" / "bridge")
            for p in (node.root / "exec" / "bridge", node.root / "exec" / "bridge" / "bridge"):
                os.chmod(p, 0o755)
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "sim", "cluster": {"server": self.api.url}}],
            "users": [{"name": "sim", "user": {}}],
            "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "sim"}}],
            "current-context": "sim",
        }
        (node.root / "kubeconfig").write_text(json.dumps(kubeconfig, indent=1))
        config: dict[str, Any] = {
            "plugin": self.plugin,
            "plugin_dir": str(node.root / "exec"),
            "state_dir": str(node.root / "state"),
            "run_dir": str(node.root / "run"),
            "host": "kube",
            "kubeconfig": str(node.root / "kubeconfig"),
            "node_name": node.name,
            "metrics_address": "127.0.0.1:0",
            "cluster_cidrs": list(CLUSTER_CIDRS),
            "node_resync": 5,
            "env": {
                "NETPLUGIN_BRIDGE_NAME": "cbr0",
                "NETPLUGIN_BRIDGE_SUBNET": "node" if self.node_subnets else node.pod_cidrs[0],
                "NETPLUGIN_BRIDGE_STATE_DIR": str(node.root / "state" / "bridge"),
            },
        }
        config.update(self.extra_config)
        # JSON is YAML: the config loader reads it as is.
        node.config_path.write_text(json.dumps(config, indent=1) + "\n")

    @staticmethod
    def _netplugin_argv(node: SimNode, *args: str) -> list[str]:
        """``netplugin --config <node's> ARGS``, run inside the node's namespace."""
        inside = ["ip", "netns", "exec", node.netns]
        return [*inside, sys.executable, "-m", "netplugin", "--config", str(node.config_path), *args]

    def netplugin(self, node: SimNode, *args: str, timeout: float = 60.0, env: dict[str, str] | None = None) -> Any:
        """Run ``netplugin --config <node's> -o json ARGS`` inside the node's namespace; its JSON output."""
        argv = self._netplugin_argv(node, "-o", "json", *args)
        done = run(argv, env={**self.env, **(env or {})}, timeout=timeout)
        if done.returncode != 0:
            raise SystemFailure(
                f"netplugin {' '.join(args)} on {node.name}", None, done.stderr.decode(errors="replace").strip()[-2000:]
            )
        out = done.stdout.decode().strip()
        return json.loads(out) if out else None

    def daemon_command(self, node: SimNode) -> tuple[list[str], dict[str, str]]:
        """How ``node``'s daemon is started (argv inside its namespace, environment); a hook for other layouts."""
        return self._netplugin_argv(node, "serve"), self.env

    def start_daemon(self, node: SimNode, *, ready_timeout: float = 30.0) -> None:
        argv, env = self.daemon_command(node)
        with open(node.log_path, "ab") as log:
            node.daemon = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, start_new_session=True
            )
        deadline = time.monotonic() + ready_timeout
        while True:
            if node.daemon.poll() is not None:
                raise SystemFailure(
                    f"daemon of {node.name} exited ({node.daemon.returncode})",
                    str(node.log_path),
                    self.daemon_log(node)[-1500:],
                )
            if node.socket_path.exists():
                with contextlib.suppress(NetpluginError, OSError):
                    if self.health(node):
                        break
            if time.monotonic() > deadline:
                raise SystemFailure(
                    f"daemon of {node.name} not ready after {ready_timeout:g}s",
                    str(node.log_path),
                    self.daemon_log(node)[-1500:],
                )
            time.sleep(0.05)

    def health(self, node: SimNode) -> dict[str, Any]:
        """The daemon's health answer (its node, routes and watches included)."""
        answer: dict[str, Any] = request(str(node.socket_path), "health", timeout=10.0)
        return answer

    def daemon_log(self, node: SimNode) -> str:
        try:
            return node.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def _stop_daemon(self, node: SimNode, timeout: float = 20.0) -> int | None:
        proc, node.daemon = node.daemon, None
        if proc is None:
            return None
        return stop_session(proc, timeout)

    def stop_daemon(self, node: SimNode) -> int | None:
        return self._stop_daemon(node)

    def remove_node(self, node: SimNode, *, delete_object: bool = True) -> None:
        """Tear down the node's pods, stop its daemon, delete its Node object and its namespace."""
        assert self.api is not None
        for pod in [p for p in self.pods.values() if p.node is node]:
            self.delete_pod(pod)
        self._stop_daemon(node)
        if delete_object:
            self.api.delete("Node", node.name)
        if netns_exists(node.netns):
            ip("netns", "del", node.netns)
        self._netns.remove(node.netns)
        del self.nodes[node.name]

    # --- pods --------------------------------------------------------------------------------------

    def create_pod(
        self, node: SimNode, name: str, namespace: str = "default", *, env: dict[str, str] | None = None
    ) -> SimPod:
        """The pod in the API (bound to ``node``), its netns, set up through the node's CLI (``env`` added)."""
        assert self.api is not None
        pod = SimPod(node, namespace, name, f"np{self.tag}p{len(self.pods)}{secrets.token_hex(2)}")
        self.api.apply(make_pod(namespace, name, node.name, labels={"app": "sim"}))
        self._add_netns(pod.infra_id)
        self.pods[(namespace, name)] = pod
        self.netplugin(node, "setup", namespace, name, pod.infra_id, env=env)
        pod.ips = self.pod_ips(pod)
        return pod

    def pod_ips(self, pod: SimPod) -> list[str]:
        status = self.netplugin(pod.node, "status", pod.namespace, pod.name, pod.infra_id) or {}
        ips = [a["ip"] if isinstance(a, dict) else a for a in status.get("ips") or []]
        return ips or ([status["ip"]] if status.get("ip") else [])

    def delete_pod(self, pod: SimPod) -> None:
        assert self.api is not None
        self.netplugin(pod.node, "teardown", pod.namespace, pod.name, pod.infra_id)
        self.api.delete("Pod", pod.name, pod.namespace)
        if netns_exists(pod.infra_id):
            ip("netns", "del", pod.infra_id)
        self._netns.remove(pod.infra_id)
        del self.pods[(pod.namespace, pod.name)]

    # --- looking ------------------------------------------------------------------------------------

    def routes(self, node: SimNode) -> dict[str, str]:
        """The node's routes made by netplugin: destination -> gateway."""
        out: dict[str, str] = {}
        for family in ("-4", "-6"):
            for r in ip_json("-n", node.netns, family, "route", "show", "proto", _ROUTE_PROTO):
                out[str(ipaddress.ip_network(r["dst"], strict=False))] = r.get("gateway", "")
        return out

    def expected_routes(self, node: SimNode) -> dict[str, str]:
        """What ``routes(node)`` should be: every other registered node's pod CIDRs via its InternalIPs."""
        assert self.api is not None
        want: dict[str, str] = {}
        for obj in self.api.objects("Node"):
            if obj["metadata"]["name"] == node.name:
                continue
            ips = [a["address"] for a in obj["status"]["addresses"] if a["type"] == "InternalIP"]
            for cidr in obj["spec"].get("podCIDRs", []):
                version = ipaddress.ip_network(cidr).version
                gw = next((a for a in ips if ipaddress.ip_address(a).version == version), None)
                if gw is not None:
                    want[cidr] = gw
        return want

    def wait_routes(self, timeout: float = 2.0, nodes: list[SimNode] | None = None) -> float:
        """Seconds until every node's routes are as expected; SystemFailure after ``timeout``."""
        start = time.monotonic()
        targets = list(self.nodes.values()) if nodes is None else nodes
        while True:
            wrong = [n.name for n in targets if self.routes(n) != self.expected_routes(n)]
            if not wrong:
                return time.monotonic() - start
            if time.monotonic() - start > timeout:
                detail = "; ".join(
                    f"{n.name}: have {self.routes(n)}, want {self.expected_routes(n)}"
                    for n in targets
                    if n.name in wrong
                )
                raise SystemFailure(f"routes did not converge within {timeout:g}s", None, detail)
            time.sleep(0.02)

    def exec_in(self, netns: str, argv: list[str], timeout: float = 20.0) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            ["ip", "netns", "exec", netns, *argv], capture_output=True, timeout=timeout, env=self.env, check=False
        )

    @contextlib.contextmanager
    def listeners(self, netns_names: list[str], port: int, reply: Callable[[str], str]) -> Iterator[None]:
        """A TCP server on ``port`` (both families) in each named netns, answering ``reply(netns)``."""
        procs = []
        try:
            for ns in netns_names:
                p = subprocess.Popen(
                    ["ip", "netns", "exec", ns, sys.executable, "-c", _LISTENER, str(port), reply(ns)],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                    env=self.env,
                )
                procs.append(p)
                assert p.stdout is not None
                if p.stdout.readline().strip() != b"ready":
                    raise SystemFailure("listener did not start in", ns, "")
            yield
        finally:
            for p in procs:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                if p.stdout is not None:
                    p.stdout.close()

    def connect(self, netns: str, address: str, port: int, timeout: float = 3.0) -> str:
        """From ``netns``, connect to ``address:port``; what the server said ("" when it failed)."""
        done = self.exec_in(
            netns, [sys.executable, "-c", _CONNECT, address, str(port), str(timeout)], timeout=timeout + 10
        )
        return done.stdout.decode().strip() if done.returncode == 0 else ""


# The server says its reply and the address the connection came from (masquerade shows there).
_LISTENER = r"""
import socket, sys, threading
def serve(s):
    while True:
        c, peer = s.accept()
        c.sendall((sys.argv[2] + " " + peer[0]).encode())
        c.close()
socks = []
for fam, addr in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
    s = socket.socket(fam)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if fam == socket.AF_INET6:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    s.bind((addr, int(sys.argv[1])))
    s.listen(64)
    threading.Thread(target=serve, args=(s,), daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
"""
_CONNECT = r"""
import socket, sys, time
deadline = time.monotonic() + float(sys.argv[3])
while True:
    try:
        c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1)
        print(c.recv(512).decode())
        break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit(1)
        time.sleep(0.1)
"""
