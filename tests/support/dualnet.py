"""Dual-stack test networks for both bridge plugins (issue 11).

A :class:`DualNet` is a :class:`bridgenet.BridgeNet` whose bridge has an IPv4 subnet of
10.205.0.0/16 (a random free /24, reserved for these suites in docs/development.md) and the IPv6 subnet
``fd00:10:205:<same third octet>::/<v6_prefixlen>`` (fd00:10:205::/48 is reserved with it), so
two runs never share either. Traffic checks use a TCP server listening on ``::`` for both
families, started inside the pod's netns, and a client run there too.
"""

from __future__ import annotations

import ipaddress
import subprocess
from pathlib import Path

from tests.support.bridgenet import BridgeNet, Pod
from tests.support.nettest import free_third_octet

__all__ = ["DUAL_RANGE", "DualNet", "pod_addrs", "pod_default_routes"]

DUAL_RANGE = ipaddress.ip_network("10.205.0.0/16")
PORT = 8081

# Answers every connection, IPv4 or IPv6, with its name.
_SERVER = """
import socket, sys
s = socket.socket(socket.AF_INET6)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
s.bind(("::", int(sys.argv[2])))
s.listen(128)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(sys.argv[1].encode())
    c.close()
"""

_CLIENT = """
import json, socket, sys
out = {}
for addr in sys.argv[2:]:
    try:
        with socket.create_connection((addr, int(sys.argv[1])), timeout=3) as c:
            out[addr] = c.recv(256).decode()
    except OSError as e:
        out[addr] = "error: %s" % e
print(json.dumps(out))
"""


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def pod_addrs(pod: Pod, ifname: str = "eth0") -> dict[int, list[str]]:
    """``{4: [...], 6: [...]}``: the global addresses (CIDR form) on the pod's interface, read with ip."""
    out: dict[int, list[str]] = {4: [], 6: []}
    for line in _run(["ip", "-n", pod.netns, "-o", "addr", "show", "dev", ifname]).stdout.splitlines():
        words = line.split()
        for kind, version in (("inet", 4), ("inet6", 6)):
            if kind in words and "global" in words:
                out[version].append(words[words.index(kind) + 1])
    return out


def pod_default_routes(pod: Pod) -> dict[int, str]:
    """``{4: "default via ...", 6: "default via ..."}`` inside the pod."""
    out = {}
    for version in (4, 6):
        r = _run(["ip", "-n", pod.netns, f"-{version}", "route", "show", "default"])
        out[version] = " ".join(r.stdout.split()[:5])
    return out


class DualNet(BridgeNet):
    """A BridgeNet with SUBNET "10.205.X.0/<prefixlen>,fd00:10:205:X::/<v6_prefixlen>"."""

    server_script = _SERVER  # listens on :: for both families
    client_script = _CLIENT
    port = PORT

    v6_prefixlen = 64

    def __post_init__(self) -> None:
        super().__post_init__()
        third = free_third_octet(str(DUAL_RANGE))
        self.subnet = ipaddress.ip_network(f"10.205.{third}.0/{self.prefixlen}")
        self.gateway = str(self.subnet.network_address + 1)
        self.subnet6 = ipaddress.ip_network(f"fd00:10:205:{third:x}::/{self.v6_prefixlen}")
        self.gateway6 = str(self.subnet6.network_address + 1)
        self.env["NETPLUGIN_BRIDGE_SUBNET"] = f"{self.subnet},{self.subnet6}"

    @property
    def ipam6(self) -> Path:
        return self.ipam / "ipv6"

    def ipam6_files(self, sub: str) -> list[str]:
        d = self.ipam6 / sub
        return sorted(p.name for p in d.iterdir()) if d.is_dir() else []

    def assert_mesh(self, pods: list[Pod]) -> None:
        """Every pod reaches every other over IPv4 and IPv6 (TCP), and the host reaches every pod."""
        addrs = {p.name: [a.split("/")[0] for a in pod_addrs(p)[4] + pod_addrs(p)[6]] for p in pods}
        for p in pods:
            assert len(addrs[p.name]) == 2, addrs
            self.serve(p)
        for src in pods:
            want = {a: d.name for d in pods if d is not src for a in addrs[d.name]}
            assert self.connect_from(src, list(want)) == want, f"from {src.name}"
        import socket

        for p in pods:
            for a in addrs[p.name]:
                with socket.create_connection((a, PORT), timeout=3) as c:
                    assert c.recv(256).decode() == p.name
