"""The CNI shim under a real runtime: podman (CNI backend) + the real bridge exec plugin.

Each test builds a private world in a temp dir and points podman at it with ``CONTAINERS_CONF``
(network backend ``cni``, ``cni_plugin_dirs`` = a dir holding only the shim wrapper,
``network_config_dir`` = a dir holding only this test's conflist), so nothing under /etc is read
or written. Names are unique (``np`` + random hex) and the subnet is a free /24 of 10.201.0.0/16.
Everything is removed afterwards, passed or not: containers, the bridge, the temp dir.

Prepare the machine with ``scripts/podman-setup.sh`` (packages and the busybox image).
"""

from __future__ import annotations

import functools
import ipaddress
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from netplugin.core.spares import SPARE_DIR
from netplugin.frontends.cni.native import build_native
from tests.support.nettest import free_third_octet

from .conftest import bridge_shim_conf

REPO = Path(__file__).resolve().parents[3]
BRIDGE = REPO / "exec_plugins" / "bridge" / "bridge"
IMAGE = "localhost/netplugin-busybox"
TEST_RANGE = ipaddress.ip_network("10.201.0.0/16")
CNI_DIRS = ("/usr/lib/cni", "/opt/cni/bin")

pytestmark = pytest.mark.podman


def _run(argv: list[str], env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)


@functools.cache
def podman_unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "podman CNI tests need root"
    for tool in ("podman", "runc", "ip"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (run scripts/podman-setup.sh)"
    if not any(os.path.isdir(d) for d in CNI_DIRS):
        return f"no CNI plugin dir ({' or '.join(CNI_DIRS)}); run scripts/podman-setup.sh"
    if not BRIDGE.is_file():
        return f"{BRIDGE} is missing"
    if _run(["podman", "image", "exists", IMAGE]).returncode != 0:
        return f"image {IMAGE} is missing (run scripts/podman-setup.sh)"
    return None


@pytest.fixture(autouse=True)
def _podman_gate() -> None:
    reason = podman_unavailable_reason()
    if reason:
        pytest.skip(reason)


@dataclass
class PodmanNet:
    """A private podman + CNI world for one test."""

    tmp: Path
    tag: str = field(default_factory=lambda: secrets.token_hex(3))
    containers: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.network = f"np{self.tag}"
        self.bridge = f"npbr{self.tag}"
        self.subnet = ipaddress.ip_network(f"10.201.{free_third_octet(str(TEST_RANGE))}.0/24")
        root = self.tmp / "podman"
        self.bin = root / "cni-bin"
        self.netd = root / "net.d"
        self.exec_dir = root / "exec"
        self.state = root / "state"
        self.run_dir = root / "run"
        self.log = root / "cni.log"
        for d in (self.bin, self.netd, self.exec_dir / "bridge", self.state, self.run_dir):
            d.mkdir(parents=True, exist_ok=True)
        for d in (self.tmp, root, self.exec_dir, self.exec_dir / "bridge"):
            os.chmod(d, 0o755)  # the exec dir chain must not be group/world writable; podman must read
        exe = self.exec_dir / "bridge" / "bridge"
        shutil.copyfile(BRIDGE, exe)
        os.chmod(exe, 0o755)
        # The compiled shim as install.sh installs it, the Python shim as its fallback (no daemon
        # runs here, so every call goes through both: the compiled one's fallback is what runs).
        python_shim = self.tmp / "netplugin-cni-python"
        python_shim.write_text(f"#!/bin/sh\nPYTHONPATH={REPO} exec {sys.executable} -m netplugin.frontends.cni\n")
        os.chmod(python_shim, 0o755)
        build_native(str(self.bin / "netplugin-cni"), socket=str(self.run_dir / "netplugin.sock"),
                     fallback=str(python_shim))  # fmt: skip
        conflist = {
            "cniVersion": "1.0.0",  # podman 4.3's libcni cannot read 1.1.0 results
            "name": self.network,
            "plugins": [bridge_shim_conf(self)],
        }
        (self.netd / f"{self.network}.conflist").write_text(json.dumps(conflist, indent=1))
        conf = root / "containers.conf"
        conf.write_text(
            "[network]\n"
            'network_backend = "cni"\n'
            f'network_config_dir = "{self.netd}"\n'
            f'cni_plugin_dirs = ["{self.bin}"]\n'
        )
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("NETPLUGIN_", "CNI_"))}
        self.env["CONTAINERS_CONF"] = str(conf)

    @property
    def ipam(self) -> Path:
        return self.state / "bridge" / self.bridge

    def ipam_files(self, sub: str) -> list[str]:
        d = self.ipam / sub
        return sorted(os.listdir(d)) if d.is_dir() else []

    def records(self) -> list[Path]:
        """netplugin's durable pod records (netplugin.store.state) in this network's state dir."""
        return sorted((self.state / "pods").glob("*.json"))

    def podman(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = _run(["podman", *args], env=self.env)
        if check:
            assert done.returncode == 0, f"podman {' '.join(args)}: {done.stderr}\nshim log:\n{self.log_text()}"
        return done

    def log_text(self) -> str:
        return self.log.read_text() if self.log.exists() else "(no shim log)"

    def log_entries(self) -> list[dict[str, object]]:
        return [json.loads(line) for line in self.log_text().splitlines() if line.startswith("{")]

    def start(self, name: str) -> tuple[str, float]:
        """Start a container on the network; (container id, seconds `podman run -d` took)."""
        self.containers.append(name)
        t0 = time.perf_counter()
        done = self.podman(
            "--runtime", "runc", "run", "-d", "--name", name,
            "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
            "--cap-add", "NET_RAW", "--network", self.network,
            IMAGE, "sleep", "300",
        )  # fmt: skip
        return done.stdout.strip(), time.perf_counter() - t0

    def addr_in(self, name: str) -> str:
        out = self.podman("exec", name, "ip", "-4", "-o", "addr", "show", "dev", "eth0").stdout
        words = out.split()
        return words[words.index("inet") + 1]

    def close(self) -> None:
        if self.containers:
            _run(["podman", "rm", "-f", "-t", "0", *self.containers], env=self.env)
        if os.path.exists(f"/sys/class/net/{self.bridge}"):
            _run(["ip", "link", "del", self.bridge])


@pytest.fixture
def pnet(tmp_path: Path) -> Iterator[PodmanNet]:
    net = PodmanNet(tmp_path)
    try:
        yield net
    finally:
        net.close()


def test_two_containers_get_bridge_addresses_and_reach_each_other(pnet: PodmanNet) -> None:
    a = f"{pnet.network}a"
    b = f"{pnet.network}_B"  # not a DNS-1123 name: the shim derives the pod name from the id
    id_a, secs_a = pnet.start(a)
    id_b, secs_b = pnet.start(b)
    print(f"podman run -d with the shim: {secs_a:.3f}s (first, runs init), {secs_b:.3f}s")

    # The address inside each container is the one the bridge plugin's IPAM recorded for it.
    cidr_a, cidr_b = pnet.addr_in(a), pnet.addr_in(b)
    rec_a = (pnet.ipam / "pods" / id_a).read_text().split()
    rec_b = (pnet.ipam / "pods" / id_b).read_text().split()
    assert rec_a == [cidr_a, "default", a]
    assert rec_b == [cidr_b, "default", f"cni-{id_b[:12]}"]
    ip_a, ip_b = (str(ipaddress.ip_interface(c).ip) for c in (cidr_a, cidr_b))
    assert {ip_a, ip_b} <= {str(h) for h in pnet.subnet.hosts()}
    assert pnet.ipam_files("ips") == sorted([ip_a, ip_b])

    # podman took the shim's result: same address, prefix, gateway and the MAC of eth0.
    info = json.loads(pnet.podman("inspect", a, "--format", "{{json .NetworkSettings.Networks}}").stdout)
    net_a = info[pnet.network]
    assert net_a["IPAddress"] == ip_a
    assert net_a["IPPrefixLen"] == pnet.subnet.prefixlen
    assert net_a["Gateway"] == str(pnet.subnet.network_address + 1)
    mac = pnet.podman("exec", a, "cat", "/sys/class/net/eth0/address").stdout.strip()
    assert net_a["MacAddress"] == mac

    # netplugin's own pod records and the network's attachment index know both containers.
    records = {json.loads(f.read_text())["infra_id"]: json.loads(f.read_text()) for f in pnet.records()}
    assert {cid: (r["state"], r["ip"]) for cid, r in records.items()} == {
        id_a: ("ready", ip_a),
        id_b: ("ready", ip_b),
    }
    assert sorted(os.listdir(pnet.state / "cni" / pnet.network)) == sorted([f"{id_a}:eth0.json", f"{id_b}:eth0.json"])

    pnet.podman("exec", a, "ping", "-c", "2", "-W", "3", ip_b)
    pnet.podman("exec", b, "ping", "-c", "2", "-W", "3", ip_a)

    pnet.podman("rm", "-f", "-t", "0", a, b)
    pnet.containers.clear()

    # Teardown ran for both (each DEL reached the plugin and succeeded) and freed everything.
    dels = [e for e in pnet.log_entries() if e["command"] == "DEL"]
    assert {e["containerID"] for e in dels} >= {id_a, id_b}
    assert all(e["result"] == "ok" for e in dels), dels
    assert pnet.ipam_files("ips") == []
    assert pnet.ipam_files("pods") == []
    assert pnet.records() == []
    assert [n for n in os.listdir(pnet.state / "cni" / pnet.network) if n != SPARE_DIR] == []
    ports = _run(["ip", "-o", "link", "show", "master", pnet.bridge]).stdout.strip()
    assert ports == "", f"host veths left on {pnet.bridge}: {ports}"
    adds = [e for e in pnet.log_entries() if e["command"] == "ADD"]
    assert [e["result"] for e in adds] == ["ok", "ok"]
    assert {e["args"] for e in adds} == {f"IgnoreUnknown=1;K8S_POD_NAME={a}", f"IgnoreUnknown=1;K8S_POD_NAME={b}"}


def test_restart_gets_a_fresh_netns_and_keeps_working(pnet: PodmanNet) -> None:
    a = f"{pnet.network}r"
    cid, _ = pnet.start(a)
    first = pnet.addr_in(a)
    pnet.podman("restart", "-t", "0", a)
    second = pnet.addr_in(a)
    # podman DELs with the old netns and ADDs with a new one; exactly one address stays allocated.
    assert pnet.ipam_files("pods") == [cid]
    assert pnet.ipam_files("ips") == [str(ipaddress.ip_interface(second).ip)]
    cmds = [(e["command"], e["netns"]) for e in pnet.log_entries() if e["command"] in ("ADD", "DEL")]
    assert [c for c, _ in cmds] == ["ADD", "DEL", "ADD"]
    assert cmds[0][1] == cmds[1][1] != cmds[2][1]
    assert ipaddress.ip_interface(first).network == ipaddress.ip_interface(second).network == pnet.subnet
    gateway = str(pnet.subnet.network_address + 1)
    pnet.podman("exec", a, "ping", "-c", "1", "-W", "3", gateway)


def test_failed_add_is_reported_by_podman_and_cleaned_up(pnet: PodmanNet) -> None:
    # A subnet the bridge plugin rejects: setup fails, the shim reports it, podman DELs.
    conflist = pnet.netd / f"{pnet.network}.conflist"
    doc = json.loads(conflist.read_text())
    doc["plugins"][0]["env"]["NETPLUGIN_BRIDGE_SUBNET"] = "10.201.0.1/24"
    conflist.write_text(json.dumps(doc))
    name = f"{pnet.network}f"
    pnet.containers.append(name)
    done = pnet.podman(
        "--runtime", "runc", "run", "-d", "--name", name,
        "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
        "--network", pnet.network, IMAGE, "sleep", "300",
        check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert "host bits are set" in done.stderr, done.stderr
    entries = pnet.log_entries()
    assert entries[0]["command"] == "ADD"
    assert isinstance(entries[0]["result"], dict) and entries[0]["result"]["code"] == 999
    assert any(e["command"] == "DEL" for e in entries[1:])
