"""The shipped bash plugins (exec_plugins/), run directly as netplugin would exec them.

Kernel tests build real namespaces, veths and a bridge per test (see conftest.py) and check the
result with iproute2 and real TCP connections, never with the plugin's own view alone.
"""

from __future__ import annotations

import json
import os
import pty
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.bridgenet import AUDIT, BRIDGE, EXEC_PLUGINS, LOOPBACK, TCP_PORT, BridgeNet, Pod, link_exists
from tests.support.nettest import host_veth_name

kernel = pytest.mark.kernel

Factory = Callable[..., BridgeNet]


def assert_mesh(net: BridgeNet, pods: list[Pod]) -> None:
    """Every pod reaches every other pod, and the host reaches every pod, over TCP."""
    ips = {p.name: net.pod_ip(p) for p in pods}
    for p in pods:
        net.serve(p)
    for src in pods:
        targets = [ips[d.name] for d in pods if d is not src]
        answers = net.connect_from(src, targets)
        assert answers == {ips[d.name]: d.name for d in pods if d is not src}, f"from {src.name}"
    for p in pods:
        with socket.create_connection((ips[p.name], TCP_PORT), timeout=3) as c:
            assert c.recv(256).decode() == p.name


def assert_all_gone(net: BridgeNet, pods: list[Pod]) -> None:
    for p in pods:
        assert not link_exists(p.host_veth), p.host_veth
    assert net.bridge_ports() == []
    assert net.ipam_files("ips") == []
    assert net.ipam_files("pods") == []


# ---------------------------------------------------------------------------------------------------
# init


@kernel
def test_init_creates_configured_bridge_and_is_idempotent(bridge_net_factory: Factory) -> None:
    net = bridge_net_factory()
    env = {"NETPLUGIN_BRIDGE_MTU": "1400"}
    net.ok("init", env=env)
    net.ok("init", env=env)
    out = subprocess.run(["ip", "-o", "-4", "addr", "show", "dev", net.bridge], capture_output=True, text=True).stdout
    assert [line.split()[3] for line in out.splitlines()] == [f"{net.gateway}/24"]
    assert Path(f"/sys/class/net/{net.bridge}/mtu").read_text().strip() == "1400"
    assert int(Path(f"/sys/class/net/{net.bridge}/flags").read_text(), 16) & 1  # IFF_UP
    assert (net.ipam / "subnet").read_text() == f"{net.subnet}\n"


@kernel
def test_init_enables_forwarding_in_its_own_netns(bridge_net_factory: Factory) -> None:
    # ip_forward is per netns: running init in a throwaway "node" netns checks the default
    # (forwarding on) without changing the machine's own setting.
    net = bridge_net_factory()
    node = net.add_netns("node")
    env = net.call_env("init", None)
    del env["NETPLUGIN_BRIDGE_IP_FORWARD"], env["NETPLUGIN_BRIDGE_BR_NETFILTER"]
    nf = "/proc/sys/net/bridge/bridge-nf-call-iptables"  # per netns too: off in the node before init
    subprocess.run(["ip", "netns", "exec", node, "sh", "-c", f"echo 0 > {nf}"], check=True)
    r = subprocess.run(["ip", "netns", "exec", node, str(BRIDGE), "init"], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    fwd = subprocess.run(
        ["ip", "netns", "exec", node, "cat", "/proc/sys/net/ipv4/ip_forward", nf], capture_output=True, text=True
    )
    assert fwd.stdout.split() == ["1", "1"]
    inside = subprocess.run(["ip", "-n", node, "-o", "link", "show", net.bridge], capture_output=True)
    assert inside.returncode == 0
    assert not link_exists(net.bridge)


# ---------------------------------------------------------------------------------------------------
# setup / teardown / status on real pods


@kernel
def test_three_pods_reach_each_other_and_teardown_removes_everything(bridge_net: BridgeNet) -> None:
    net = bridge_net
    pods = net.pods(3)
    for p in pods:
        net.ok("setup", p)

    ips = [net.pod_ip(p) for p in pods]
    assert len(set(ips)) == 3
    assert all(ip in [str(h) for h in net.subnet.hosts()] and ip != net.gateway for ip in ips)
    assert sorted(net.bridge_ports()) == sorted(p.host_veth for p in pods)
    for p, ip in zip(pods, ips, strict=True):
        assert (net.ipam / "pods" / p.infra_id).read_text() == f"{ip}/24 default {p.name}\n"
        assert (net.ipam / "ips" / ip).read_text() == f"{p.infra_id}\n"
        assert net.status_ip(p) == ip
        assert Path(f"/sys/class/net/{p.host_veth}/brport/hairpin_mode").read_text().strip() == "1"
        # The host end is a bridge port without an IPv6 address (no DAD, RS or MLD to flood).
        link = subprocess.run(["ip", "-d", "link", "show", "dev", p.host_veth], capture_output=True, text=True)
        assert "addrgenmode none" in link.stdout
        addrs = subprocess.run(["ip", "-6", "addr", "show", "dev", p.host_veth], capture_output=True, text=True)
        assert addrs.stdout == ""
    route = subprocess.run(
        ["ip", "-n", pods[0].netns, "route", "show", "default"], capture_output=True, text=True
    ).stdout
    assert f"via {net.gateway} dev eth0" in route

    assert_mesh(net, pods)

    for p in pods:
        net.ok("teardown", p)
    assert_all_gone(net, pods)
    for p in pods:
        assert net.status_ip(p) is None


@kernel
def test_setup_prints_the_status_document_that_status_prints(bridge_net: BridgeNet) -> None:
    """The contract's optional extension: netplugin then makes no status call after the setup."""
    net = bridge_net
    pod, again = net.pods(1)[0], None
    setup_out = net.ok("setup", pod).stdout
    doc = json.loads(setup_out)
    # the setup document: the status document plus the host veth, for a later chain member, and the
    # pod interface's MAC (fixed by the plugin, so that it need not read it back)
    assert doc == {
        "apiVersion": "v1beta1",
        "kind": "PodNetworkStatus",
        "ip": net.pod_ip(pod),
        "ips": [net.pod_ip(pod)],
        "hostInterface": pod.host_veth,
        "mac": net.pod_mac(pod),
    }
    assert {k: v for k, v in doc.items() if k not in ("hostInterface", "mac")} == json.loads(
        net.ok("status", pod).stdout
    )
    assert setup_out.count("PodNetworkStatus") == 1  # printed once, in one format
    again = net.ok("setup", pod).stdout  # a repeated setup keeps the address and says so
    assert again == setup_out
    net.ok("teardown", pod)


@kernel
def test_pod_mac_is_fixed_per_infra_id_and_reported_as_the_live_one(bridge_net: BridgeNet) -> None:
    net = bridge_net
    pod, other = net.pods(2)
    mac = json.loads(net.ok("setup", pod).stdout)["mac"]
    assert mac == net.pod_mac(pod)
    assert int(mac[:2], 16) & 3 == 2  # locally administered, unicast
    assert json.loads(net.ok("setup", other).stdout)["mac"] == net.pod_mac(other) != mac
    net.ok("teardown", pod)
    assert json.loads(net.ok("setup", pod).stdout)["mac"] == mac == net.pod_mac(pod)  # same pod, same MAC
    # A link that already has another MAC (made by an older plugin) is kept, and its MAC reported.
    r = subprocess.run(
        ["ip", "-n", pod.netns, "link", "set", "dev", "eth0", "address", "02:00:5e:10:00:01"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(net.ok("setup", pod).stdout)["mac"] == "02:00:5e:10:00:01" == net.pod_mac(pod)
    net.ok("teardown", pod)
    net.ok("teardown", other)


@kernel
def test_host_veth_name_is_the_same_without_bash_52(bridge_net: BridgeNet) -> None:
    """bash 5.2 hashes the infra id in one expression; older bash loops: both give the native rule's name."""
    net = bridge_net
    for i, infra in enumerate(["a", "0123456789abcdef" * 4, "Pod_x.y-" + "z" * 200]):
        pod = net.pod(i)
        pod = Pod(pod.namespace, pod.name, infra, pod.netns, host_veth_name(infra))
        net.infra_ids.append(infra)
        for opt in ("-O", "+O"):  # patsub_replacement on (the 5.2 default) and off (as in bash 5.1)
            r = subprocess.run(
                ["bash", opt, "patsub_replacement", *net.argv("setup", pod)],
                env=net.call_env("setup", pod),
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert r.returncode == 0, r.stderr
            assert json.loads(r.stdout)["hostInterface"] == pod.host_veth, opt
            assert link_exists(pod.host_veth)
            net.ok("teardown", pod)


@kernel
def test_setup_twice_keeps_the_address_and_the_link(bridge_net: BridgeNet) -> None:
    net = bridge_net
    pod, other = net.pods(2)
    net.ok("setup", pod)
    net.ok("setup", other)
    first = net.pod_ip(pod)
    ifindex = Path(f"/sys/class/net/{pod.host_veth}/ifindex").read_text()
    net.ok("setup", pod)
    assert net.pod_ip(pod) == first
    assert Path(f"/sys/class/net/{pod.host_veth}/ifindex").read_text() == ifindex
    assert net.ipam_files("ips") == sorted([first, net.pod_ip(other)])
    assert_mesh(net, [pod, other])


@kernel
def test_teardown_is_idempotent(bridge_net: BridgeNet) -> None:
    net = bridge_net
    pod = net.pod(0)
    net.ok("teardown", pod)  # never set up
    net.ok("setup", pod)
    net.ok("teardown", pod)
    net.ok("teardown", pod)
    assert_all_gone(net, [pod])


@kernel
def test_teardown_after_netns_deleted_releases_the_address(bridge_net: BridgeNet) -> None:
    net = bridge_net
    pod = net.pod(0)
    net.ok("setup", pod)
    ip = net.pod_ip(pod)
    subprocess.run(["ip", "netns", "del", pod.netns], check=True)
    net.ok("teardown", pod)
    assert net.wait_gone(pod.host_veth)
    assert not (net.ipam / "ips" / ip).exists()
    assert_all_gone(net, [pod])
    assert net.run("status", pod).stdout == ""


@kernel
@pytest.mark.parametrize("kind", ["missing", "not-a-netns"])
def test_setup_with_missing_netns_fails_cleanly(bridge_net: BridgeNet, tmp_path: Path, kind: str) -> None:
    net = bridge_net
    pod = net.pod(kind, create_netns=False)
    if kind == "missing":
        path, message = pod.netns_path, f"network namespace {pod.netns_path} does not exist"
    else:
        # A plain file where a runtime's bind mount used to be (and a path outside /var/run/netns).
        path, message = str(tmp_path / "stale-netns"), "failed to create veth"
        Path(path).write_text("")
    r = net.run("setup", pod, netns=path)
    assert r.returncode != 0
    assert message in r.stderr
    assert not link_exists(pod.host_veth)
    assert_all_gone(net, [pod])
    status = net.run("status", pod, netns=path)
    assert (status.returncode, status.stdout) == (0, ""), status.stderr
    net.ok("teardown", pod, netns=path)


@kernel
def test_netns_given_as_proc_path(bridge_net: BridgeNet) -> None:
    # /proc/PID/ns/net cannot be named to `ip -n`: the plugin must go through nsenter.
    net = bridge_net
    pod = net.pod(0)
    holder = subprocess.Popen(["ip", "netns", "exec", pod.netns, "sleep", "300"], stdin=subprocess.DEVNULL)
    try:
        path = f"/proc/{holder.pid}/ns/net"
        deadline = time.monotonic() + 5
        while os.stat(path).st_ino != os.stat(pod.netns_path).st_ino:
            assert time.monotonic() < deadline, "holder did not enter the netns"
            time.sleep(0.01)
        net.ok("setup", pod, netns=path)
        assert net.status_ip(pod) == net.pod_ip(pod)  # status through the /var/run/netns name
        r = net.ok("status", pod, netns=path)
        assert json.loads(r.stdout)["ip"] == net.pod_ip(pod)
        assert_mesh(net, [pod])
        net.ok("teardown", pod, netns=path)
        assert_all_gone(net, [pod])
    finally:
        holder.kill()
        holder.wait()


def ip_failing_in_pod_netns(tmp_path: Path, action: str, *, at_once: bool = False) -> str:
    """A PATH whose `ip` runs ``action`` for its batch inside a pod netns, and is the real ip otherwise.

    The action runs once the batch's first line arrives: the plugin starts the batch early and sends
    it when it has created the veth and allocated the address, what a failure must undo. With
    ``at_once`` it runs before reading anything, and `ip link add` waits 0.5 s first, so that the
    plugin writes to an ip that is gone.
    """
    fakebin = tmp_path / "fakebin"
    fakebin.mkdir()
    host_netns = os.readlink("/proc/self/ns/net")
    # The veth is made by a batch in the host netns (an older plugin ran `ip link add`).
    slow_veth = (
        f'if [[ $1 == -batch && $(readlink /proc/self/ns/net) == "{host_netns}" ]] || [[ $1 == link && $2 == add ]]; '
        "then sleep 0.5; fi\n"
        if at_once
        else ""
    )
    first = "" if at_once else "read -r _; "
    (fakebin / "ip").write_text(
        f"#!/bin/bash\n{slow_veth}"
        f'if [[ $1 == -batch && $(readlink /proc/self/ns/net) != "{host_netns}" ]]; then {first}{action}; fi\n'
        f'exec {shutil.which("ip")} "$@"\n'
    )
    (fakebin / "ip").chmod(0o755)
    return f"{fakebin}:{os.environ['PATH']}"


@kernel
def test_failure_after_veth_creation_rolls_back(bridge_net: BridgeNet, tmp_path: Path) -> None:
    # A real ip that refuses the in-netns batch: the veth exists and the address is allocated by then.
    net = bridge_net
    pod = net.pod(0)
    path = ip_failing_in_pod_netns(tmp_path, 'echo "ip: injected failure" >&2; exit 1')
    r = net.run("setup", pod, env={"PATH": path})
    assert r.returncode != 0
    assert "injected failure" in r.stderr
    assert "failed to configure eth0" in r.stderr
    assert not link_exists(pod.host_veth)
    eth0 = subprocess.run(["ip", "-n", pod.netns, "link", "show", "eth0"], capture_output=True)
    assert eth0.returncode != 0
    assert_all_gone(net, [pod])
    net.ok("setup", pod)  # nothing left behind blocks a retry
    assert net.status_ip(pod) == net.pod_ip(pod)


@kernel
def test_veth_made_but_its_batch_failing_later_rolls_back(bridge_net: BridgeNet, tmp_path: Path) -> None:
    # The host side's batch creates the pair, then fails on a later line: the pair is this call's
    # and must go with the rollback, as must the address.
    net = bridge_net
    pod = net.pod(0)
    fakebin = tmp_path / "fakebin"
    fakebin.mkdir()
    host_netns = os.readlink("/proc/self/ns/net")
    (fakebin / "ip").write_text(
        "#!/bin/bash\n"
        f'if [[ $1 == -batch && $(readlink /proc/self/ns/net) == "{host_netns}" ]]; then\n'
        f'    {{ cat; echo "link set dev npnosuchlink0 up"; }} | {shutil.which("ip")} "$@"\n'
        "    exit\n"
        "fi\n"
        f'exec {shutil.which("ip")} "$@"\n'
    )
    (fakebin / "ip").chmod(0o755)
    r = net.run("setup", pod, env={"PATH": f"{fakebin}:{os.environ['PATH']}"})
    assert r.returncode == 1, r.stderr
    assert "failed to create veth" in r.stderr
    assert not link_exists(pod.host_veth)
    assert_all_gone(net, [pod])
    net.ok("setup", pod)
    assert net.status_ip(pod) == net.pod_ip(pod)


@kernel
def test_netns_path_with_blanks_and_a_hash(bridge_net: BridgeNet, tmp_path: Path) -> None:
    # ip's batch splits a line at blanks and cuts it at '#': the path must not go through it.
    net = bridge_net
    pod = net.pod(0)
    odd = tmp_path / "a dir # with" / "net ns"
    odd.parent.mkdir()
    odd.symlink_to(pod.netns_path)
    doc = json.loads(net.ok("setup", pod, netns=str(odd)).stdout)
    assert doc["ip"] == net.pod_ip(pod)
    assert net.bridge_ports() == [pod.host_veth]
    assert_mesh(net, [pod])
    net.ok("teardown", pod, netns=str(odd))
    assert_all_gone(net, [pod])


@kernel
def test_pod_side_dead_before_its_commands_rolls_back(bridge_net: BridgeNet, tmp_path: Path) -> None:
    # The batch is started early and written to later: writing to an ip that is gone must fail the
    # step (exit 1, rolled back), not kill the plugin with SIGPIPE before its exit trap runs.
    net = bridge_net
    pod = net.pod(0)
    path = ip_failing_in_pod_netns(tmp_path, 'echo "ip: injected failure" >&2; exit 1', at_once=True)
    r = net.run("setup", pod, env={"PATH": path})
    assert r.returncode == 1, r.stderr
    assert "injected failure" in r.stderr
    assert "failed to configure eth0" in r.stderr
    assert not link_exists(pod.host_veth)
    assert_all_gone(net, [pod])


@kernel
def test_setup_terminated_midway_rolls_back(bridge_net: BridgeNet, tmp_path: Path) -> None:
    # netplugin's timeout: SIGTERM to the plugin's process group while ip hangs inside the netns.
    net = bridge_net
    pod = net.pod(0)
    marker = tmp_path / "hanging"
    env = net.call_env("setup", pod)
    env["PATH"] = ip_failing_in_pod_netns(tmp_path, f"touch {marker}; exec sleep 60")
    p = subprocess.Popen(
        net.argv("setup", pod),
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 20
        while not marker.exists():
            assert p.poll() is None and time.monotonic() < deadline, p.stderr.read() if p.stderr else ""
            time.sleep(0.01)
        assert link_exists(pod.host_veth)
        assert len(net.ipam_files("pods")) == 1
        os.killpg(p.pid, signal.SIGTERM)
        _, err = p.communicate(timeout=10)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
    assert p.returncode == 143
    assert "failed to configure eth0" in err
    assert_all_gone(net, [pod])


@kernel
def test_setup_recreates_a_missing_bridge(bridge_net_factory: Factory) -> None:
    net = bridge_net_factory()
    pod = net.pod(0)
    r = net.ok("setup", pod)
    assert "running init" in r.stderr
    assert net.bridge_ports() == [pod.host_veth]
    assert_mesh(net, [pod])


@kernel
def test_setup_applies_mtu_and_ifname(bridge_net: BridgeNet) -> None:
    net = bridge_net
    pod = net.pod(0)
    env = {"NETPLUGIN_BRIDGE_MTU": "1400", "NETPLUGIN_BRIDGE_IFNAME": "net0"}
    net.ok("setup", pod, env=env)
    assert Path(f"/sys/class/net/{pod.host_veth}/mtu").read_text().strip() == "1400"
    out = subprocess.run(["ip", "-n", pod.netns, "-o", "link", "show", "net0"], capture_output=True, text=True)
    assert "mtu 1400" in out.stdout
    assert "state UP" in out.stdout or "LOWER_UP" in out.stdout
    assert json.loads(net.ok("status", pod, env=env).stdout)["ip"] == str(net.subnet.network_address + 2)
    net.ok("teardown", pod, env=env)
    assert_all_gone(net, [pod])


@kernel
def test_status_without_interface_prints_nothing(bridge_net: BridgeNet) -> None:
    net = bridge_net
    pod = net.pod(0)
    assert net.status_ip(pod) is None  # netns exists, no eth0
    gone = net.pod("missing", create_netns=False)
    r = net.run("status", gone)
    assert (r.returncode, r.stdout) == (0, "")


@kernel
def test_allocation_is_round_robin_from_the_cursor(bridge_net: BridgeNet) -> None:
    net = bridge_net
    a, b, c = net.pods(3)
    net.ok("setup", a)
    net.ok("setup", b)
    ip_a, ip_b = net.pod_ip(a), net.pod_ip(b)
    net.ok("teardown", a)
    net.ok("setup", c)
    # The freed address is reused last, so a late packet for the old pod cannot hit a new one.
    assert net.pod_ip(c) != ip_a
    assert int(net.pod_ip(c).split(".")[3]) == int(ip_b.split(".")[3]) + 1
    assert (net.ipam / "cursor").read_text() == f"{net.pod_ip(c):<39}\n"  # in place, padded


@kernel
def test_concurrent_setups_get_distinct_addresses(bridge_net: BridgeNet) -> None:
    net = bridge_net
    pods = net.pods(20)
    barrier = threading.Barrier(len(pods))

    def call(action: str, pod: Pod) -> subprocess.CompletedProcess[str]:
        barrier.wait()
        return net.run(action, pod)

    with ThreadPoolExecutor(len(pods)) as ex:
        results = list(ex.map(lambda p: call("setup", p), pods))
    assert [r.returncode for r in results] == [0] * 20, [r.stderr for r in results if r.returncode]
    ips = [net.pod_ip(p) for p in pods]
    assert len(set(ips)) == 20
    assert net.ipam_files("ips") == sorted(ips)
    assert sorted(net.bridge_ports()) == sorted(p.host_veth for p in pods)
    assert_mesh(net, pods[:4])

    barrier.reset()
    with ThreadPoolExecutor(len(pods)) as ex:
        results = list(ex.map(lambda p: call("teardown", p), pods))
    assert [r.returncode for r in results] == [0] * 20, [r.stderr for r in results if r.returncode]
    assert_all_gone(net, pods)


@kernel
def test_subnet_exhaustion_fails_cleanly(bridge_net_factory: Factory) -> None:
    net = bridge_net_factory(prefixlen=29)  # .1 gateway, .2-.6 pods, .7 broadcast
    net.ok("init")
    pods = net.pods(6)
    for p in pods[:5]:
        net.ok("setup", p)
    last = pods[5]
    r = net.run("setup", last)
    assert r.returncode != 0
    assert f"no free address in {net.subnet}" in r.stderr
    assert not link_exists(last.host_veth)
    assert not (net.ipam / "pods" / last.infra_id).exists()
    assert len(net.ipam_files("ips")) == 5
    assert_mesh(net, pods[:5])

    freed = net.pod_ip(pods[2])
    net.ok("teardown", pods[2])
    net.ok("setup", last)  # the cursor wraps around to the freed address
    assert net.pod_ip(last) == freed


@kernel
def test_ipam_refuses_a_changed_subnet(bridge_net: BridgeNet) -> None:
    net = bridge_net
    pod = net.pod(0)
    net.ok("setup", pod)
    other = "10.200.0.0/24" if str(net.subnet) != "10.200.0.0/24" else "10.200.1.0/24"
    for action in ("init", "setup"):
        r = net.run(action, None if action == "init" else net.pod(1), env={"NETPLUGIN_BRIDGE_SUBNET": other})
        assert r.returncode != 0
        assert f"was created for subnet {net.subnet}" in r.stderr
    assert net.ipam_files("pods") == [pod.infra_id]


@kernel
def test_ipam_files_are_shared_with_the_native_ipam(bridge_net: BridgeNet) -> None:
    # netplugin.plugins.bridge.ipam is the native plugin's reader/writer of the same directory and lock.
    from netplugin.plugins.bridge.ipam import IPAM

    net = bridge_net
    a, c = net.pods(2)
    native = IPAM(str(net.ipam), str(net.subnet))
    net.ok("setup", a)
    record = native.lookup(a.infra_id)
    assert record is not None
    assert (record.ip, record.namespace, record.name) == (net.pod_ip(a), a.namespace, a.name)
    ip_b, _ = native.allocate("nativeb", "default", "pod-b")
    # one cursor for both: the bash plugin's (padded, written in place) read by the native IPAM ...
    assert int(ip_b.split(".")[3]) == int(net.pod_ip(a).split(".")[3]) + 1
    net.ok("setup", c)
    assert int(net.pod_ip(c).split(".")[3]) == int(ip_b.split(".")[3]) + 1  # ... and the other way
    assert (net.ipam / "cursor").read_text() == f"{net.pod_ip(c):<39}\n"  # nothing of the old one left
    assert native.release(a.infra_id) == net.pod_ip(a)
    net.ok("teardown", c)
    assert [r.infra_id for r in native.list()] == ["nativeb"]
    assert net.ipam_files("ips") == [ip_b]
    native.release("nativeb")
    net.ok("teardown", a)  # released by the other plugin already: still fine
    assert_all_gone(net, [a, c])


@kernel
def test_interrupted_allocation_is_completed(bridge_net: BridgeNet) -> None:
    # A crash between the two writes of an allocation leaves pods/<id> without ips/<addr>.
    net = bridge_net
    pod = net.pod(0)
    ip = str(net.subnet.network_address + 7)
    (net.ipam / "pods" / pod.infra_id).write_text(f"{ip}/24 default {pod.name}\n")
    net.ok("setup", pod)
    assert net.pod_ip(pod) == ip
    assert (net.ipam / "ips" / ip).read_text() == f"{pod.infra_id}\n"


@kernel
@pytest.mark.parametrize("damage", ["torn-ip-file", "torn-pod-record"])
def test_teardown_releases_damaged_records(bridge_net: BridgeNet, damage: str) -> None:
    net = bridge_net
    pod, other = net.pods(2)
    net.ok("setup", pod)
    net.ok("setup", other)
    ip = net.pod_ip(pod)
    if damage == "torn-ip-file":
        (net.ipam / "ips" / ip).write_text("")
    else:
        (net.ipam / "pods" / pod.infra_id).write_text("10.200.")
    r = net.ok("teardown", pod)
    assert not (net.ipam / "ips" / ip).exists()
    assert not (net.ipam / "pods" / pod.infra_id).exists()
    assert net.ipam_files("ips") == [net.pod_ip(other)], r.stderr


@kernel
@pytest.mark.parametrize("stdin_kind", ["pod-json", "devnull", "open-pipe", "terminal"])
def test_bridge_does_not_wait_for_stdin(bridge_net: BridgeNet, stdin_kind: str) -> None:
    net = bridge_net
    pod = net.pod(0)
    argv = net.argv("setup", pod)
    env = net.call_env("setup", pod)
    if stdin_kind == "pod-json":
        r = net.run("setup", pod, stdin=json.dumps({"kind": "Pod", "metadata": {"name": pod.name}}))
        assert r.returncode == 0, r.stderr
    elif stdin_kind == "devnull":
        net.ok("setup", pod)
    elif stdin_kind == "open-pipe":
        # A caller that never closes stdin must not block the plugin.
        p = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            assert p.wait(timeout=20) == 0
        finally:
            for s in (p.stdin, p.stdout, p.stderr):
                if s:
                    s.close()
    else:
        master, slave = pty.openpty()
        try:
            r = subprocess.run(argv, env=env, stdin=slave, capture_output=True, text=True, timeout=20)
            assert r.returncode == 0, r.stderr
        finally:
            os.close(master)
            os.close(slave)
    assert net.status_ip(pod) == net.pod_ip(pod)


# ---------------------------------------------------------------------------------------------------
# arguments and settings (no kernel objects are created: the plugin fails before, or only prints)


def plain_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_")}
    env["NETPLUGIN_STATE_DIR"] = str(tmp_path / "state")
    env.update(extra)
    return env


def run_plugin(argv: list[str], env: dict[str, str], exe: Path = BRIDGE) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(exe), *argv], env=env, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL
    )


def effective(r: subprocess.CompletedProcess[str]) -> dict[str, str]:
    assert r.returncode == 0, r.stderr
    return dict(line.split("=", 1) for line in r.stdout.splitlines())


@pytest.mark.parametrize(
    "argv, message",
    [
        ([], "missing action"),
        (["frobnicate"], "unknown action 'frobnicate'"),
        (["init", "extra"], "init takes no arguments"),
        (["setup", "default", "web"], "setup needs <namespace> <pod-name> <infra-id>"),
        (["setup", "Default", "web", "abc"], "invalid namespace 'Default'"),
        (["setup", "a" * 64, "web", "abc"], f"invalid namespace '{'a' * 64}'"),  # a label is 63 at most
        (["setup", "a-", "web", "abc"], "invalid namespace 'a-'"),
        (["teardown", "default", "web_0", "abc"], "invalid pod name 'web_0'"),
        (["status", "default", "web", "../etc"], "invalid infra id '../etc'"),
        (["setup", "default", "web..0", "abc"], "invalid pod name 'web..0'"),
        (["setup", "default", "web.-0", "abc"], "invalid pod name 'web.-0'"),
        (["setup", "default", "web-.0", "abc"], "invalid pod name 'web-.0'"),
        (["setup", "default", ".web", "abc"], "invalid pod name '.web'"),
        (["setup", "default", "web.", "abc"], "invalid pod name 'web.'"),
        (["setup", "default", "a" * 254, "abc"], "invalid pod name"),
        (["setup", "-a", "web", "abc"], "invalid namespace '-a'"),
        (["setup", "default", "web", "_abc"], "invalid infra id '_abc'"),
        (["setup", "default", "web", "a" * 256], "invalid infra id"),
    ],
)
def test_bad_arguments_are_usage_errors(tmp_path: Path, argv: list[str], message: str) -> None:
    r = run_plugin(argv, plain_env(tmp_path))
    assert r.returncode == 2
    assert message in r.stderr
    assert "usage:" in r.stderr


@pytest.mark.parametrize(
    "ns, pod, infra",
    [("a", "b", "C"), ("a-0", "web-1.svc-2.x", "Ab_c.d-e"), ("a" * 63, ".".join(["b" * 63] * 4)[:253], "f" * 255)],
)
def test_good_arguments_are_accepted(tmp_path: Path, ns: str, pod: str, infra: str) -> None:
    # status with no netns prints nothing and succeeds: whatever fails here is the argument checks.
    env = plain_env(tmp_path, NETPLUGIN_NETNS=str(tmp_path / "no-netns"))
    r = run_plugin(["status", ns, pod, infra], env)
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")


def test_default_settings(tmp_path: Path) -> None:
    got = effective(run_plugin(["config"], plain_env(tmp_path)))
    assert got == {
        "NETPLUGIN_BRIDGE_NAME": "cbr0",
        "NETPLUGIN_BRIDGE_SUBNET": "10.244.0.0/24",
        "NETPLUGIN_BRIDGE_GATEWAY": "10.244.0.1",
        "NETPLUGIN_BRIDGE_MTU": "auto",
        "NETPLUGIN_BRIDGE_STATE_DIR": str(tmp_path / "state" / "bridge"),
        "NETPLUGIN_BRIDGE_IFNAME": "eth0",
        "NETPLUGIN_BRIDGE_IP_FORWARD": "true",
        "NETPLUGIN_BRIDGE_BR_NETFILTER": "true",
    }


def test_settings_precedence(tmp_path: Path) -> None:
    # defaults < bridge.conf beside the executable < NETPLUGIN_BRIDGE_CONF < environment
    install = tmp_path / "bridge"
    install.mkdir()
    exe = install / "bridge"
    shutil.copy2(BRIDGE, exe)
    beside = ["# beside the executable", "", "NAME = npbeside\r", "SUBNET=10.200.1.0/24"]
    beside += ["NETPLUGIN_BRIDGE_MTU=1400", "IFNAME='ethb'", ""]
    (install / "bridge.conf").write_text("\n".join(beside))
    conf = tmp_path / "override.conf"
    conf.write_text('  SUBNET="10.200.2.0/24"\nMTU=1300\nGATEWAY=10.200.2.254')
    env = plain_env(tmp_path, NETPLUGIN_BRIDGE_CONF=str(conf), NETPLUGIN_BRIDGE_MTU="1200", NETPLUGIN_BRIDGE_IFNAME="")
    got = effective(run_plugin(["config"], env, exe=exe))
    assert got["NETPLUGIN_BRIDGE_NAME"] == "npbeside"
    assert got["NETPLUGIN_BRIDGE_SUBNET"] == "10.200.2.0/24"
    assert got["NETPLUGIN_BRIDGE_GATEWAY"] == "10.200.2.254"
    assert got["NETPLUGIN_BRIDGE_MTU"] == "1200"
    assert got["NETPLUGIN_BRIDGE_IFNAME"] == "ethb"  # an empty variable does not override


@pytest.mark.parametrize("uncomment", [False, True])
def test_shipped_example_settings_are_the_defaults(tmp_path: Path, uncomment: bool) -> None:
    install = tmp_path / "bridge"
    install.mkdir()
    shutil.copy2(BRIDGE, install / "bridge")
    text = (BRIDGE.parent / "bridge.conf.example").read_text()
    if uncomment:
        text = text.replace("\n# ", "\n").replace("\n#\n", "\n")
        text = "\n".join(line for line in text.splitlines() if "=" in line or not line.strip())
    (install / "bridge.conf").write_text(text)
    env = plain_env(tmp_path, NETPLUGIN_STATE_DIR="/var/lib/netplugin")
    got = effective(run_plugin(["config"], env, exe=install / "bridge"))
    assert got == effective(run_plugin(["config"], env))
    assert got["NETPLUGIN_BRIDGE_STATE_DIR"] == "/var/lib/netplugin/bridge"


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("SUBNET", "10.200.1.1/24", "host bits are set (did you mean 10.200.1.0/24?)"),
        ("SUBNET", "10.200.1.0", "expected an IPv4 network"),
        ("SUBNET", "10.200.256.0/24", "expected an IPv4 network"),
        ("SUBNET", "010.200.1.0/24", "expected an IPv4 network"),
        ("SUBNET", "fd00::/40", "prefix length must be 48-126"),
        ("SUBNET", "10.200.1.0/31", "prefix length must be 8-30"),
        ("GATEWAY", "10.201.0.1", "not a host address of 10.200.1.0/24"),
        ("GATEWAY", "10.200.1.255", "not a host address of 10.200.1.0/24"),
        ("GATEWAY", "gw", "expected an IPv4 or IPv6 address"),
        ("MTU", "jumbo", "expected auto or an integer 68-65535"),
        ("MTU", "67", "expected auto or an integer 68-65535"),
        ("MTU", "65536", "expected auto or an integer 68-65535"),
        ("NAME", "bridge-name-too-long", "invalid NETPLUGIN_BRIDGE_NAME"),
        ("NAME", "a/b", "invalid NETPLUGIN_BRIDGE_NAME"),
        ("IFNAME", "eth 0", "invalid NETPLUGIN_BRIDGE_IFNAME"),
        ("STATE_DIR", "relative/dir", "must be an absolute path"),
        ("IP_FORWARD", "maybe", "expected true or false"),
        ("BR_NETFILTER", "on", "expected true or false"),
    ],
)
@pytest.mark.parametrize("source", ["env", "file"])
def test_invalid_settings_are_rejected(tmp_path: Path, source: str, key: str, value: str, message: str) -> None:
    # Should validation ever let a value through, init must still not touch anything real.
    base = {
        "NETPLUGIN_BRIDGE_SUBNET": "10.200.1.0/24",
        "NETPLUGIN_BRIDGE_NAME": f"npbr{secrets.token_hex(3)}",
        "NETPLUGIN_BRIDGE_IP_FORWARD": "false",
        "NETPLUGIN_BRIDGE_BR_NETFILTER": "false",
    }
    base = {k: v for k, v in base.items() if k != f"NETPLUGIN_BRIDGE_{key}"}
    if source == "env":
        env = plain_env(tmp_path, **base, **{f"NETPLUGIN_BRIDGE_{key}": value})
    else:
        conf = tmp_path / "bridge.conf"
        conf.write_text(f"{key}={value}\n")
        env = plain_env(tmp_path, **base, NETPLUGIN_BRIDGE_CONF=str(conf))
    # setup and teardown parse only part of the script (see its Layout): they check the same.
    pod = ["default", "web", "abc"]
    for action in (["config"], ["init"], ["setup", *pod], ["teardown", *pod]):
        r = run_plugin(action, env)
        assert r.returncode == 1, action
        assert message in r.stderr, action
        assert "command not found" not in r.stderr, action


@pytest.mark.parametrize(
    "text, message",
    [
        ("NAME=cbr1\nCOLOUR=blue\n", "bridge.conf:2: unknown key 'COLOUR'"),
        ("NETPLUGIN_BRIDGE_SPEED=fast\n", "unknown key 'NETPLUGIN_BRIDGE_SPEED'"),
        ("# comment\nSUBNET 10.200.1.0/24\n", "bridge.conf:2: expected KEY=VALUE"),
    ],
)
def test_bad_settings_files(tmp_path: Path, text: str, message: str) -> None:
    conf = tmp_path / "bridge.conf"
    conf.write_text(text)
    r = run_plugin(["config"], plain_env(tmp_path, NETPLUGIN_BRIDGE_CONF=str(conf)))
    assert r.returncode == 1
    assert message in r.stderr


def test_settings_file_is_parsed_not_sourced(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    conf = tmp_path / "bridge.conf"
    conf.write_text(f"NAME=$(touch {marker})\n")
    r = run_plugin(["config"], plain_env(tmp_path, NETPLUGIN_BRIDGE_CONF=str(conf)))
    assert r.returncode == 1
    assert "invalid NETPLUGIN_BRIDGE_NAME" in r.stderr
    assert not marker.exists()


def test_missing_settings_file(tmp_path: Path) -> None:
    r = run_plugin(["config"], plain_env(tmp_path, NETPLUGIN_BRIDGE_CONF=str(tmp_path / "nope.conf")))
    assert r.returncode == 1
    assert "nope.conf does not exist" in r.stderr


# ---------------------------------------------------------------------------------------------------
# loopback and example.com/audit


@kernel
def test_loopback_brings_lo_up(bridge_net_factory: Factory) -> None:
    net = bridge_net_factory()
    pod = net.pod(0)
    lo = ["ip", "-n", pod.netns, "-o", "link", "show", "lo"]
    assert ",UP" not in subprocess.run(lo, capture_output=True, text=True).stdout
    for action in ("init", "setup", "status", "teardown"):
        r = net.run(action, None if action == "init" else pod, plugin=LOOPBACK)
        assert (r.returncode, r.stdout) == (0, ""), r.stderr
    assert ",UP" in subprocess.run(lo, capture_output=True, text=True).stdout
    r = net.run("setup", net.pod("absent", create_netns=False), plugin=LOOPBACK)
    assert r.returncode == 1
    assert "does not exist" in r.stderr


def test_audit_appends_one_line_per_event(tmp_path: Path) -> None:
    log = tmp_path / "log" / "audit.log"
    env = plain_env(tmp_path, NETPLUGIN_AUDIT_LOG=str(log), NETPLUGIN_NETNS="/var/run/netns/abc123")
    pod_json = json.dumps(
        {
            "kind": "Pod",
            "metadata": {
                "name": "web-0",
                "namespace": "team-a",
                "uid": "6f1c-42",
                "labels": {"app": "web", "example.com/tier": "front"},
                "ownerReferences": [{"uid": "not-this-one"}],
            },
            "spec": {"containers": [{"name": "c"}]},
        },
        indent=2,
    )

    def audit(*argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(AUDIT), *argv],
            env=env,
            input=stdin,
            stdin=None if stdin is not None else subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=30,
        )

    for argv, stdin in [
        (("init",), None),
        (("setup", "team-a", "web-0", "abc123"), pod_json),
        (("status", "team-a", "web-0", "abc123"), pod_json),
        (("teardown", "team-a", "web-0", "abc123"), None),
    ]:
        r = audit(*argv, stdin=stdin)
        assert (r.returncode, r.stdout) == (0, ""), r.stderr
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e["action"] for e in lines] == ["init", "setup", "teardown"]
    setup = lines[1]
    assert setup["namespace"] == "team-a"
    assert setup["pod"] == "web-0"
    assert setup["infraId"] == "abc123"
    assert setup["netns"] == "/var/run/netns/abc123"
    assert setup["uid"] == "6f1c-42"
    assert setup["labels"] == {"app": "web", "example.com/tier": "front"}
    assert lines[2]["uid"] is None and lines[2]["labels"] is None
    assert lines[0]["pod"] is None


def test_audit_lines_stay_whole_under_concurrency(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    env = plain_env(tmp_path, NETPLUGIN_AUDIT_LOG=str(log))
    procs = [
        subprocess.Popen([str(AUDIT), "setup", "default", f"pod-{i}", f"infra{i}"], env=env, stdin=subprocess.DEVNULL)
        for i in range(20)
    ]
    assert [p.wait(timeout=30) for p in procs] == [0] * 20
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert sorted(e["pod"] for e in entries) == sorted(f"pod-{i}" for i in range(20))


# ---------------------------------------------------------------------------------------------------
# shipping


def shipped_executables() -> list[Path]:
    return sorted(p for p in EXEC_PLUGINS.rglob("*") if p.is_file() and p.stat().st_mode & stat.S_IXUSR)


def test_every_plugin_directory_holds_its_executable() -> None:
    dirs = sorted(d for d in EXEC_PLUGINS.iterdir() if d.is_dir())
    assert {d.name for d in dirs} >= {"bridge", "loopback", "example.com~audit"}
    for d in dirs:
        exe = d / d.name.rsplit("~", 1)[-1]
        assert exe.is_file(), exe
        mode = exe.stat().st_mode
        assert mode & stat.S_IXUSR and not mode & (stat.S_IWGRP | stat.S_IWOTH), oct(mode)


@pytest.mark.parametrize("exe", shipped_executables(), ids=lambda p: str(p.relative_to(EXEC_PLUGINS)))
def test_shellcheck_clean(exe: Path) -> None:
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (CI installs it)")
    r = subprocess.run(["shellcheck", "-S", "style", str(exe)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
