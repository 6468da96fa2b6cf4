"""Test bridge networks, a pytest plugin module loaded by tests/conftest.py.

Real network namespaces, veths and bridges with run-unique names.

Everything a test creates is registered before it is created and removed by the fixture finalizer,
whether the test passed or not: namespaces, host veths (by their derived names and as ports of the
test bridge) and the bridge. Tests marked ``kernel`` are skipped, with the reason, when the machine
cannot provide that (not root, no ``ip``, no network namespaces).
"""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.nettest import close_all, free_third_octet, host_veth_name, kernel_unavailable_reason, link_exists

__all__ = [
    "AUDIT",
    "BRIDGE",
    "EXEC_PLUGINS",
    "LOOPBACK",
    "BridgeNet",
    "Pod",
    "bash_config",
    "bash_settings",
    "bridge_env",
    "host_veth_name",
    "kernel_unavailable_reason",
    "link_exists",
]

REPO = Path(__file__).resolve().parents[2]
EXEC_PLUGINS = REPO / "exec_plugins"
BRIDGE = EXEC_PLUGINS / "bridge" / "bridge"
LOOPBACK = EXEC_PLUGINS / "loopback" / "loopback"
AUDIT = EXEC_PLUGINS / "example.com~audit" / "audit"

# 10.200.0.0/16 is reserved for these tests (design.md); each test takes a random free /24 of it.
TEST_RANGE = ipaddress.ip_network("10.200.0.0/16")
TCP_PORT = 8080

# A TCP server that answers every connection with its own name, so a client knows whom it reached.
_SERVER = """
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[2])))
s.listen(128)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(sys.argv[1].encode())
    c.close()
"""

# Connects to every address given and prints {address: answer or error} as JSON.
_CLIENT = """
import json, socket, sys
port = int(sys.argv[1])
out = {}
for addr in sys.argv[2:]:
    try:
        with socket.create_connection((addr, port), timeout=3) as c:
            out[addr] = c.recv(256).decode()
    except OSError as e:
        out[addr] = "error: %s" % e
print(json.dumps(out))
"""


def bridge_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a settings check: no outer ``NETPLUGIN_*``, state under ``tmp_path``, then ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_")}
    env["NETPLUGIN_STATE_DIR"] = str(tmp_path / "state")
    env.update(extra)
    return env


def bash_config(env: Mapping[str, str], exe: Path = BRIDGE) -> subprocess.CompletedProcess[str]:
    """The bash bridge plugin's ``config`` action: its settings as KEY=VALUE lines, or its refusal on stderr."""
    return subprocess.run([str(exe), "config"], env=env, capture_output=True, text=True, timeout=30)


def bash_settings(env: Mapping[str, str], exe: Path = BRIDGE) -> dict[str, str]:
    """The settings the bash bridge plugin takes from ``env`` (it must accept them)."""
    r = bash_config(env, exe)
    assert r.returncode == 0, r.stderr
    return dict(line.split("=", 1) for line in r.stdout.splitlines())


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)






@dataclass(frozen=True)
class Pod:
    namespace: str
    name: str
    infra_id: str
    netns: str  # netns name under /var/run/netns
    host_veth: str

    @property
    def netns_path(self) -> str:
        return f"/var/run/netns/{self.netns}"


@dataclass
class BridgeNet:
    """One test's bridge, subnet, IPAM dir and pods; ``close()`` removes all of it."""

    tmp: Path
    prefixlen: int = 24
    tag: str = field(default_factory=lambda: secrets.token_hex(3))
    netns_names: list[str] = field(default_factory=list)
    infra_ids: list[str] = field(default_factory=list)
    servers: list[subprocess.Popen[str]] = field(default_factory=list)
    extra_links: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.bridge = f"npbr{self.tag}"
        third = free_third_octet(str(TEST_RANGE))
        self.subnet = ipaddress.ip_network(f"10.200.{third}.0/{self.prefixlen}")
        self.gateway = str(self.subnet.network_address + 1)
        self.np_state = self.tmp / f"np-state-{self.tag}"
        self.state_dir = self.tmp / f"bridge-state-{self.tag}"
        self.np_state.mkdir(parents=True, exist_ok=True)
        self.env: dict[str, str] = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_")}
        self.env.update(
            NETPLUGIN_STATE_DIR=str(self.np_state),
            NETPLUGIN_PLUGIN="bridge",
            NETPLUGIN_BRIDGE_NAME=self.bridge,
            NETPLUGIN_BRIDGE_SUBNET=str(self.subnet),
            NETPLUGIN_BRIDGE_STATE_DIR=str(self.state_dir),
            # ip_forward is global to the host netns; tests that check it run init in their own netns.
            NETPLUGIN_BRIDGE_IP_FORWARD="false",
            NETPLUGIN_BRIDGE_BR_NETFILTER="false",
        )

    # -- paths ---------------------------------------------------------------------------------------
    @property
    def ipam(self) -> Path:
        return self.state_dir / self.bridge

    def ipam_files(self, sub: str) -> list[str]:
        d = self.ipam / sub
        return sorted(os.listdir(d)) if d.is_dir() else []

    # -- creating things -----------------------------------------------------------------------------
    def add_netns(self, suffix: str) -> str:
        name = f"np-{self.tag}-{suffix}"
        self.netns_names.append(name)
        r = _run(["ip", "netns", "add", name])
        assert r.returncode == 0, r.stderr
        return name

    def pod(self, i: int | str, *, create_netns: bool = True) -> Pod:
        infra = f"{self.tag}infra{i}"
        self.infra_ids.append(infra)
        netns = f"np-{self.tag}-{i}"
        if create_netns:
            self.add_netns(str(i))
        else:
            self.netns_names.append(netns)
        return Pod("default", f"pod-{i}", infra, netns, host_veth_name(infra))

    def pods(self, n: int) -> list[Pod]:
        return [self.pod(i) for i in range(n)]

    def call_env(self, action: str, pod: Pod | None, netns: str | None = None) -> dict[str, str]:
        env = dict(self.env, NETPLUGIN_ACTION=action)
        if pod is not None:
            env.update(
                NETPLUGIN_POD_NAMESPACE=pod.namespace,
                NETPLUGIN_POD_NAME=pod.name,
                NETPLUGIN_INFRA_ID=pod.infra_id,
                NETPLUGIN_NETNS=netns if netns is not None else pod.netns_path,
            )
        return env

    def argv(self, action: str, pod: Pod | None, plugin: Path = BRIDGE) -> list[str]:
        if pod is None:
            return [str(plugin), action]
        return [str(plugin), action, pod.namespace, pod.name, pod.infra_id]

    def run(
        self,
        action: str,
        pod: Pod | None = None,
        *,
        plugin: Path = BRIDGE,
        env: Mapping[str, str] | None = None,
        netns: str | None = None,
        stdin: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        full = self.call_env(action, pod, netns)
        full.update(env or {})
        return subprocess.run(
            self.argv(action, pod, plugin),
            env=full,
            input=stdin,
            stdin=None if stdin is not None else subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def ok(self, action: str, pod: Pod | None = None, **kw: object) -> subprocess.CompletedProcess[str]:
        r = self.run(action, pod, **kw)  # type: ignore[arg-type]
        assert r.returncode == 0, f"{action} failed ({r.returncode}): {r.stderr}"
        return r

    def pod_ip(self, pod: Pod) -> str:
        """The IPv4 address configured on eth0 inside the pod (read with ip, not the plugin)."""
        out = _run(["ip", "-n", pod.netns, "-o", "-4", "addr", "show", "dev", "eth0"]).stdout
        words = out.split()
        return words[words.index("inet") + 1].split("/")[0]

    def pod_mac(self, pod: Pod) -> str:
        """The MAC address of eth0 inside the pod (read with ip, not the plugin)."""
        words = _run(["ip", "-n", pod.netns, "-o", "link", "show", "dev", "eth0"]).stdout.split()
        return words[words.index("link/ether") + 1]

    def status_ip(self, pod: Pod) -> str | None:
        out = self.ok("status", pod).stdout.strip()
        if not out:
            return None
        doc = json.loads(out)
        assert doc["apiVersion"] == "v1beta1"
        assert doc["kind"] == "PodNetworkStatus"
        return str(doc["ip"])

    def bridge_ports(self) -> list[str]:
        out = _run(["ip", "-o", "link", "show", "master", self.bridge]).stdout
        return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if line.strip()]

    # -- traffic -------------------------------------------------------------------------------------
    #: the TCP server and client run in pods, and their port (a dual-stack net swaps in its own)
    server_script = _SERVER
    client_script = _CLIENT
    port = TCP_PORT

    def serve(self, pod: Pod) -> None:
        """Start the answering TCP server inside the pod's netns and wait until it listens."""
        p = subprocess.Popen(
            ["ip", "netns", "exec", pod.netns, sys.executable, "-c", self.server_script, pod.name, str(self.port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        self.servers.append(p)
        assert p.stdout is not None
        line = p.stdout.readline()
        assert line.strip() == "ready", p.stderr.read() if p.stderr else line

    def connect_from(self, pod: Pod, addrs: list[str]) -> dict[str, str]:
        r = _run(["ip", "netns", "exec", pod.netns, sys.executable, "-c", self.client_script, str(self.port), *addrs])
        assert r.returncode == 0, r.stderr
        return dict(json.loads(r.stdout))

    # -- cleanup -------------------------------------------------------------------------------------
    def close(self) -> None:
        for p in self.servers:
            p.kill()
            p.wait(timeout=10)
            for stream in (p.stdout, p.stderr):
                if stream:
                    stream.close()
        for name in self.netns_names:
            if os.path.exists(f"/var/run/netns/{name}"):
                _run(["ip", "netns", "del", name])
        stray = {host_veth_name(i) for i in self.infra_ids} | set(self.extra_links)
        if link_exists(self.bridge):
            stray |= set(self.bridge_ports())
        for link in sorted(stray):
            if link_exists(link):
                _run(["ip", "link", "del", "dev", link])
        if link_exists(self.bridge):
            _run(["ip", "link", "del", "dev", self.bridge])

    def wait_gone(self, link: str, timeout: float = 5.0) -> bool:
        """Deleting a netns removes its veths asynchronously; wait for the host end to go."""
        deadline = time.monotonic() + timeout
        while link_exists(link):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True


@pytest.fixture
def bridge_net_factory(tmp_path: Path) -> Iterator[Callable[..., BridgeNet]]:
    """Make BridgeNet(s): ``bridge_net_factory(prefixlen=29)`` (``cls=`` for a subclass); all removed at the end."""
    made: list[BridgeNet] = []

    def make(prefixlen: int = 24, cls: type[BridgeNet] = BridgeNet) -> BridgeNet:
        net = cls(tmp_path, prefixlen=prefixlen)
        made.append(net)
        return net

    yield make
    close_all(made)


@pytest.fixture
def bridge_net(bridge_net_factory: Callable[..., BridgeNet]) -> BridgeNet:
    """A /24 test network whose bridge exists (init has run)."""
    net = bridge_net_factory()
    net.ok("init")
    return net
