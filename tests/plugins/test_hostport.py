"""The hostport members' table (netplugin.plugins.hostport and exec_plugins/hostport) against real
nftables in a netns of the test's own: records written by either rebuild the table, a flushed
ruleset comes back at init, teardown removes exactly one pod's rules."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from netplugin.core.hostports import parse_env
from netplugin.core.names import PodRef
from netplugin.plugins.hostport import TABLE, chain_name, pod_rules, rebuild_script
from netplugin.store.state import StateStore

pytestmark = pytest.mark.kernel
REPO = Path(__file__).resolve().parents[2]
BASH = REPO / "exec_plugins" / "hostport" / "hostport"
_NATIVE = r"""
import os, sys
from netplugin.core.names import PodRef
from netplugin.core.plugin import CallContext
from netplugin.plugins.hostport import HostPortPlugin
ctx = CallContext(env=dict(os.environ), state_dir=os.environ["NETPLUGIN_STATE_DIR"])
p = HostPortPlugin()
if sys.argv[1] in ("init", "node"):
    print(getattr(p, sys.argv[1])(ctx))
else:
    print(getattr(p, sys.argv[1])(PodRef(*sys.argv[2:5]), ctx))
"""


@pytest.fixture
def netns(tmp_path: Path) -> Iterator[str]:
    name = f"np{secrets.token_hex(3)}hp"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def call(netns: str, kind: str, tmp: Path, action: str, *pod: str, **env: str) -> subprocess.CompletedProcess[str]:
    exe = [str(BASH)] if kind == "bash" else [sys.executable, "-c", _NATIVE]
    full = {**os.environ, "NETPLUGIN_STATE_DIR": str(tmp), "PYTHONPATH": str(REPO), **env}
    return subprocess.run(["ip", "netns", "exec", netns, *exe, action, *pod], env=full, capture_output=True,
                          text=True, timeout=60)  # fmt: skip


def nft(netns: str, *args: str) -> str:
    return subprocess.run(["ip", "netns", "exec", netns, "nft", *args], capture_output=True, text=True).stdout


@pytest.mark.parametrize("kind", ["bash", "native"])
def test_records_rebuild_the_table_and_teardown_removes_one_pod(netns: str, tmp_path: Path, kind: str) -> None:
    assert call(netns, kind, tmp_path, "init").returncode == 0
    pods = {"web": ("tcp/8080/80 udp/53/5353", "10.201.9.2,fd00:10:201:9::2"), "db": ("tcp/5432/5432", "10.201.9.3")}
    for name, (ports, ips) in pods.items():
        r = call(netns, kind, tmp_path, "setup", "default", name, f"infra-{name}",
                 NETPLUGIN_HOST_PORTS=ports, NETPLUGIN_PREV_IPS=ips)  # fmt: skip
        assert r.returncode == 0, r.stderr
    before = nft(netns, "list", "table", *TABLE.split())
    subprocess.run(["ip", "netns", "exec", netns, "nft", "flush", "ruleset"], check=True)
    r = call(netns, "native", tmp_path, "init")  # the native init rebuilds from either's records
    assert r.returncode == 0, r.stderr
    assert nft(netns, "list", "table", *TABLE.split()) == before
    r = call(netns, kind, tmp_path, "teardown", "default", "web", "infra-web")
    assert r.returncode == 0, r.stderr
    after = nft(netns, "list", "table", *TABLE.split())
    assert chain_name("infra-web") not in after and "8080" not in after
    assert chain_name("infra-db") in after and "tcp . 5432 : jump" in after
    assert not (tmp_path / "hostport" / chain_name("infra-web")).exists()
    assert call(netns, kind, tmp_path, "teardown", "default", "web", "infra-web").returncode == 0  # idempotent


@pytest.mark.parametrize("kind", ["bash", "native"])
def test_repair_puts_back_a_flushed_pods_rules_once(netns: str, tmp_path: Path, kind: str) -> None:
    """The contract's repair: what was lost comes back and is reported; a second repair changes nothing."""
    assert call(netns, kind, tmp_path, "init").stdout.count("repair") == 1  # declared in the mask
    r = call(netns, kind, tmp_path, "setup", "default", "web", "infra-web",
             NETPLUGIN_HOST_PORTS="tcp/8080/80", NETPLUGIN_PREV_IPS="10.201.9.2")  # fmt: skip
    assert r.returncode == 0, r.stderr
    before = nft(netns, "list", "table", *TABLE.split())
    subprocess.run(["ip", "netns", "exec", netns, "nft", "flush", "ruleset"], check=True)
    first = call(netns, kind, tmp_path, "repair", "default", "web", "infra-web")
    assert first.returncode == 0 and "hostport: " in first.stdout, first
    assert nft(netns, "list", "table", *TABLE.split()) == before
    again = call(netns, kind, tmp_path, "repair", "default", "web", "infra-web")
    assert again.returncode == 0 and again.stdout.strip() in ("", "()"), again
    assert nft(netns, "list", "table", *TABLE.split()) == before


@pytest.mark.parametrize("kind", ["bash", "native"])
@pytest.mark.parametrize(
    ("ports", "ips", "said"),
    [
        pytest.param("tcp/8080/80/fd00::1", "10.201.9.2", "no IPv6 address", id="ipv6-host-ip-ipv4-pod"),
        pytest.param("tcp/8080/80/10.0.0.5", "fd00:10:201:9::2", "no IPv4 address", id="ipv4-host-ip-ipv6-pod"),
        pytest.param("tcp/8080/80/fe80::1%eth0", "fd00:10:201:9::2", "hostIP", id="scoped-host-ip"),
    ],
)
def test_a_mapping_that_would_map_nothing_is_refused_and_holds_no_port(
    netns: str, tmp_path: Path, kind: str, ports: str, ips: str, said: str
) -> None:
    assert call(netns, kind, tmp_path, "init").returncode == 0
    r = call(netns, kind, tmp_path, "setup", "default", "web", "infra-web",
             NETPLUGIN_HOST_PORTS=ports, NETPLUGIN_PREV_IPS=ips)  # fmt: skip
    assert r.returncode != 0 and said in r.stderr, r
    assert "8080" not in nft(netns, "list", "table", *TABLE.split())  # the port is free for another pod
    assert not (tmp_path / "hostport" / chain_name("infra-web")).exists()
    other = call(netns, kind, tmp_path, "setup", "default", "db", "infra-db",
                 NETPLUGIN_HOST_PORTS="tcp/8080/80", NETPLUGIN_PREV_IPS="10.201.9.3")  # fmt: skip
    assert other.returncode == 0, other.stderr


def test_the_rebuild_of_1000_mappings_is_one_transaction(netns: str, tmp_path: Path) -> None:
    records = tmp_path / "hostport"
    records.mkdir()
    for i in range(500):  # 500 pods, 2 mappings each
        chain = chain_name(f"infra-{i}")
        maps = parse_env(f"tcp/{20000 + i}/80 udp/{30000 + i}/53")
        rules = pod_rules(chain, maps, [f"10.201.{i // 250}.{i % 250 + 2}"])
        (records / chain).write_text(f"default/p{i} infra-{i}\ntcp.{20000 + i} udp.{30000 + i}\n" + "\n".join(rules))
    script = rebuild_script(str(records))
    done = subprocess.run(["ip", "netns", "exec", netns, "nft", "-f", "-"], input=script, capture_output=True,
                          text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr[-500:]
    assert nft(netns, "list", "map", *TABLE.split(), "ports").count(": jump pod_") == 1000


def test_the_daemon_rebuilds_the_table_from_the_records_at_every_start(netns: str, tmp_path: Path) -> None:
    records = tmp_path / "state" / "hostport"
    records.mkdir(parents=True)
    chain = chain_name("infra-web")
    rules = pod_rules(chain, parse_env("tcp/8080/80"), ["10.201.9.2"])
    (records / chain).write_text("default/web infra-web\ntcp.8080\n" + "\n".join(rules) + "\n")
    # the pod is live (recorded, its netns there): the daemon's gc at start keeps its rules
    store = StateStore(str(tmp_path / "state"))
    pod = PodRef("default", "web", "infra-web")
    store.begin(pod, "netplugin.io/hostport", "builtin:hostport:1", f"/run/netns/{netns}")
    store.complete(pod, "10.201.9.2")
    cfg = tmp_path / "netplugin.yaml"
    cfg.write_text(f"plugins: [netplugin.io/hostport]\nstate_dir: {tmp_path}/state\nrun_dir: {tmp_path}/run\n"
                   f"plugin_dir: {tmp_path}\nhost: none\nmetrics_address: none\n")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_")}
    env.update(NETPLUGIN_CONFIG=str(cfg), PYTHONPATH=str(REPO))
    for start in (1, 2):  # the second start: init ran this boot already, the table is rebuilt anyway
        subprocess.run(["ip", "netns", "exec", netns, "nft", "flush", "ruleset"], check=True)
        argv = ["ip", "netns", "exec", netns, sys.executable, "-m", "netplugin", "serve"]
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while "tcp . 8080 : jump " + chain not in nft(netns, "list", "map", *TABLE.split(), "ports"):
                assert proc.poll() is None and time.monotonic() < deadline, f"start {start}: no rebuild"
                time.sleep(0.1)
            assert "dnat ip to 10.201.9.2:80" in nft(netns, "list", "chain", *TABLE.split(), chain)
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0


def test_gc_forgets_the_hostports_of_a_pod_no_longer_recorded(netns: str, tmp_path: Path) -> None:
    infra = f"np{secrets.token_hex(3)}i1"
    subprocess.run(["ip", "netns", "add", infra], check=True)  # the pod's netns, by netns_template
    try:
        cfg = tmp_path / "netplugin.yaml"
        cfg.write_text(
            f"plugins: [netplugin.io/bridge, netplugin.io/hostport]\nstate_dir: {tmp_path}/state\n"
            f"run_dir: {tmp_path}/run\nplugin_dir: {tmp_path}\nhost: none\nenv:\n  NETPLUGIN_BRIDGE_NAME: npbrhp\n"
            "  NETPLUGIN_BRIDGE_SUBNET: 10.201.9.0/24\n  NETPLUGIN_HOST_PORTS: tcp/8080/80\n"
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_")}
        env.update(NETPLUGIN_CONFIG=str(cfg), PYTHONPATH=str(REPO))

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            argv = ["ip", "netns", "exec", netns, sys.executable, "-m", "netplugin", *args]
            return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)

        done = cli("setup", "default", "web", infra)
        assert done.returncode == 0, done.stderr
        records = tmp_path / "state" / "hostport"
        gone = chain_name("infra-gone")  # rules and a record left by a pod whose own record is gone
        rules = pod_rules(gone, parse_env("tcp/9090/90"), ["10.201.9.77"])
        (records / gone).write_text("default/gone infra-gone\ntcp.9090\n" + "\n".join(rules) + "\n")
        script = [f"add chain {TABLE} {gone}", *rules, f"add element {TABLE} ports {{ tcp . 9090 : jump {gone} }}"]
        subprocess.run(["ip", "netns", "exec", netns, "nft", "-f", "-"], check=True, text=True,
                       input="\n".join(script) + "\n")  # fmt: skip
        done = cli("gc")
        assert done.returncode == 0, done.stdout + done.stderr
        table = nft(netns, "list", "table", *TABLE.split())
        assert gone not in table and "9090" not in table and not (records / gone).exists(), table
        assert chain_name(infra) in table and "tcp . 8080 : jump" in table  # the recorded pod keeps its rules
        assert cli("teardown", "default", "web", infra).returncode == 0
        assert chain_name(infra) not in nft(netns, "list", "table", *TABLE.split())
    finally:
        subprocess.run(["ip", "netns", "del", infra], check=False)
