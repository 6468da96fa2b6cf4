"""A node installed as shipped serves every containerd pod through its daemon (issue 17, proof a).

``scripts/install.sh`` (venv mode, Debian's python3, this tree's wheel) installs into temp dirs, every
directory an option, ``--config`` included, and no ``--plugin``: the chain is the shipped one (the
bridge, then the hostport member); the plugins' env is chosen with ``--plugin-env`` (a bridge name
and a free /24 of the CNI test range). The node is a netns of the test's own (the hostport member's
nftables table, the bridge and the pods live there), with an underlay host on its eth0. The
daemon is then started with exactly the ``Environment=`` and ``ExecStart=`` of the unit file the
installer wrote, and reloaded with its ``ExecReload=``. A private containerd (the harness of
``tests/frontends/cni/containerd.py``) whose CNI dirs are the installed ones runs pod sandboxes over
CRI: every ADD and DEL is counted by the daemon's ``kubelet_network_plugin_operations_total`` and logged by
the shim ``via: daemon``; with the daemon stopped a pod still starts (the shim alone), and after a
restart the daemon serves again. One key is added to the installed config by hand, as a user
would: ``metrics_address: 127.0.0.1:0``, because other suites may hold the default port.

The tests run in file order on one installed node; the fixture removes every sandbox, the bridge
and containerd, passed or not. :func:`installed_node` makes such a node for the sibling suites,
optionally in a node netns of the test's own (daemon and containerd entered with ``nsenter --net``)
and with a chain installed through ``--config-from``.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from netplugin.frontends.wire.client import NotSent, exchange
from tests.frontends.cni.containerd import NETNS_DIR, Containerd, PortMap, Sandbox, unavailable_reason
from tests.support.gopeers import require
from tests.support.nettest import free_third_octet, ip_in, kernel_gate, link_exists, underlay_netns
from tests.support.portcheck import Server, ask
from tests.support.shipped import INSTALL, unit_command

SYSTEM_PYTHON = Path("/usr/bin/python3")
TEST_RANGE = "10.201.0.0/16"  # the CNI suites' range (docs/development.md)

pytestmark = [
    pytest.mark.containerd,
    pytest.mark.kernel,
    pytest.mark.skipif(not SYSTEM_PYTHON.exists(), reason="no system interpreter /usr/bin/python3 (not Debian)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="installs root-owned files and runs containerd; run as root"),
]


class InstalledNode:
    """The node's dirs, its daemon started from the installed unit, and its containerd."""

    def __init__(
        self, root: Path, wheel: Path, netns: str | None = None, plugins: Sequence[str] = (), dual_stack: bool = False
    ) -> None:
        self.root, self.wheel = root, wheel
        #: the node's network namespace (daemon, containerd and the bridge live there), or the machine's
        self.netns = netns
        #: a chain installed with ``--config-from`` (else none given: the shipped chain)
        self.plugins = tuple(plugins)
        self.tag = secrets.token_hex(3)
        self.bridge = f"np{self.tag}in"
        third = free_third_octet(TEST_RANGE)
        self.subnet = f"10.201.{third}.0/24"
        #: a dual-stack node's IPv6 pod subnet (the /64 of fd00:10:201::/48 named after the /24), else None
        self.subnet6 = f"fd00:10:201:{third:x}::/64" if dual_stack else None
        d = {k: root / k for k in ("prefix", "bin", "man", "systemd", "exec", "cni-bin", "cni-conf", "state", "run")}
        self.dirs = d
        self.config = root / "etc" / "netplugin" / "netplugin.yaml"
        self.log = root / "cni.log"
        self.daemon: subprocess.Popen[bytes] | None = None
        self.ctd: Containerd | None = None
        self.sandboxes: list[str] = []
        #: an underlay host's netns beside the node (None: no host)
        self.host: str | None = None

    def install(self) -> subprocess.CompletedProcess[str]:
        d = self.dirs
        argv = ["bash", str(INSTALL), "--python", str(SYSTEM_PYTHON), "--wheel", str(self.wheel)]
        for flag, key in (
            ("--prefix", "prefix"),
            ("--bin-dir", "bin"),
            ("--man-dir", "man"),
            ("--systemd-dir", "systemd"),
            ("--exec-dir", "exec"),
            ("--cni-bin-dir", "cni-bin"),
            ("--cni-conf-dir", "cni-conf"),
            ("--state-dir", "state"),
            ("--run-dir", "run"),
        ):
            argv += [flag, str(d[key])]
        argv += ["--config", str(self.config), "--cni-log-file", str(self.log)]
        env_pairs = {
            "NETPLUGIN_BRIDGE_NAME": self.bridge,
            "NETPLUGIN_BRIDGE_SUBNET": ",".join(n for n in (self.subnet, self.subnet6) if n),
            "NETPLUGIN_BRIDGE_IP_FORWARD": "false",  # the host's sysctl is not ours
            "NETPLUGIN_BRIDGE_BR_NETFILTER": "false",
        }
        if self.plugins:
            source = self.root / "config-from.yaml"
            lines = [f"plugin_dir: {d['exec']}", f"state_dir: {d['state']}", f"run_dir: {d['run']}"]
            lines += [f"plugins: [{', '.join(self.plugins)}]", "env:"]
            lines += [f'  {k}: "{v}"' for k, v in env_pairs.items()]
            source.write_text("\n".join(lines) + "\n")
            argv += ["--config-from", str(source)]
        else:  # the chain as shipped: no --plugin
            for k, v in env_pairs.items():
                argv += ["--plugin-env", f"{k}={v}"]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("NETPLUGIN_", "PYTHON"))}
        return subprocess.run(argv, capture_output=True, text=True, timeout=900, env=env, stdin=subprocess.DEVNULL)

    @property
    def unit(self) -> Path:
        return self.dirs["systemd"] / "netplugin.service"

    @property
    def socket(self) -> str:
        return str(self.dirs["run"] / "netplugin.sock")

    def start_daemon(self) -> None:
        """Exactly as systemd would: the unit's ExecStart= with its Environment= and nothing else, but
        ``JOURNAL_STREAM`` naming its log file, as systemd names the journal's stream (journal-style lines)."""
        argv, env, _ = unit_command(self.unit)
        log = open(self.root / "daemon.log", "ab")  # noqa: SIM115 -- the daemon writes it until it exits
        st = os.fstat(log.fileno())
        env = {**env, "JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        argv = [*self.inside(), *argv]
        self.daemon = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + 60
        while self.health() is None:
            if self.daemon.poll() is not None or time.monotonic() > deadline:
                raise AssertionError((self.root / "daemon.log").read_text()[-3000:])
            time.sleep(0.05)

    def reload_daemon(self) -> None:
        """The unit's ExecReload= with $MAINPID, then wait for the reload to be done (reloads counted)."""
        assert self.daemon is not None
        before = (self.health() or {}).get("reloads", 0)
        _, env, reload = unit_command(self.unit)
        argv = [str(self.daemon.pid) if a == "$MAINPID" else a for a in reload]
        assert subprocess.run(argv, env=env, timeout=30, check=False).returncode == 0
        deadline = time.monotonic() + 30
        while (self.health() or {}).get("reloads", 0) <= before:
            assert time.monotonic() < deadline, "the daemon did not reload"
            time.sleep(0.05)

    def stop_daemon(self) -> None:
        if self.daemon is not None and self.daemon.poll() is None:
            self.daemon.send_signal(signal.SIGTERM)
            assert self.daemon.wait(60) == 0
        self.daemon = None

    def health(self) -> dict[str, Any] | None:
        try:
            answer = exchange(self.socket, {"v": 1, "op": "health"}, timeout=10)
        except NotSent:
            return None
        return answer["result"] if answer.get("ok") else None

    def inside(self) -> list[str]:
        """The prefix that enters the node's netns as containerd is entered (a bare ``nsenter --net``)."""
        return ["nsenter", f"--net={NETNS_DIR}/{self.netns}"] if self.netns else []

    def metrics(self, series: str, label: str) -> dict[str, float]:
        """``series``' samples by the value of ``label``, from the daemon's /metrics (scraped in its netns)."""
        health = self.health()
        assert health is not None
        url = f"http://{health['metrics_address']}/metrics"
        if self.netns:
            scrape = (
                "import sys, urllib.request as u; sys.stdout.write(u.urlopen(sys.argv[1], timeout=10).read().decode())"
            )
            argv = [*self.inside(), str(SYSTEM_PYTHON), "-c", scrape, url]
            text = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout
        else:
            with urllib.request.urlopen(url, timeout=10) as resp:
                text = resp.read().decode()
        out = {}
        for line in text.splitlines():
            if line.startswith(series + "{"):
                value = line.split(f'{label}="', 1)[1].split('"', 1)[0]
                out[value] = float(line.rsplit(" ", 1)[1])
        return out

    def operations(self) -> dict[str, float]:
        return self.metrics("kubelet_network_plugin_operations_total", "operation_type")

    def run_pod(self, name: str, ports: Sequence[PortMap] = ()) -> Sandbox:
        assert self.ctd is not None
        sb = self.ctd.run_pod("np-inst", f"{name}-{self.tag}", str(uuid.uuid4()), ports=ports)
        self.sandboxes.append(sb.id)
        return sb

    def remove_pods(self) -> None:
        assert self.ctd is not None
        for sid in self.sandboxes:
            self.ctd.stop_remove(sid)
        self.sandboxes.clear()

    def entries(self) -> list[dict[str, Any]]:
        """The shim's log of ADD, DEL and CHECK (not the STATUS containerd 2 sends on every CRI Status)."""
        if not self.log.exists():
            return []
        lines = [json.loads(line) for line in self.log.read_text().splitlines() if line.startswith("{")]
        return [e for e in lines if e["command"] != "STATUS"]

    def doctor(self, *args: str) -> subprocess.CompletedProcess[str]:
        # in the node's netns, with its own /sys (ip netns exec): the checks read the node's kernel
        inside = ["ip", "netns", "exec", self.netns] if self.netns else []
        argv = [*inside, str(self.dirs["prefix"] / "bin" / "netplugin"), "--config", str(self.config), "-o", "json",
                "doctor"]  # fmt: skip
        argv += ["--cni-conf-dir", str(self.dirs["cni-conf"]), "--cni-bin-dir", str(self.dirs["cni-bin"]), *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=dict(os.environ))

    def close(self) -> None:
        if self.ctd is not None:
            for sid in self.sandboxes:
                self.ctd.stop_remove(sid, check=False)
            self.ctd.close()
        if self.daemon is not None and self.daemon.poll() is None:
            self.daemon.send_signal(signal.SIGTERM)
            self.daemon.wait(60)
        if not self.netns and link_exists(self.bridge):  # a node netns takes its bridge with it
            subprocess.run(["ip", "link", "del", self.bridge], check=False, timeout=30)


#: the rows of every installed-node suite: Debian's containerd 1.6, and containerd 2 from the peer build
CONTAINERD_ROWS = {"params": ["1.6", "2"], "ids": ["containerd1.6", "containerd2"]}


@contextmanager
def installed_node(
    containerd: str, tmp_path_factory: pytest.TempPathFactory, wheel: Path, **kw: Any
) -> Iterator[InstalledNode]:
    """An installed node (``kw``: :class:`InstalledNode`'s netns, plugins and dual_stack) with its containerd up."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    # containerd 2 from the peer build: its own shim, Debian's runc
    peers = require("containerd", "ctr", "containerd-shim-runc-v2", "cni/loopback") if containerd == "2" else None
    n = InstalledNode(tmp_path_factory.mktemp("installed"), wheel, **kw)
    try:
        done = n.install()
        assert done.returncode == 0, done.stdout + done.stderr
        with open(n.config, "a") as f:
            f.write("metrics_address: 127.0.0.1:0\n")  # a user's own key (see the module docstring)
        n.ctd = Containerd(
            n.root / "containerd",
            None,
            cni_bin_dir=n.dirs["cni-bin"],
            cni_conf_dir=n.dirs["cni-conf"],
            peers=peers,
            netns=n.netns,
        )
        n.ctd.start()
        n.ctd.wait_network("netplugin")
        yield n
    finally:
        n.close()


#: the node's and the underlay host's addresses (inside netns of the test's own)
NODE_IP, HOST_IP = "10.206.0.71", "10.206.0.72"


@contextmanager
def node_and_host(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """(the node's netns, an underlay host's netns on its eth0), both the test's own."""
    kernel_gate(request)
    with underlay_netns("i", [f"{NODE_IP}/24"]) as ns:
        host = f"{ns}h"
        subprocess.run(["ip", "netns", "add", host], check=True)
        try:
            ip_in(ns, "link", "set", "eth1", "netns", host)
            ip_in(host, "addr", "add", f"{HOST_IP}/24", "dev", "eth1")
            ip_in(host, "link", "set", "eth1", "up")
            ip_in(host, "link", "set", "lo", "up")
            subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.ip_forward=1"], check=True)
            yield ns, host
        finally:
            subprocess.run(["ip", "netns", "del", host], check=False)


@pytest.fixture(scope="module", **CONTAINERD_ROWS)
def node(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, dists: dict[str, Path]
) -> Iterator[InstalledNode]:
    with node_and_host(request) as (ns, host), installed_node(request.param, tmp_path_factory, dists["wheel"],
                                                              netns=ns) as n:  # fmt: skip
        n.host = host
        yield n


def _ping(sb: Sandbox, ip: str) -> int:
    done = subprocess.run(
        ["ip", "netns", "exec", sb.netns_name, "ping", "-c", "1", "-W", "3", ip], capture_output=True, timeout=30
    )
    return done.returncode


def test_the_unit_and_conflist_are_as_installed(node: InstalledNode) -> None:
    argv, env, reload = unit_command(node.unit)
    assert argv == [str(node.dirs["prefix"] / "bin" / "netplugin"), "serve", "--config", str(node.config)]
    assert not [k for k in env if k.startswith("NETPLUGIN_")]
    assert reload == ["/bin/kill", "-HUP", "$MAINPID"]
    conflist = json.loads((node.dirs["cni-conf"] / "10-netplugin.conflist").read_text())
    [entry] = conflist["plugins"]
    assert entry == {
        "type": "netplugin-cni",
        "configFile": str(node.config),
        "runDir": str(node.dirs["run"]),
        "logFile": str(node.log),
        "capabilities": {"portMappings": True},
    }


def test_every_add_and_del_is_served_by_the_daemon(node: InstalledNode) -> None:
    node.start_daemon()
    sbs = [node.run_pod(f"web-{i}") for i in range(3)]
    assert len({sb.ip for sb in sbs}) == 3 and all(sb.ip.startswith(node.subnet.rsplit(".", 1)[0]) for sb in sbs)
    assert _ping(sbs[0], sbs[1].ip) == 0
    node.remove_pods()
    entries = node.entries()
    adds = [e for e in entries if e["command"] == "ADD"]
    dels = [e for e in entries if e["command"] == "DEL"]
    assert len(adds) == 3 and len(dels) >= 3
    assert [(e["via"], e["result"]) for e in entries] == [("daemon", "ok")] * len(entries), entries
    ops = node.operations()
    assert (ops["set_up_pod"], ops["tear_down_pod"]) == (len(adds), len(dels))
    # The node as installed passes every check of `netplugin doctor`.
    doc = node.doctor()
    assert doc.returncode == 0, doc.stdout + doc.stderr
    assert all(c["ok"] for c in json.loads(doc.stdout)["checks"])


def test_without_the_daemon_a_pod_still_starts_and_after_a_restart_it_serves_again(node: InstalledNode) -> None:
    seen = len(node.entries())
    node.stop_daemon()
    alone = node.run_pod("alone")
    assert alone.ip.startswith(node.subnet.rsplit(".", 1)[0])
    [entry] = node.entries()[seen:]
    assert (entry["command"], entry["via"], entry["result"]) == ("ADD", "local", "ok")
    assert node.socket in entry["daemon"]  # why: no daemon answered at the socket
    doc = node.doctor()
    assert doc.returncode == 7
    [daemon] = [c for c in json.loads(doc.stdout)["checks"] if c["name"] == "daemon"]
    assert not daemon["ok"] and "no daemon answers" in daemon["problem"]

    node.start_daemon()
    again = node.run_pod("again")
    assert _ping(again, alone.ip) == 0
    node.remove_pods()
    later = node.entries()[seen + 1 :]
    assert later and {e["via"] for e in later} == {"daemon"}, later
    ops = node.operations()  # a fresh daemon: it counts what it served since its start
    assert ops["set_up_pod"] == 1 and ops["tear_down_pod"] == len([e for e in later if e["command"] == "DEL"])


def test_an_edited_file_takes_effect_when_the_daemon_takes_it(node: InstalledNode) -> None:
    text = node.config.read_text()
    line = f"NETPLUGIN_BRIDGE_SUBNET: {node.subnet}"
    assert line in text
    node.config.write_text(text.replace(line, line + '\n  NETPLUGIN_BRIDGE_MTU: "1360"'))
    seen = len(node.entries())
    before = node.run_pod("edited")
    # The daemon's settings are the node's: the call it runs builds on the file as it last took it.
    assert [e["via"] for e in node.entries()[seen:]] == ["daemon"], [e.get("daemon") for e in node.entries()[seen:]]
    node.reload_daemon()
    health = node.health()
    assert health is not None and health["config"]["env"]["NETPLUGIN_BRIDGE_MTU"] == "1360"
    assert health["settings"].startswith("settings changed (env)"), health["settings"]
    seen = len(node.entries())
    after = node.run_pod("reloaded")
    assert [e["via"] for e in node.entries()[seen:]] == ["daemon"]
    for sb, edited in ((before, False), (after, True)):
        mtu = subprocess.run(
            ["ip", "netns", "exec", sb.netns_name, "cat", "/sys/class/net/eth0/mtu"], capture_output=True, text=True
        )
        assert (mtu.stdout.strip() == "1360") is edited, sb
    node.remove_pods()


def test_a_hand_written_conflist_with_its_own_settings_is_named(node: InstalledNode) -> None:
    assert node.ctd is not None
    hand = json.loads((node.dirs["cni-conf"] / "10-netplugin.conflist").read_text())
    hand["name"] = "hand"
    hand["plugins"][0]["env"] = {"NETPLUGIN_BRIDGE_MTU": "1300"}
    path = node.dirs["cni-conf"] / "05-hand.conflist"  # sorts first: the runtime picks it
    path.write_text(json.dumps(hand))
    try:
        doc = node.doctor()
        assert doc.returncode == 7, doc.stdout + doc.stderr
        checks = {c["name"]: c for c in json.loads(doc.stdout)["checks"]}
        assert "differ in env" in checks["daemon"]["problem"]
        assert "override" in checks["settings"]["problem"] and "env" in checks["settings"]["problem"]
        node.ctd.wait_network("hand")
        seen = len(node.entries())
        node.run_pod("hand")
        [entry] = node.entries()[seen:]
        assert entry["via"] == "local" and "(env)" in entry["daemon"], entry
        node.remove_pods()
    finally:
        path.unlink()
    node.ctd.wait_network("netplugin")


def test_a_hostport_answers_on_the_nodes_address_and_a_second_pod_is_refused(node: InstalledNode) -> None:
    """hostPorts as installed with no options (the shipped chain): containerd passes the mappings, the
    hostport member DNATs them on the node's address, and refuses a second pod on the same port."""
    web = node.run_pod("hp-web", ports=[PortMap(31080, 8080), PortMap(31053, 5353, "udp")])
    servers = [Server(web.netns_name, 8080, "web"), Server(web.netns_name, 5353, "web-udp", "udp")]
    try:
        for proto, port, token in (("tcp", 31080, "web"), ("udp", 31053, "web-udp")):
            seen = {"the underlay host": ask(node.host, NODE_IP, port, proto),
                    "the node itself": ask(node.netns, NODE_IP, port, proto)}  # fmt: skip
            assert seen == dict.fromkeys(seen, token), (proto, seen)
        assert node.ctd is not None
        with pytest.raises(grpc.RpcError) as info:
            node.run_pod("hp-rival", ports=[PortMap(31080, 80)])
        assert "hostPort 31080/tcp is already held by pod np-inst/hp-web" in str(info.value.details())
        assert ask(node.host, NODE_IP, 31080) == "web"  # the rival changed nothing
    finally:
        for s in servers:
            s.close()
    node.remove_pods()
    assert ask(node.host, NODE_IP, 31080, timeout=1) == ""  # nothing of the pod is left
