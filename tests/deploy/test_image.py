"""The DaemonSet image, built here with scripts/build-image.sh and run with podman as the DaemonSet runs it.

* The init container: the image's installer, unprivileged (all capabilities dropped but CHOWN,
  DAC_OVERRIDE, FOWNER; read-only root; no network), copies the plugins, the CNI shim and the modules
  the Python shim needs onto the "node" (test dirs), with the DaemonSet's shim options: the image's
  compiled netplugin-cni (its build stage's; the image itself has no compiler) in cluster mode, with
  the node's socket written in. netplugin-cni-python runs on the host's own /usr/bin/python3.
* The daemon: `netplugin serve` in the image with host network, host PID, privileged, and the host's
  exec/state/run dirs and /run/netns mounted at their own paths. Pods are set up and torn down from
  the host, through the daemon's socket: veths in the pods' namespaces, the daemon's metrics count them.
  The runtime's path, the compiled shim, is run with every Python on the host hidden: with the daemon up
  it is served, with the daemon stopped it answers CNI error 11.

The image build is cached (scripts/build-image.sh keys each step by a hash of its inputs): the first
run on a machine makes the Debian base (about a minute), later ones take about 30 s.
Subnets: a random free /24 of 10.207.0.0/16 (the demo's range, docs/development.md); names np + random hex.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from netplugin.core.defaults import SOCKET_NAME
from netplugin.frontends.cni.native import slots
from tests.support.nettest import free_third_octet, host_veth_name, link_exists
from tests.support.shipped import daemonset
from tests.support.waits import WITHIN, wait_for

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "scripts" / "build-image.sh"
SUITE_RANGE = "10.207.0.0/16"  # shared with the demo (docs/development.md): both pick a /24 no route uses
ULIMITS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]

pytestmark = [
    pytest.mark.image,
    pytest.mark.kernel,
    pytest.mark.skipif(os.geteuid() != 0, reason="runs rootful podman and creates bridges; run as root"),
    pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed (scripts/podman-setup.sh)"),
]


def _run(argv: list[str], timeout: float = 120, **kw: Any) -> subprocess.CompletedProcess[str]:
    if "input" not in kw:
        kw["stdin"] = subprocess.DEVNULL
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)


@pytest.fixture(scope="module")
def image() -> str:
    """The image id of `scripts/build-image.sh` (built, or reused when its inputs are unchanged)."""
    out = _run(["bash", str(BUILD)], timeout=1800)
    assert out.returncode == 0, out.stderr[-4000:]
    image_id, digest = out.stdout.split()
    assert digest.startswith("sha256:") and len(digest) == 71
    return image_id


class Node:
    """A node's dirs under a temp root, a bridge network for its pods, and what runs there."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(mode=0o755)
        self.tag = secrets.token_hex(3)
        self.exec_dir, self.state, self.run_dir = root / "exec", root / "state", root / "run"
        self.cni_bin, self.cni_conf, self.lib, self.etc = (
            root / "cni-bin",
            root / "cni-conf",
            root / "lib",
            root / "etc",
        )
        for d in (self.exec_dir, self.state, self.run_dir, self.cni_bin, self.cni_conf, self.lib, self.etc):
            d.mkdir(mode=0o755)
        self.bridge = f"np{self.tag}im"
        self.subnet = f"10.207.{free_third_octet(SUITE_RANGE)}.0/24"
        self.netns: list[str] = []
        self.containers: list[str] = []
        # The ConfigMap's stand-in; the init container installs it as the node's config file.
        self.config = self.etc / "netplugin.yaml"
        self.configmap = self.etc / "configmap.yaml"
        self.configmap.write_text(
            yaml.safe_dump(
                {
                    "plugin_dir": str(self.exec_dir),
                    "state_dir": str(self.state),
                    "run_dir": str(self.run_dir),
                    "plugin": "bridge",
                    "host": "none",
                    "metrics_address": "127.0.0.1:0",
                    "env": {
                        "NETPLUGIN_BRIDGE_NAME": self.bridge,
                        "NETPLUGIN_BRIDGE_SUBNET": self.subnet,
                        "NETPLUGIN_BRIDGE_IP_FORWARD": "false",  # the host's setting is not ours
                        "NETPLUGIN_BRIDGE_BR_NETFILTER": "false",
                    },
                }
            )
        )

    def add_netns(self) -> str:
        name = f"np{self.tag}-{len(self.netns)}"
        assert _run(["ip", "netns", "add", name]).returncode == 0
        self.netns.append(name)
        return name

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """The host's netplugin CLI (this checkout), which must reach the daemon in the container."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_")}
        env.update(PYTHONPATH=str(REPO), NETPLUGIN_CONFIG=str(self.config), NETPLUGIN_USE_DAEMON="always")
        return _run([sys.executable, "-m", "netplugin", *args], env=env)

    def close(self) -> None:
        if self.containers:
            _run(["podman", "rm", "-f", "-t", "0", *self.containers])
        for ns in self.netns:
            _run(["ip", "netns", "del", ns])
        if link_exists(self.bridge):
            _run(["ip", "link", "del", self.bridge])
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path / "node")
    try:
        yield n
    finally:
        n.close()


def _volume(path: Path, opts: str = "") -> list[str]:
    return ["-v", f"{path}:{path}{':' + opts if opts else ''}"]


def _shim_options() -> list[str]:
    """The DaemonSet init container's options for the compiled shim (paths inside the image)."""
    [init] = daemonset()["spec"]["template"]["spec"]["initContainers"]
    argv = [*init.get("command", []), *init.get("args", [])]
    out = []
    for flag in ("--native-shim", "--shim-fallback"):
        out += [flag, argv[argv.index(flag) + 1]]
    return out


def _init_container(image: str, node: Node) -> subprocess.CompletedProcess[str]:
    """What the DaemonSet's init container runs, with its securityContext."""
    argv = ["podman", "run", "--rm", "--network=none", "--read-only", "--tmpfs", "/tmp", *ULIMITS]
    argv += ["--cap-drop=ALL", "--cap-add=CHOWN,DAC_OVERRIDE,FOWNER", "--security-opt=no-new-privileges"]
    for d in (node.exec_dir, node.cni_bin, node.cni_conf, node.lib, node.etc):
        argv += _volume(d)
    argv += [image, "/bin/bash", "/usr/share/netplugin/scripts/install.sh", "--no-venv"]
    argv += ["--source", "/usr/share/netplugin", "--python", "/usr/bin/python3", "--lib-dir", str(node.lib)]
    argv += ["--exec-dir", str(node.exec_dir), "--cni-bin-dir", str(node.cni_bin), "--cni-conf-dir", str(node.cni_conf)]
    argv += ["--state-dir", str(node.state), "--run-dir", str(node.run_dir)]
    argv += ["--config", str(node.config), "--config-from", str(node.configmap), *_shim_options()]
    return _run(argv, timeout=300)


def _start_daemon(image: str, node: Node) -> str:
    name = f"np-daemon-{node.tag}"
    argv = ["podman", "run", "-d", "--name", name, "--network=host", "--pid=host", "--privileged", *ULIMITS]
    argv += _volume(node.exec_dir, "ro") + _volume(node.state) + _volume(node.run_dir) + _volume(node.etc, "ro")
    argv += ["-v", "/run/netns:/run/netns:rslave"]
    argv += [image, "netplugin", "serve", "--config", str(node.config)]
    os.makedirs("/run/netns", exist_ok=True)
    out = _run(argv)
    assert out.returncode == 0, out.stderr
    node.containers.append(name)
    end = time.monotonic() + 60
    while time.monotonic() < end:
        if node.cli("health").returncode == 0:
            return name
        if _run(["podman", "container", "exists", name]).returncode != 0:
            break
        time.sleep(0.2)
    logs = _run(["podman", "logs", name])
    raise AssertionError(f"the daemon in {name} never answered health:\n{logs.stdout}{logs.stderr}")


def _pythons() -> list[str]:
    """Every Python interpreter on this host's usual paths (their real files)."""
    found = {os.path.realpath(sys.executable)}
    for d in ("/usr/bin", "/usr/local/bin", "/bin"):
        if os.path.isdir(d):
            found |= {os.path.realpath(os.path.join(d, f)) for f in os.listdir(d) if f.startswith("python")}
    return sorted(p for p in found if os.path.isfile(p))


#: runs "$@" in a private mount namespace where each interpreter given after it is /dev/null
_WITHOUT_PYTHON = 'while [ "$1" != -- ]; do mount --bind /dev/null "$1" || exit 99; shift; done; shift; exec "$@"'


def _shim(node: Node, command: str, ns: str, pod: str) -> subprocess.CompletedProcess[str]:
    """A CNI call, as a runtime makes it, to the shim the init container put on the node; every
    Python on the host is hidden from it (a cluster node with its daemon up needs none)."""
    conf = {
        "cniVersion": "1.0.0",
        "name": f"np{node.tag}",
        "type": "netplugin-cni",
        "configFile": str(node.config),  # the daemon's own settings, so it takes the call
        "runDir": str(node.run_dir),
    }
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": ns,
        "CNI_NETNS": f"/run/netns/{ns}",
        "CNI_IFNAME": "eth0",
        "CNI_PATH": str(node.cni_bin),
        "CNI_ARGS": f"K8S_POD_NAMESPACE=default;K8S_POD_NAME={pod}",
    }
    hide = ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", _WITHOUT_PYTHON, "sh", *_pythons()]
    return _run([*hide, "--", str(node.cni_bin / "netplugin-cni")], input=json.dumps(conf), env=env, cwd=node.root)


def _metric(node: Node, name: str, operation_type: str) -> float:
    address = json.loads(node.cli("-o", "json", "health").stdout)["metrics_address"]
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    for line in text.splitlines():
        if line.startswith(f'{name}{{operation_type="{operation_type}"}} '):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} for {operation_type} in:\n{text}")


def test_init_container_puts_plugins_and_a_working_shim_onto_the_node(image: str, node: Node) -> None:
    out = _init_container(image, node)
    assert out.returncode == 0, out.stdout + out.stderr
    for plugin in ("bridge/bridge", "loopback/loopback", "bandwidth/bandwidth", "example.com~audit/audit"):
        exe = node.exec_dir / plugin
        assert exe.is_file() and os.access(exe, os.X_OK), plugin
        assert (exe.stat().st_uid, exe.stat().st_mode & 0o022) == (0, 0)
    for module in ("netplugin", "click", "yaml", "psutil"):
        assert (node.lib / module / "__init__.py").is_file(), module
    conf = json.loads((node.cni_conf / "10-netplugin.conflist").read_text())
    assert conf["plugins"][0] == {"type": "netplugin-cni", "configFile": str(node.config), "runDir": str(node.run_dir),
                                  "capabilities": {"portMappings": True}}
    assert node.config.read_text() == node.configmap.read_text()
    # The runtime's shim is the image's compiled one (an ELF binary, not a script), with this node's
    # socket written in and no fallback (cluster mode); the Python shim runs on the host's
    # interpreter with the modules copied from the image, nothing else.
    shim = node.cni_bin / "netplugin-cni"
    assert shim.read_bytes()[:4] == b"\x7fELF"
    assert (shim.stat().st_uid, shim.stat().st_mode & 0o7777) == (0, 0o755)
    assert slots(str(shim)) == {"socket": str(node.run_dir / SOCKET_NAME), "fallback": ""}
    assert (node.cni_bin / "netplugin-cni-python").read_text().count("exec /usr/bin/python3 -I -S ") == 1
    for exe in (shim, node.cni_bin / "netplugin-cni-python"):
        version = _run([str(exe)], env={"PATH": "/usr/bin:/bin", "CNI_COMMAND": "VERSION"}, cwd=node.root)
        assert version.returncode == 0, version.stderr
        assert "1.0.0" in json.loads(version.stdout)["supportedVersions"]
    # A second run changes nothing (the init container runs at every pod start).
    again = _init_container(image, node)
    assert again.returncode == 0, again.stderr
    assert "install.sh: nothing to do" in again.stdout


def test_the_image_carries_no_compiler(image: str) -> None:
    probe = (
        "import glob, shutil, sys; "
        "sys.exit(any(shutil.which(c) for c in ('cc', 'gcc', 'clang')) or bool(glob.glob('/usr/lib/gcc/*/*/cc1')))"
    )
    out = _run(["podman", "run", "--rm", "--network=none", *ULIMITS, image, "python3", "-c", probe])
    assert out.returncode == 0, out.stdout + out.stderr
    # ... only the compiled shim its build stage made.
    version = _run(
        ["podman", "run", "--rm", "--network=none", *ULIMITS, "-e", "CNI_COMMAND=VERSION", image, _shim_options()[1]]
    )
    assert version.returncode == 0 and "supportedVersions" in version.stdout, version.stdout + version.stderr


def test_daemon_in_the_image_serves_pods_set_up_from_the_host(image: str, node: Node) -> None:
    assert _init_container(image, node).returncode == 0
    early = node.add_netns()  # made before the daemon starts
    name = _start_daemon(image, node)
    late = node.add_netns()  # made after: must reach the container through mount propagation
    health = json.loads(node.cli("-o", "json", "health").stdout)
    assert health["plugin"] == "bridge" and health["plugin_problem"] is None, health

    ips = {}
    for ns in (early, late):
        out = node.cli("-o", "json", "setup", "default", f"pod-{ns}", ns)
        assert out.returncode == 0, out.stderr + _run(["podman", "logs", name]).stderr
        ips[ns] = (
            json.loads(out.stdout)["ip"]
            or json.loads(node.cli("-o", "json", "status", "default", f"pod-{ns}", ns).stdout)["ip"]
        )
        addr = _run(["ip", "netns", "exec", ns, "ip", "-4", "-o", "addr", "show", "dev", "eth0"]).stdout
        assert f"inet {ips[ns]}/24" in addr
        assert link_exists(host_veth_name(ns))
    # The pods reach each other over the bridge the daemon's plugin made on the host.
    ping = _run(["ip", "netns", "exec", early, "ping", "-c", "1", "-W", "5", ips[late]])
    assert ping.returncode == 0, ping.stdout + ping.stderr
    assert _metric(node, "kubelet_network_plugin_operations_total", "set_up_pod") == 2.0  # the daemon did them

    for ns in (early, late):
        out = node.cli("teardown", "default", f"pod-{ns}", ns)
        assert out.returncode == 0, out.stderr
        # the built-in bridge answers with the veth off the network; the kernel deletes it just after
        veth = host_veth_name(ns)
        wait_for(lambda veth=veth: not link_exists(veth), f"{veth} deleted", WITHIN)
    assert _metric(node, "kubelet_network_plugin_operations_total", "tear_down_pod") == 2.0

    # The kubelet's path: the runtime calls the shim on the host (the compiled one the init container
    # installed), with no Python to run: the daemon serves the call.
    add = _shim(node, "ADD", early, "web-0")
    assert add.returncode == 0, add.stdout + add.stderr
    [ip] = [i["address"] for i in json.loads(add.stdout)["ips"]]
    assert ip.startswith(node.subnet.rsplit(".", 1)[0] + ".")
    assert link_exists(host_veth_name(early))
    delete = _shim(node, "DEL", early, "web-0")
    assert delete.returncode == 0, delete.stdout + delete.stderr
    wait_for(lambda: not link_exists(host_veth_name(early)), f"{host_veth_name(early)} deleted", WITHIN)
    assert _metric(node, "kubelet_network_plugin_operations_total", "set_up_pod") == 3.0
    assert _metric(node, "kubelet_network_plugin_operations_total", "tear_down_pod") == 3.0
    assert list((node.state / "pods").glob("*.json")) == []

    # SIGTERM (what the kubelet sends): the daemon drains, removes its socket and exits 0.
    stop = _run(["podman", "stop", "-t", "30", name])
    assert stop.returncode == 0, stop.stderr
    state = _run(["podman", "inspect", "--format", "{{.State.ExitCode}}", name])
    assert state.stdout.strip() == "0"
    assert not (node.run_dir / "netplugin.sock").exists()

    # Cluster mode without its daemon: CNI error 11 (the runtime retries), never a call run alone,
    # and still no Python.
    orphan = _shim(node, "ADD", late, "web-1")
    assert orphan.returncode != 0, orphan.stdout
    err = json.loads(orphan.stdout)
    assert err["code"] == 11 and "cluster mode" in err["msg"] and str(node.run_dir / SOCKET_NAME) in err["msg"], err
    assert not link_exists(host_veth_name(late))
