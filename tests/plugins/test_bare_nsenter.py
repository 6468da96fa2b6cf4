"""The daemon entered into a node's netns with a bare ``nsenter --net`` (as containerd enters a node, or a
DaemonSet-like process runs there): ``ip netns exec`` remounts /sys, nsenter does not, so /sys/class/net
shows the root netns's links. Both bridges (bash and native), each chained with its hostport member, set up
and tear down pods there: nothing they decide may come from /sys."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from netplugin.plugins.bridge.settings import host_veth_name
from netplugin.plugins.hostport import TABLE, chain_name
from tests.support.waits import wait_answering

pytestmark = pytest.mark.kernel
REPO = Path(__file__).resolve().parents[2]
SUBNET = "10.201.29.0/24"
CHAINS = {
    "bash": ("bridge", "hostport"),
    "native": ("netplugin.io/bridge", "netplugin.io/hostport"),
}


def _netns(name: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", "netns", "exec", name, *argv], capture_output=True, text=True, timeout=60)


@pytest.fixture
def make_netns() -> Iterator[Callable[[str], str]]:
    made: list[str] = []

    def make(suffix: str) -> str:
        name = f"np{secrets.token_hex(3)}{suffix}"
        subprocess.run(["ip", "netns", "add", name], check=True)
        made.append(name)
        return name

    yield make
    for name in reversed(made):
        subprocess.run(["ip", "netns", "del", name], check=False)


@pytest.fixture
def daemon_in(tmp_path: Path, plugin_dir: Any) -> Iterator[Callable[[str, tuple[str, ...], str], dict[str, str]]]:
    """Start ``netplugin serve`` under ``nsenter --net=/run/netns/NODE``; the CLI environment that reaches it."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(node: str, chain: tuple[str, ...], bridge: str) -> dict[str, str]:
        for name in ("bridge", "hostport"):
            plugin_dir.install(name, script=REPO / "exec_plugins" / name / name)
        cfg = tmp_path / "netplugin.yaml"
        cfg.write_text(
            f"plugins: [{', '.join(chain)}]\nstate_dir: {tmp_path}/state\nrun_dir: {tmp_path}/run\n"
            f"plugin_dir: {plugin_dir.path}\nhost: none\nmetrics_address: none\nuse_daemon: always\n"
            f"env:\n  NETPLUGIN_BRIDGE_NAME: {bridge}\n  NETPLUGIN_BRIDGE_SUBNET: {SUBNET}\n"
            f"  NETPLUGIN_BRIDGE_STATE_DIR: {tmp_path}/ipam\n  NETPLUGIN_HOST_PORTS: tcp/8080/80 udp/5353/53\n"
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_")}
        env.update(NETPLUGIN_CONFIG=str(cfg), PYTHONPATH=str(REPO))
        log = open(tmp_path / "daemon.log", "wb")  # noqa: SIM115 - the child keeps it
        argv = ["nsenter", f"--net=/run/netns/{node}", sys.executable, "-m", "netplugin", "serve"]
        procs.append(subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log))
        log.close()
        sock = str(tmp_path / "run" / "netplugin.sock")
        wait_answering(sock, procs[-1], tmp_path / "daemon.log")
        return env

    yield start
    for p in procs:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()


@pytest.mark.skipif(not shutil.which("nsenter") or not shutil.which("nft"), reason="nsenter and nft are needed")
@pytest.mark.parametrize("kind", list(CHAINS))
def test_both_bridges_and_hostport_work_in_a_netns_entered_with_bare_nsenter(
    kind: str, make_netns: Callable[[str], str], daemon_in: Callable[[str, tuple[str, ...], str], dict[str, str]]
) -> None:
    node, pod = make_netns("nn"), make_netns("p1")
    bridge = f"npb{secrets.token_hex(3)}"
    env = daemon_in(node, CHAINS[kind], bridge)
    infra = pod  # the pod's netns is /run/netns/<infra id> (the default netns template)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "netplugin", *args], env=env, capture_output=True, text=True,
                              timeout=120)  # fmt: skip

    done = cli("setup", "default", "web", infra)
    assert done.returncode == 0, done.stdout + done.stderr
    host = host_veth_name(infra)
    # in the node's netns, not the root's: the bridge, the pod's veth on it, the pod's address, its hostPorts
    ports = _netns(node, "ip", "-o", "link", "show", "master", bridge).stdout
    assert f": {host}@" in ports, ports
    assert subprocess.run(["ip", "link", "show", "dev", bridge], capture_output=True).returncode != 0
    addr = _netns(pod, "ip", "-o", "-4", "addr", "show", "dev", "eth0").stdout
    assert " 10.201.29." in addr, addr
    pod_ip = addr.split(" inet ")[1].split("/")[0]
    assert _netns(node, "ping", "-c", "1", "-W", "2", pod_ip).returncode == 0
    table = _netns(node, "nft", "list", "table", *TABLE.split()).stdout
    assert chain_name(infra) in table and "tcp . 8080 : jump" in table and f"{pod_ip}:80" in table, table
    # a second setup of the same pod (the veth exists: the path that re-attaches it)
    done = cli("setup", "default", "web", infra)
    assert done.returncode == 0, done.stdout + done.stderr

    done = cli("teardown", "default", "web", infra)
    assert done.returncode == 0, done.stdout + done.stderr
    assert host not in _netns(node, "ip", "-o", "link", "show").stdout
    assert chain_name(infra) not in _netns(node, "nft", "list", "table", *TABLE.split()).stdout
