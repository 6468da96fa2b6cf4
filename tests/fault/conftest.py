"""Fault-injection fixtures: a private netplugin (config, dirs) driving the real bridge plugin.

Everything is unique per run and removed by fixture finalizers, pass or fail: network namespaces
``np-<hex>-<i>``, the bridge ``npf<hex>``, host veths (their names derive from infra ids, as in the
bridge plugin), and plugin processes of this run's state dir. The subnet is a random free /24 of
10.203.0.0/16 (reserved for fault injection). Nothing else on the machine is touched.
"""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.nettest import close_all, free_third_octet, host_veth_name, kernel_gate, link_exists

REPO = Path(__file__).resolve().parents[2]
BRIDGE = REPO / "exec_plugins" / "bridge" / "bridge"
FAULT_RANGE = ipaddress.ip_network("10.203.0.0/16")


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


@pytest.fixture(autouse=True)
def _kernel_gate(request: pytest.FixtureRequest) -> None:
    kernel_gate(request, None if BRIDGE.exists() else f"the bridge plugin {BRIDGE} is missing")




@dataclass(frozen=True)
class FPod:
    namespace: str
    name: str
    infra_id: str
    netns: str

    @property
    def argv(self) -> list[str]:
        return [self.namespace, self.name, self.infra_id]

    @property
    def veth(self) -> str:
        return host_veth_name(self.infra_id)

    def ref(self) -> Any:
        from netplugin.core.names import PodRef

        return PodRef(self.namespace, self.name, self.infra_id)


@dataclass
class FaultNet:
    """A netplugin config using the real bridge plugin on a private bridge; ``close()`` removes it all."""

    tmp: Path
    plugin: str = "bridge"
    #: a chain instead of ``plugin`` (``plugins:`` in the config)
    plugins: list[str] = field(default_factory=list)
    timeouts: dict[str, float] = field(default_factory=lambda: {"setup": 30, "teardown": 30, "status": 10,
                                                                "init": 10})
    kill_grace: float = 2.0
    extra_env: dict[str, str] = field(default_factory=dict)
    tag: str = field(default_factory=lambda: secrets.token_hex(3))
    netns_names: list[str] = field(default_factory=list)
    pods: list[FPod] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.bridge = f"npf{self.tag}"
        self.subnet = ipaddress.IPv4Network(f"10.203.{free_third_octet(str(FAULT_RANGE))}.0/24")
        root = self.tmp / f"fault-{self.tag}"
        self.root = root
        self.exec_dir = root / "exec"
        self.state_dir = root / "state"
        self.run_dir = root / "run"
        self.bridge_state = root / "bridge-state"
        for d in (self.exec_dir, self.state_dir, self.run_dir, self.bridge_state):
            d.mkdir(parents=True, mode=0o755)
        os.chmod(self.exec_dir, 0o755)
        self.install("bridge", BRIDGE.read_text())
        self.config = root / "netplugin.yaml"
        self.write_config()

    def install(self, name: str, script: str) -> Path:
        d = self.exec_dir / name
        d.mkdir(mode=0o755, exist_ok=True)
        os.chmod(d, 0o755)
        exe = d / name
        exe.write_text(script)
        os.chmod(exe, 0o755)
        return exe

    def write_config(self) -> None:
        env = {
            "NETPLUGIN_BRIDGE_NAME": self.bridge,
            "NETPLUGIN_BRIDGE_SUBNET": str(self.subnet),
            "NETPLUGIN_BRIDGE_STATE_DIR": str(self.bridge_state),
            # ip_forward is global to the host: these tests leave it alone.
            "NETPLUGIN_BRIDGE_IP_FORWARD": "false",
            "NETPLUGIN_BRIDGE_BR_NETFILTER": "false",
            **self.extra_env,
        }
        doc = {
            "plugin_dir": str(self.exec_dir), "plugin": self.plugin, "state_dir": str(self.state_dir),
            "run_dir": str(self.run_dir), "host": "none", "use_daemon": "never", "timeouts": self.timeouts,
            "kill_grace": self.kill_grace, "env": env,
        }
        if self.plugins:
            doc["plugins"] = self.plugins
            del doc["plugin"]
        self.config.write_text(json.dumps(doc))  # JSON is YAML

    # --- netplugin ------------------------------------------------------------------------------------
    @property
    def cli_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_")}
        env.update(NETPLUGIN_CONFIG=str(self.config), PYTHONPATH=str(REPO))
        return env

    def cli_argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "netplugin", *args]

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.cli_argv(*args), env=self.cli_env, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def manager(self) -> Any:
        from netplugin.core.config import load_config
        from netplugin.hosts.base import NullHost
        from netplugin.manager.manager import Manager

        return Manager(load_config(str(self.config), environ={}), NullHost())

    def store(self) -> Any:
        from netplugin.store.state import StateStore

        return StateStore(str(self.state_dir))

    # --- pods ----------------------------------------------------------------------------------------
    def add_pods(self, n: int) -> list[FPod]:
        out = []
        for _ in range(n):
            i = len(self.pods)
            netns = f"np-{self.tag}-{i}"
            self.netns_names.append(netns)
            r = _run(["ip", "netns", "add", netns])
            assert r.returncode == 0, r.stderr
            # The infra id names the netns: netplugin's default netns_template is /var/run/netns/{infra_id}.
            pod = FPod("default", f"pod-{i}", netns, netns)
            self.pods.append(pod)
            out.append(pod)
        return out

    # --- what is really there ---------------------------------------------------------------------------
    @property
    def ipam(self) -> Path:
        return self.bridge_state / self.bridge

    def ipam_files(self, sub: str) -> dict[str, str]:
        d = self.ipam / sub
        if not d.is_dir():
            return {}
        return {f.name: f.read_text().strip() for f in d.iterdir() if not f.name.startswith(".")}

    def bridge_ports(self) -> set[str]:
        out = _run(["ip", "-o", "link", "show", "master", self.bridge]).stdout
        return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if line.strip()}

    def pod_ip(self, pod: FPod) -> str | None:
        r = _run(["ip", "-n", pod.netns, "-o", "-4", "addr", "show", "dev", "eth0"])
        words = r.stdout.split()
        return words[words.index("inet") + 1].split("/")[0] if "inet" in words else None

    def plugin_processes(self) -> list[Any]:
        from netplugin.store.orphans import plugin_processes

        return plugin_processes(str(self.state_dir))

    # --- cleanup --------------------------------------------------------------------------------------
    def close(self) -> None:
        for p in self.plugin_processes():
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for name in self.netns_names:
            if os.path.exists(f"/var/run/netns/{name}"):
                _run(["ip", "netns", "del", name])
        stray = {p.veth for p in self.pods}
        if link_exists(self.bridge):
            stray |= self.bridge_ports()
        for link in sorted(stray):
            if link_exists(link):
                _run(["ip", "link", "del", "dev", link])
        if link_exists(self.bridge):
            _run(["ip", "link", "del", "dev", self.bridge])


@pytest.fixture
def fault_net_factory(tmp_path: Path) -> Iterator[Callable[..., FaultNet]]:
    made: list[FaultNet] = []

    def make(**kw: Any) -> FaultNet:
        net = FaultNet(tmp_path, **kw)
        made.append(net)
        return net

    yield make
    close_all(made)
