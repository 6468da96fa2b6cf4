"""Hostile node, round 2 (issue 21): a CNI caller naming the node's own network, or another pod's.

Every attack runs inside a :class:`~hostworld.World` (a private netns and PID namespace playing
the node), so ``/proc/1/ns/net`` and ``/proc/self/ns/net`` are the world's, never the machine's;
the world's default route is the one that must survive. Both bridge plugins (bash and
``netplugin.io/bridge``), through the shim alone, the daemon and the CLI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from netplugin.frontends.wire.client import exchange
from tests.frontends.cni.daemonworld import daemon_config
from tests.support.hostworld import World, world  # noqa: F401 (fixture)
from tests.support.nettest import host_veth_name
from tests.support.waits import wait_answering

from .test_podman import BRIDGE

pytestmark = pytest.mark.kernel

PLUGINS = {"bash": "bridge", "native": "netplugin.io/bridge"}
ARGS = "IgnoreUnknown=1;K8S_POD_NAMESPACE=web;K8S_POD_NAME=web-0"


class Node:
    """One plugin's settings in a world: a config file the shim, the daemon and the CLI share."""

    def __init__(self, w: World, tmp: Path, np_dirs: dict[str, str], plugin_dir: Any, plugin: str) -> None:
        self.world = w
        self.tmp = tmp
        self.bridge = f"npbr{w.tag}"
        if plugin == "bash":
            plugin_dir.install("bridge", script=BRIDGE)
        self.run_dir = np_dirs["run_dir"]
        self.state_dir = np_dirs["state_dir"]
        self.socket = os.path.join(self.run_dir, "netplugin.sock")
        env = {"NETPLUGIN_BRIDGE_NAME": self.bridge, "NETPLUGIN_BRIDGE_SUBNET": str(w.bridge_subnet)}
        env.update(NETPLUGIN_BRIDGE_IP_FORWARD="false", NETPLUGIN_BRIDGE_BR_NETFILTER="false")
        self.config = daemon_config(tmp / "node.yaml", np_dirs, plugin_dir, PLUGINS[plugin], env)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("NETPLUGIN_", "CNI_"))}
        self.env.update(PYTHONPATH=os.environ.get("PYTHONPATH", ""), NETPLUGIN_CONFIG=str(self.config))
        self.use_daemon = "never"

    def start_daemon(self) -> None:
        self.use_daemon = "always"  # never a local fallback: that would run outside the daemon
        proc = self.world.start([sys.executable, "-m", "netplugin", "serve"], env=self.env, log=self.tmp / "daemon.log")
        wait_answering(self.socket, proc, self.tmp / "daemon.log")

    def cni(self, command: str, container: str, netns: str, ifname: str = "eth0",
            args: str = ARGS) -> subprocess.CompletedProcess[bytes]:
        conf = {
            "cniVersion": "1.0.0",
            "name": "nphostile",
            "type": "netplugin-cni",
            "configFile": str(self.config),
            "runDir": self.run_dir,
            "netplugin": {"use_daemon": self.use_daemon},
            "logFile": str(self.tmp / "cni.log"),
        }
        env = dict(self.env, CNI_COMMAND=command, CNI_CONTAINERID=container, CNI_IFNAME=ifname,
                   CNI_NETNS=netns, CNI_ARGS=args, CNI_PATH="/opt/cni/bin")
        return self.world.python("netplugin.frontends.cni", env=env, stdin=json.dumps(conf).encode())

    def cli(self, *args: str, netns: str) -> subprocess.CompletedProcess[bytes]:
        env = dict(self.env, NETPLUGIN_USE_DAEMON="never", NETPLUGIN_NETNS_TEMPLATE=netns)
        return self.world.python("netplugin", *args, env=env)

    def via(self) -> list[str]:
        path = self.tmp / "cni.log"
        return [json.loads(line)["via"] for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def node(world: World, tmp_path: Path, np_dirs: dict[str, str], plugin_dir: Any) -> Callable[[str], Node]:  # noqa: F811
    return lambda plugin: Node(world, tmp_path, np_dirs, plugin_dir, plugin)


def _error(done: subprocess.CompletedProcess[bytes]) -> dict[str, Any]:
    assert done.returncode == 1, done
    doc: dict[str, Any] = json.loads(done.stdout)
    assert b"Traceback" not in done.stderr, done.stderr
    return doc


def _own_netns(w: World, kind: str) -> str:
    return {"init": "/proc/1/ns/net", "self": "/proc/self/ns/net", "bind mount": w.path}[kind]


# --- class 1: the node's own network namespace -------------------------------------------------------------


@pytest.mark.parametrize("plugin", sorted(PLUGINS))
@pytest.mark.parametrize("via", ["shim", "daemon"])
@pytest.mark.parametrize("kind", ["init", "self", "bind mount"])
def test_cni_add_in_the_nodes_own_netns_is_refused_before_any_plugin_runs(
    world: World, node: Callable[[str], Node], plugin: str, via: str, kind: str  # noqa: F811
) -> None:
    n = node(plugin)
    if via == "daemon":
        n.start_daemon()
    netns = _own_netns(world, kind)
    err = _error(n.cni("ADD", "c0ffee01", netns))
    assert err["code"] == 4 and "node's own network namespace" in err["msg"], err
    assert n.via() == ["daemon" if via == "daemon" else "local"]
    # Nothing ran (alone: not even init, the bridge; the daemon ran init when it started), and the
    # node's default route is the one it had.
    assert world.default_route() == world.route
    links = world.links()
    assert host_veth_name("c0ffee01") not in links and "eth0" not in links, links
    assert via == "daemon" or n.bridge not in links
    # The DEL a runtime sends after a failed ADD succeeds and leaves the node alone.
    done = n.cni("DEL", "c0ffee01", netns)
    assert done.returncode == 0, done
    assert world.default_route() == world.route


@pytest.mark.parametrize("plugin", sorted(PLUGINS))
@pytest.mark.parametrize("kind", ["init", "self", "bind mount"])
def test_cli_setup_in_the_nodes_own_netns_is_refused(
    world: World, node: Callable[[str], Node], plugin: str, kind: str  # noqa: F811
) -> None:
    n = node(plugin)
    done = n.cli("setup", "web", "web-0", "c0ffee02", netns=_own_netns(world, kind))
    assert done.returncode == 2, done  # bad input
    assert b"invalid netns" in done.stderr and b"node's own network namespace" in done.stderr, done.stderr
    assert b"Traceback" not in done.stderr
    assert world.default_route() == world.route
    assert n.bridge not in world.links()


@pytest.mark.parametrize("plugin", sorted(PLUGINS))
@pytest.mark.parametrize("via", ["shim", "daemon"])
def test_a_second_container_cannot_take_over_another_pods_netns(
    world: World, node: Callable[[str], Node], tmp_path: Path, plugin: str, via: str  # noqa: F811
) -> None:
    n = node(plugin)
    pod_a = world.add_netns(f"np{world.tag}a")
    # The same namespace by its path and by a bind mount of it; eth1, so no name clash hides the attack.
    alias = tmp_path / "alias-of-a"
    alias.write_text("")
    assert subprocess.run(["mount", "--bind", pod_a, str(alias)]).returncode == 0
    try:
        if via == "daemon":
            n.start_daemon()  # after the mounts: its mount namespace is a copy
        done = n.cni("ADD", "podacontainer", pod_a)
        assert done.returncode == 0, done
        route_a = world.default_route(pod_a)
        assert route_a.startswith("default via ") and " dev eth0 " in route_a + " ", route_a
        for path in (pod_a, str(alias)):
            b_args = "K8S_POD_NAMESPACE=web;K8S_POD_NAME=b"
            err = _error(n.cni("ADD", "podbcontainer", path, ifname="eth1", args=b_args))
            assert err["code"] == 4 and "network namespace of container podacontainer" in err["msg"], err
            assert world.default_route(pod_a) == route_a
            assert "eth1" not in world.links(pod_a)
            done = n.cni("DEL", "podbcontainer", path, ifname="eth1", args=b_args)
            assert done.returncode == 0, done
            assert world.default_route(pod_a) == route_a and "eth0" in world.links(pod_a)
    finally:
        subprocess.run(["umount", str(alias)])
    assert n.cni("DEL", "podacontainer", pod_a).returncode == 0


@pytest.mark.parametrize("plugin", sorted(PLUGINS))
def test_the_plugins_never_replace_a_default_route_they_did_not_make(
    world: World, node: Callable[[str], Node], plugin: str  # noqa: F811
) -> None:
    # Past netplugin's own checks (a netns of its own, no other attachment): the plugin itself
    # must leave a default route it did not make alone, and say so.
    n = node(plugin)
    pod = world.add_netns(f"np{world.tag}r")
    name = pod.rsplit("/", 1)[1]
    for argv in (
        ["link", "add", "up0", "type", "veth", "peer", "name", "up1"],
        ["addr", "add", f"{world.underlay}.9/24", "dev", "up0"],
        ["link", "set", "up0", "up"],
        ["route", "add", "default", "via", f"{world.underlay}.1"],
    ):
        assert subprocess.run(["ip", "-n", name, *argv]).returncode == 0
    before = world.default_route(pod)
    done = n.cli("setup", "web", "web-0", "c0ffee03", netns=pod)
    assert done.returncode == 1, done
    assert b"default route" in done.stderr and b"not made by netplugin" in done.stderr, done.stderr
    assert world.default_route(pod) == before
    assert "eth0" not in world.links(pod)  # rolled back
    # A repeated setup of a pod whose default route is its own still succeeds.
    ok = world.add_netns(f"np{world.tag}o")
    for _ in range(2):
        done = n.cli("setup", "web", "web-1", "c0ffee04", netns=ok)
        assert done.returncode == 0, done
    assert world.default_route(ok).startswith("default via ") and " dev eth0" in world.default_route(ok)


# --- class 6: a FIFO as the netns ----------------------------------------------------------------------------


def test_a_fifo_netns_never_blocks_the_native_plugin_alone(world: World, tmp_path: Path) -> None:  # noqa: F811
    # The plugin itself, without the manager's checks in front of it: it must not open(2) the FIFO
    # blocking. The subprocess's timeout only catches a hang; the plugin answers at once.
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    code = (
        "from netplugin.plugins.bridge.bridge_plugin import NativeBridgePlugin\n"
        "from netplugin.core.plugin import CallContext\n"
        "from netplugin.core.names import PodRef\n"
        "from netplugin.core.errors import PluginFailed\n"
        f"p = NativeBridgePlugin(state_dir={str(tmp_path)!r})\n"
        f"env = {{'NETPLUGIN_BRIDGE_NAME': 'npbr{world.tag}', 'NETPLUGIN_BRIDGE_SUBNET': '{world.bridge_subnet}'}}\n"
        "for action in ('setup', 'status'):\n"
        f"    ctx = CallContext(netns={str(fifo)!r}, pod=None, timeout=600, env=env, state_dir={str(tmp_path)!r})\n"
        "    try:\n"
        "        getattr(p, action)(PodRef('web', 'web-0', 'c0ffee05'), ctx)\n"
        "    except PluginFailed as e:\n"
        "        print(action, e.message)\n"
    )
    done = world.run([sys.executable, "-c", code], env=dict(os.environ), timeout=60)
    assert done.returncode == 0, done
    lines = done.stdout.decode().splitlines()
    assert len(lines) == 2 and all("is not a network namespace" in line for line in lines), lines


@pytest.mark.parametrize("via", ["shim", "daemon"])
def test_a_fifo_netns_is_refused_quickly_and_never_takes_the_daemons_workers(
    world: World, node: Callable[[str], Node], tmp_path: Path, via: str  # noqa: F811
) -> None:
    n = node("native")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    if via == "shim":
        err = _error(n.cni("ADD", "fifo0", str(fifo)))
        assert err["code"] == 4 and "FIFO" in err["msg"], err
        return
    n.start_daemon()
    # 70 forwarded ADDs at once (more than the daemon's 64 workers), straight to its socket.
    from concurrent.futures import ThreadPoolExecutor

    conf = json.dumps({"cniVersion": "1.0.0", "name": "nphostile", "type": "netplugin-cni",
                       "configFile": str(n.config), "runDir": n.run_dir})

    def add(i: int) -> Any:
        environ = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": f"fifo{i}", "CNI_IFNAME": "eth0",
                   "CNI_NETNS": str(fifo), "CNI_ARGS": f"K8S_POD_NAMESPACE=web;K8S_POD_NAME=f{i}",
                   "NETPLUGIN_CONFIG": str(n.config)}
        return exchange(n.socket, {"v": 1, "op": "cni", "environ": environ, "stdin": conf}, timeout=120)

    with ThreadPoolExecutor(70) as pool:
        answers = list(pool.map(add, range(70)))
    codes = [a["result"]["doc"]["code"] for a in answers if a["ok"]]
    assert codes == [4] * 70, answers[:3]
    health = exchange(n.socket, {"v": 1, "op": "health"}, timeout=10)["result"]
    assert health["in_flight"] == 0 and health["stuck"] == []
    # Every worker is free: a real pod still gets its network.
    pod = world.add_netns(f"np{world.tag}f")
    done = n.cni("ADD", "fifook", pod)
    assert done.returncode == 0, done


# --- class 8: CNI inputs accepted, then failed badly ----------------------------------------------------------


@pytest.mark.parametrize(
    ("ifname", "why"),
    [
        ("eth\u00e9", "printable ASCII"),
        ("e" * 16, "at most 15 bytes"),
        ("\uff25\uff34\uff28\uff10", "printable ASCII"),  # fullwidth ETH0
        ("eth\u00a00", "whitespace"),
    ],
)
def test_a_bad_ifname_is_refused_and_its_del_succeeds(
    world: World, node: Callable[[str], Node], ifname: str, why: str  # noqa: F811
) -> None:
    n = node("bash")
    pod = world.add_netns(f"np{world.tag}i")
    err = _error(n.cni("ADD", "ifname0", pod, ifname=ifname))
    assert err["code"] == 4 and "CNI_IFNAME" in err["msg"] and why in err["msg"], err
    assert n.bridge not in world.links()
    done = n.cni("DEL", "ifname0", pod, ifname=ifname)
    assert done.returncode == 0, done
    assert not list(Path(n.state_dir).glob("pods/*.json")), "nothing recorded"


@pytest.mark.parametrize("plugin", sorted(PLUGINS))
@pytest.mark.parametrize("via", ["shim", "daemon"])
def test_the_add_result_names_the_pod_interfaces_mac(
    world: World, node: Callable[[str], Node], plugin: str, via: str  # noqa: F811
) -> None:
    """Both bridges report the MAC with their setup (native: in its result; bash: the setup document's
    ``mac``), so the daemon enters the netns no second time: the result's MAC is the pod's eth0's."""
    n = node(plugin)
    if via == "daemon":
        n.start_daemon()
    pod = world.add_netns(f"np{world.tag}m")
    done = n.cni("ADD", "podmcontainer", pod)
    assert done.returncode == 0, done
    words = subprocess.run(["nsenter", f"--net={pod}", "ip", "-o", "link", "show", "dev", "eth0"],
                           capture_output=True, text=True).stdout.split()
    assert json.loads(done.stdout)["interfaces"][-1]["mac"] == words[words.index("link/ether") + 1]
    assert n.via() == ["daemon" if via == "daemon" else "local"]
    assert n.cni("DEL", "podmcontainer", pod).returncode == 0
