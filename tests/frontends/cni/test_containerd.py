"""netplugin-cni under the kubelet's real caller: containerd's CRI plugin, driven over CRI v1 gRPC.

One private containerd per session (tests/frontends/cni/containerd.py); each test gives it a
network of its own (``np<hex>`` names, a free /24 of 10.201.0.0/16, the CNI range, private netplugin state/run
dirs) and removes every sandbox, bridge and netns it made, passed or not. Pods are reached with
``ip netns exec <the sandbox's netns> ping``: the sandbox image only sleeps.

What containerd 1.6 passes (asserted below, documented in docs/cni.md):
ADD and DEL get ``CNI_ARGS`` ``K8S_POD_NAMESPACE``, ``K8S_POD_NAME``, ``K8S_POD_INFRA_CONTAINER_ID``
(= ``CNI_CONTAINERID``, the sandbox id), ``K8S_POD_UID`` and ``IgnoreUnknown=1``; ``CNI_NETNS`` is
``/var/run/netns/cni-<uuid>``, the path ``PodSandboxStatus`` reports; ``CNI_IFNAME`` is ``eth0``; the
config's ``cniVersion`` is 1.0.0 (its libcni reads no 1.1.0 results and ignores ``cniVersions``);
the DEL of StopPodSandbox carries the cached ADD result as ``prevResult``, and RemovePodSandbox
sends one more DEL with an empty ``CNI_NETNS`` and no ``prevResult``.

Every test runs twice: against Debian's containerd 1.6, and against containerd 2 (its own
``containerd-shim-runc-v2``, Debian's runc) built by scripts/build-peers.sh. containerd 2 passes
the same, except that it picks 1.1.0 from ``cniVersions``, sends CNI ``STATUS`` whenever the
kubelet asks CRI ``Status`` (a failing STATUS makes the node's network not ready, with netplugin's
reason), and passes the sandbox's cgroup parent as ``runtimeConfig.cgroupPath`` to a conflist
that declares the capability.
"""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from netplugin.core.spares import SPARE_DIR
from netplugin.frontends.wire.client import NotSent, exchange
from tests.support.gopeers import require
from tests.support.nettest import free_third_octet

from .conftest import bridge_shim_conf
from .containerd import Containerd, Sandbox, unavailable_reason

REPO = Path(__file__).resolve().parents[3]
BRIDGE = REPO / "exec_plugins" / "bridge" / "bridge"
TEST_RANGE = "10.201.0.0/16"

pytestmark = pytest.mark.containerd
#: the config version each containerd picks from the conflist's cniVersions: 1.6's libcni reads
#: none, containerd 2's takes the highest it supports
NEGOTIATED = {1: "1.0.0", 2: "1.1.0"}


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


#: the two callers: Debian's containerd 1.6, and containerd 2 built from the module proxy
CONTAINERD2_PEERS = ("containerd", "ctr", "containerd-shim-runc-v2", "cni/loopback")


@pytest.fixture(scope="session", params=["1.6", "2"], ids=["containerd1.6", "containerd2"])
def containerd(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Containerd]:
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    peers = require(*CONTAINERD2_PEERS) if request.param == "2" else None
    root = tmp_path_factory.mktemp("containerd")
    # The shim as install.sh installs it: the compiled netplugin-cni, its socket fixed at build (here
    # root/netplugin.sock, which a test's daemon links to its own), the Python entry script that
    # `netplugin install-shim` writes (python -I -S) as its fallback when no daemon serves a call.
    made = _run([sys.executable, "-m", "netplugin", "install-shim", str(root / "netplugin-cni-python")])
    assert made.returncode == 0, made.stderr
    native = _run([sys.executable, "-m", "netplugin", "install-shim", "--kind", "cni-native", str(root / "cni"),
                   "--socket", str(root / "netplugin.sock"), "--fallback", made.stdout.strip()])  # fmt: skip
    assert native.returncode == 0, native.stderr
    ctd = Containerd(root, Path(native.stdout.strip()), peers=peers)
    try:
        ctd.start()
        yield ctd
    finally:
        ctd.close()


@dataclass
class CniNet:
    """One test's network: a conflist for netplugin-cni with the bridge exec plugin (or another)."""

    ctd: Containerd
    tmp: Path
    tag: str = field(default_factory=lambda: secrets.token_hex(3))
    sandboxes: list[str] = field(default_factory=list)
    daemon: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        self.name = f"np{self.tag}"
        self.bridge = f"npbr{self.tag}"
        self.subnet = ipaddress.ip_network(f"10.201.{free_third_octet(TEST_RANGE)}.0/24")
        self.exec_dir = self.tmp / "exec"
        self.state = self.tmp / "state"
        self.run_dir = self.tmp / "run"
        self.log = self.tmp / "cni.log"
        for d in (self.exec_dir / "bridge", self.state, self.run_dir):
            d.mkdir(parents=True, exist_ok=True)
        os.chmod(self.exec_dir, 0o755)
        os.chmod(self.exec_dir / "bridge", 0o755)
        exe = self.exec_dir / "bridge" / "bridge"
        shutil.copyfile(BRIDGE, exe)
        os.chmod(exe, 0o755)

    def conflist(self, plugin: str = "bridge", **extra: Any) -> dict[str, Any]:
        conf = {**bridge_shim_conf(self, plugin), **extra}
        # As the shipped etc/cni/10-netplugin.conflist: 1.0.0 for runtimes whose libcni
        # predates 1.1 (containerd 1.6), and cniVersions so newer ones use 1.1.0.
        return {"cniVersion": "1.0.0", "cniVersions": ["1.0.0", "1.1.0"], "name": self.name, "plugins": [conf]}

    def use(self, plugin: str = "bridge", **extra: Any) -> None:
        self.ctd.use_network(self.conflist(plugin, **extra))

    def daemon_config(self) -> Path:
        """A netplugin config file with the settings of :meth:`conflist` (for ``netplugin serve``)."""
        conf = self.conflist()["plugins"][0]
        path = self.tmp / "netplugin.yaml"
        lines = [
            "plugin: bridge",
            f"plugin_dir: {conf['pluginDir']}",
            f"state_dir: {conf['stateDir']}",
            f"run_dir: {conf['runDir']}",
            "host: none",
            "metrics_address: 127.0.0.1:0",
            "env:",
            *(f"  {k}: {json.dumps(v)}" for k, v in conf["env"].items()),
        ]
        path.write_text("\n".join(lines) + "\n")
        return path

    def start_daemon(self, config: Path, netns: str | None = None) -> subprocess.Popen[bytes]:
        """``netplugin serve`` with ``config``, in the named netns when given: entered with a bare
        ``nsenter --net``, as containerd enters a node (its /sys stays the root netns's)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_")}
        env["NETPLUGIN_CONFIG"] = str(config)
        log = open(self.tmp / "daemon.log", "wb")  # noqa: SIM115 -- the daemon writes it until close()
        inside = ["nsenter", f"--net=/run/netns/{netns}"] if netns else []
        self.daemon = subprocess.Popen(
            [*inside, sys.executable, "-m", "netplugin", "serve"], env=env, stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        sock = str(self.run_dir / "netplugin.sock")
        os.symlink(sock, self.ctd.root / "netplugin.sock")  # where the compiled shim looks
        deadline = time.monotonic() + 60
        while True:
            try:
                if exchange(sock, {"v": 1, "op": "health"}, timeout=10)["ok"]:
                    return self.daemon
            except NotSent:
                pass
            if self.daemon.poll() is not None or time.monotonic() > deadline:
                raise AssertionError((self.tmp / "daemon.log").read_text())
            time.sleep(0.05)

    def daemon_metrics(self) -> str:
        health = exchange(str(self.run_dir / "netplugin.sock"), {"v": 1, "op": "health"}, timeout=10)["result"]
        with urllib.request.urlopen(f"http://{health['metrics_address']}/metrics", timeout=10) as resp:
            body: bytes = resp.read()
        return body.decode()

    def run_pod(self, namespace: str, name: str, uid: str | None = None, attempt: int = 0) -> Sandbox:
        sb = self.ctd.run_pod(namespace, name, uid or str(uuid.uuid4()), attempt)
        self.sandboxes.append(sb.id)
        return sb

    def log_entries(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.startswith("{")]

    def records(self) -> list[dict[str, Any]]:
        """netplugin's durable pod records in this network's state dir."""
        return [json.loads(p.read_text()) for p in sorted((self.state / "pods").glob("*.json"))]

    def attachments(self) -> list[str]:
        """The attachment records (not the spare inodes kept beside them: netplugin.core.spares)."""
        d = self.state / "cni" / self.name
        return sorted(n for n in os.listdir(d) if n != SPARE_DIR) if d.is_dir() else []

    def ipam_files(self, sub: str) -> list[str]:
        d = self.state / "bridge" / self.bridge / sub
        return sorted(os.listdir(d)) if d.is_dir() else []

    def bridge_ports(self) -> str:
        return _run(["ip", "-o", "link", "show", "master", self.bridge]).stdout.strip()

    def close(self) -> None:
        for sid in self.sandboxes:
            self.ctd.stop_remove(sid, check=False)
        if self.daemon is not None and self.daemon.poll() is None:
            self.daemon.terminate()
            self.daemon.wait(60)
        if os.path.islink(self.ctd.root / "netplugin.sock"):
            os.unlink(self.ctd.root / "netplugin.sock")
        if os.path.exists(f"/sys/class/net/{self.bridge}"):
            _run(["ip", "link", "del", self.bridge])


@pytest.fixture
def net(containerd: Containerd, tmp_path: Path) -> Iterator[CniNet]:
    n = CniNet(containerd, tmp_path)
    try:
        yield n
    finally:
        n.close()


def _ping(sb: Sandbox, ip: str) -> subprocess.CompletedProcess[str]:
    return _run(["ip", "netns", "exec", sb.netns_name, "ping", "-c", "1", "-W", "3", ip])


def assert_nothing_left(net: CniNet, sandboxes: list[Sandbox]) -> None:
    assert net.bridge_ports() == "", f"host veths left on {net.bridge}"
    assert net.ipam_files("ips") == [] and net.ipam_files("pods") == []
    assert net.records() == []
    assert net.attachments() == []
    for sb in sandboxes:
        assert not os.path.exists(sb.netns), f"netns {sb.netns} left behind"
    assert not {sb.id for sb in sandboxes} & set(net.ctd.list_sandboxes())


def test_pods_get_the_plugins_addresses_reach_each_other_and_leave_nothing(net: CniNet) -> None:
    net.use()
    pods = [("np-web", f"web-{i}", str(uuid.uuid4())) for i in range(3)]
    sbs = [net.run_pod(ns, name, uid) for ns, name, uid in pods]

    ips = [sb.ip for sb in sbs]
    assert len(set(ips)) == 3 and all(ipaddress.ip_address(ip) in net.subnet for ip in ips), ips
    # PodSandboxStatus reports the address the exec plugin assigned and netplugin recorded.
    records = {r["infra_id"]: r for r in net.records()}
    for sb, (ns, name, _) in zip(sbs, pods, strict=True):
        rec = records[sb.id]
        assert (rec["namespace"], rec["name"], rec["state"]) == (ns, name, "ready")
        assert rec["ip"] in (None, sb.ip)  # record_status is off: the IP may be learned later
        assert (net.state / "bridge" / net.bridge / "ips" / sb.ip).exists()
        assert sb.netns.startswith("/var/run/netns/cni-"), sb.netns

    # What containerd passed for each ADD.
    adds = [e for e in net.log_entries() if e["command"] == "ADD"]
    assert [e["result"] for e in adds] == ["ok"] * 3
    for sb, e, (ns, name, uid) in zip(sbs, adds, pods, strict=True):
        args = dict(kv.split("=", 1) for kv in e["args"].split(";"))
        assert args == {
            "K8S_POD_NAMESPACE": ns,
            "K8S_POD_NAME": name,
            "K8S_POD_INFRA_CONTAINER_ID": sb.id,
            "K8S_POD_UID": uid,
            "IgnoreUnknown": "1",
        }
        assert (e["containerID"], e["ifname"], e["netns"]) == (sb.id, "eth0", sb.netns)
        assert e["cniVersion"] == NEGOTIATED[net.ctd.major] and e["prevResult"] is False

    for a in sbs:
        for b in sbs:
            if a is not b:
                done = _ping(a, b.ip)
                assert done.returncode == 0, f"{a.name} -> {b.name} ({b.ip}): {done.stdout}{done.stderr}"

    def dels_of(sb: Sandbox) -> list[tuple[str, bool]]:
        entries = net.log_entries()
        return [(e["netns"], e["prevResult"]) for e in entries if e["command"] == "DEL" and e["containerID"] == sb.id]

    for sb in sbs:
        net.ctd.stop(sb.id)
        assert dels_of(sb) == [(sb.netns, True)]  # StopPodSandbox: in the netns, with the cached result
        net.ctd.remove(sb.id)
        assert dels_of(sb)[1:] == [("", False)]  # RemovePodSandbox: once more, no netns, no result
    assert_nothing_left(net, sbs)
    dels = [e for e in net.log_entries() if e["command"] == "DEL"]
    assert all(e["result"] == "ok" for e in dels), dels
    # StopPodSandbox: DEL in the netns with the cached result; RemovePodSandbox: DEL again, no netns.
    for sb in sbs:
        mine = [(e["netns"], e["prevResult"]) for e in dels if e["containerID"] == sb.id]
        assert mine[0] == (sb.netns, True), mine
        assert all(m == ("", False) for m in mine[1:]), mine


def test_the_same_pod_run_again_gets_a_fresh_sandbox_and_leaves_nothing(net: CniNet) -> None:
    net.use()
    uid = str(uuid.uuid4())
    first = net.run_pod("np-db", "db-0", uid, attempt=0)
    assert _ping(first, str(net.subnet.network_address + 1)).returncode == 0
    # The kubelet stops a dead sandbox and runs the pod again with the next attempt number.
    net.ctd.stop(first.id)
    assert net.ipam_files("ips") == [] and net.records() == []
    second = net.run_pod("np-db", "db-0", uid, attempt=1)
    assert second.id != first.id and second.netns != first.netns
    assert ipaddress.ip_address(second.ip) in net.subnet
    assert [r["infra_id"] for r in net.records()] == [second.id]
    assert net.ipam_files("ips") == [second.ip]
    assert _ping(second, str(net.subnet.network_address + 1)).returncode == 0
    for sb in (first, second):
        net.ctd.stop_remove(sb.id)
    assert_nothing_left(net, [first, second])


def test_a_failing_plugin_reaches_run_pod_sandbox_and_leaks_nothing(net: CniNet, plugin_dir: Any) -> None:
    fake = plugin_dir.install("fake")
    reason = f"np-test {net.tag}: no addresses left in the moon's subnet"
    fake.set("setup", exit=1, stderr=reason)
    net.use("fake", pluginDir=str(plugin_dir.path))
    before = set(net.ctd.list_sandboxes())
    import grpc

    with pytest.raises(grpc.RpcError) as info:
        net.run_pod("np-bad", "bad-0")
    err = info.value
    assert err.code() == grpc.StatusCode.UNKNOWN
    assert reason in err.details(), err.details()
    assert "network plugin 'fake' setup failed" in err.details(), err.details()
    # containerd DELs after the failed ADD and removes its sandbox; netplugin rolled back.
    assert set(net.ctd.list_sandboxes()) == before
    # (containerd 2 also sends STATUS, on its own schedule: CRI Status, its readiness checks)
    entries = [e for e in net.log_entries() if e["command"] != "STATUS"]
    assert [e["command"] for e in entries][:2] == ["ADD", "DEL"], entries
    assert entries[0]["result"]["code"] == 999 and all(e["result"] == "ok" for e in entries[1:])
    netns = entries[0]["netns"]
    assert netns.startswith("/var/run/netns/cni-") and not os.path.exists(netns)
    calls = [c.split()[0] for c in fake.calls()]
    first = calls.index("setup")
    assert calls[first - 1 : first + 2] == ["init", "setup", "teardown"], calls  # setup, then its rollback
    assert "teardown" in calls[first + 2 :], calls  # and the DEL containerd sent
    assert net.records() == [] and net.attachments() == []


def test_pods_through_the_daemon_when_it_runs_with_the_same_settings(net: CniNet) -> None:
    config = net.daemon_config()
    net.start_daemon(config)
    # The conflist names the daemon's config file (and the run dir, where the shim finds the socket).
    net.ctd.use_network(
        {
            "cniVersion": "1.0.0",
            "cniVersions": ["1.0.0", "1.1.0"],
            "name": net.name,
            "plugins": [
                {
                    "type": "netplugin-cni",
                    "configFile": str(config),
                    "runDir": str(net.run_dir),
                    "logFile": str(net.log),
                }
            ],
        }
    )
    sbs = [net.run_pod("np-api", f"api-{i}") for i in range(2)]
    adds = [e for e in net.log_entries() if e["command"] == "ADD"]
    assert [e["via"] for e in adds] == ["daemon", "daemon"], net.log_entries()
    assert {r["infra_id"] for r in net.records()} == {sb.id for sb in sbs}
    assert _ping(sbs[0], sbs[1].ip).returncode == 0
    for sb in sbs:
        net.ctd.stop_remove(sb.id)
    assert_nothing_left(net, sbs)
    entries = net.log_entries()
    assert {e["via"] for e in entries} == {"daemon"} and all(e["result"] == "ok" for e in entries), entries
    metrics = net.daemon_metrics()
    assert 'kubelet_network_plugin_operations_duration_seconds_count{operation_type="set_up_pod"} 2.0' in metrics
    dels = len([e for e in entries if e["command"] == "DEL"])
    count = "kubelet_network_plugin_operations_duration_seconds_count"
    assert f'{count}{{operation_type="tear_down_pod"}} {dels}.0' in metrics


def _network_ready(ctd: Containerd) -> tuple[bool, str]:
    """The NetworkReady condition of CRI Status, as the kubelet reads it to mark the node ready."""
    resp = ctd._stub.Status(ctd.pb.StatusRequest(verbose=False), timeout=30)
    cond = next(c for c in resp.status.conditions if c.type == "NetworkReady")
    return bool(cond.status), str(cond.message)


def test_containerd2_asks_status_before_it_reports_the_network_ready(net: CniNet, plugin_dir: Any) -> None:
    fake = plugin_dir.install("fake")
    reason = f"np-test {net.tag}: the uplink is down"
    fake.set("init", exit=1, stderr=reason)
    net.use("fake", pluginDir=str(plugin_dir.path))
    ready, message = _network_ready(net.ctd)
    statuses = [e for e in net.log_entries() if e["command"] == "STATUS"]
    if net.ctd.major == 1:
        # 1.6 reads no 1.1.0 config and sends no STATUS: a plugin that cannot start still looks ready.
        assert (ready, statuses) == (True, [])
        return
    # containerd 2 runs STATUS (CNI 1.1) on every CRI Status: the plugin's own reason reaches the kubelet.
    assert not ready and reason in message, message
    assert statuses and statuses[-1]["cniVersion"] == "1.1.0" and statuses[-1]["result"]["code"] == 50, statuses
    fake.clear("init")
    ready, message = _network_ready(net.ctd)
    assert ready, message
    assert net.log_entries()[-1]["command"] == "STATUS" and net.log_entries()[-1]["result"] == "ok"


def test_the_pods_cgroup_parent_reaches_the_plugin_as_cgroup_path(net: CniNet) -> None:
    # A conflist declaring the capability, as one for a plugin that accounts per pod would.
    net.ctd.use_network(
        {**net.conflist(), "plugins": [{**net.conflist()["plugins"][0], "capabilities": {"cgroupPath": True}}]}
    )
    sid = net.ctd.run_pod_sandbox("np-cg", "cg-0", str(uuid.uuid4()), cgroup_parent=f"/netplugin-test-{net.tag}")
    net.sandboxes.append(sid)
    add = next(e for e in net.log_entries() if e["command"] == "ADD")
    assert add["result"] == "ok", add
    # containerd 2 passes the sandbox's cgroup parent (runtimeConfig.cgroupPath); 1.6 does not know it.
    assert add["runtimeConfig"] == (["cgroupPath"] if net.ctd.major == 2 else []), add
