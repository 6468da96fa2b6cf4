"""The CNI shim with the real bridge exec plugin and real network namespaces, without a runtime.

Runs where podman is missing but root is available. Namespaces are ``np-<hex>-<i>``, the bridge
``npbr<hex>``, the subnet a free /24 of 10.201.0.0/16 (the CNI range); all removed afterwards.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from netplugin.core.spares import SPARE_DIR
from netplugin.frontends.cni.result import link_mac
from tests.support.nettest import free_third_octet

from .test_podman import BRIDGE, TEST_RANGE

pytestmark = pytest.mark.kernel


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=60)


@pytest.fixture(autouse=True)
def _gate() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces, veths, bridges)")
    if shutil.which("ip") is None:
        pytest.skip("iproute2 `ip` is not installed")


@pytest.fixture
def netns() -> Iterator[Any]:
    tag = secrets.token_hex(3)
    made: list[str] = []

    def make(i: int) -> str:
        name = f"np-{tag}-{i}"
        done = _run("ip", "netns", "add", name)
        assert done.returncode == 0, done.stderr
        made.append(name)
        return name

    make.tag = tag  # type: ignore[attr-defined]
    try:
        yield make
    finally:
        for name in made:
            _run("ip", "netns", "del", name)


def _mac_in(ns: str, ifname: str) -> str:
    words = _run("ip", "-n", ns, "-o", "link", "show", "dev", ifname).stdout.split()
    return words[words.index("link/ether") + 1]


def test_link_mac_reads_inside_the_namespace(netns: Any, tmp_path: Path) -> None:
    ns = netns(0)
    # a veth pair made inside the namespace (both ends stay there; the host is untouched)
    assert _run("ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", "eth1").returncode == 0
    path = f"/run/netns/{ns}"
    assert link_mac(path, "eth0") == _mac_in(ns, "eth0")
    # eth0 of the host (if any) is not what is asked for: a missing link inside is None
    assert link_mac(path, "eth9") is None
    assert link_mac(str(tmp_path / "missing"), "eth0") is None
    not_a_netns = tmp_path / "file"
    not_a_netns.write_text("")
    assert link_mac(str(not_a_netns), "eth0") is None


def test_shim_with_the_bridge_plugin(netns: Any, shim: Any, plugin_dir: Any) -> None:
    tag = netns.tag
    bridge = f"npbr{tag}"
    subnet = ipaddress.ip_network(f"10.201.{free_third_octet(str(TEST_RANGE))}.0/24")
    plugin_dir.install("bridge", script=BRIDGE)
    shim.conf.update(
        plugin="bridge",
        env={
            "NETPLUGIN_BRIDGE_NAME": bridge,
            "NETPLUGIN_BRIDGE_SUBNET": str(subnet),
            "NETPLUGIN_BRIDGE_IP_FORWARD": "false",
            "NETPLUGIN_BRIDGE_BR_NETFILTER": "false",
        },
    )
    ipam = Path(shim.conf["stateDir"]) / "bridge" / bridge
    try:
        pods = []
        for i in (1, 2):
            ns = netns(i)
            cid = f"{tag}infra{i}"
            done = shim.run("ADD", container_id=cid, netns=f"/run/netns/{ns}", args=f"K8S_POD_NAME=pod-{i}")
            assert done.returncode == 0, done
            result = done.doc
            cidr = result["ips"][0]["address"]
            # the result is what the plugin configured and recorded
            assert (ipam / "pods" / cid).read_text().split() == [cidr, "default", f"pod-{i}"]
            inside = _run("ip", "-n", ns, "-4", "-o", "addr", "show", "dev", "eth0").stdout.split()
            assert inside[inside.index("inet") + 1] == cidr
            # chainable: the host veth (no sandbox) with its MAC first, the pod interface the IPs point at
            host = result["interfaces"][0]["name"]
            host_mac = Path(f"/sys/class/net/{host}/address").read_text().strip()
            assert result["interfaces"] == [
                {"name": host, "mac": host_mac},
                {"name": "eth0", "mac": _mac_in(ns, "eth0"), "sandbox": f"/run/netns/{ns}"},
            ]
            assert host in _run("ip", "-o", "link", "show", "master", bridge).stdout
            assert result["ips"][0]["interface"] == 1
            assert result["ips"][0]["gateway"] == str(subnet.network_address + 1)
            pods.append((ns, cid, str(ipaddress.ip_interface(cidr).ip)))

        if shutil.which("ping"):
            (ns1, _, _), (_, _, ip2) = pods
            ping = _run("ip", "netns", "exec", ns1, "ping", "-c", "1", "-W", "3", ip2)
            assert ping.returncode == 0, ping.stdout + ping.stderr

        ns1, cid1, _ = pods[0]
        state = Path(shim.conf["stateDir"]) / "cni"
        record = state / shim.conf["name"] / f"{cid1}:eth0.json"
        ino, index = record.stat().st_ino, state / ".netns"
        assert record.stat().st_nlink == 2 and len(os.listdir(index)) == 2  # each netns indexed by a link
        assert shim.run("DEL", container_id=cid1, netns=f"/run/netns/{ns1}").returncode == 0
        # its index link went with it, and the record's inode became a spare (netplugin.core.spares)
        assert len(os.listdir(index)) == 1 and not record.exists()
        assert ino in {p.stat().st_ino for p in (record.parent / SPARE_DIR).iterdir()}
        assert shim.run("DEL", container_id=cid1, netns=f"/run/netns/{ns1}").returncode == 0
        # DEL after the namespace is gone, and without one: still releases the address
        ns2, cid2, ip2 = pods[1]
        _run("ip", "netns", "del", ns2)
        assert shim.run("DEL", container_id=cid2, netns=f"/run/netns/{ns2}").returncode == 0
        assert shim.run("DEL", container_id=cid2, netns="").returncode == 0
        assert sorted(os.listdir(ipam / "ips")) == []
        assert sorted(os.listdir(ipam / "pods")) == []
        assert _run("ip", "-o", "link", "show", "master", bridge).stdout.strip() == ""
    finally:
        if os.path.exists(f"/sys/class/net/{bridge}"):
            _run("ip", "link", "del", bridge)
