"""Hostile node, round 4: owned state rebuilt from what must exist, keepers that never die silently,
repair that converges.

Each test runs the shipped daemon in a node netns of its own (:class:`bench.chaosnode.ChaosNode`),
sometimes with a bash chain member of the test's (a ``repair`` that fails or re-triggers itself, a
``node`` action that hangs) or an ``nft`` on the daemon's PATH that slows the table's rebuild.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.chaosnode import BUILTIN_CHAIN, ChaosNode, veth_of
from tests.support.nettest import kernel_gate

pytestmark = pytest.mark.kernel

NFT = "/usr/sbin/nft"
TABLE = ("inet", "netplugin_hostport")

def member(opt_in: str, node: str = ":", repair: str = ":") -> str:
    """A bash member whose setup and teardown do nothing, declaring ``opt_in``, running ``node``/``repair``."""
    return (f"#!/bin/bash\ncase $1 in\n  init) echo '{{\"actions\":[\"setup\",\"teardown\",\"{opt_in}\"]}}' ;;\n"
            f"  node) {node} ;;\n  repair) {repair} ;;\nesac\nexit 0\n")  # fmt: skip


class Node(ChaosNode):
    """A ChaosNode with more settings, bash members of the test's own, and a PATH for the daemon."""

    def __init__(self, *, env: dict[str, str] | None = None, members: dict[str, str] | None = None,
                 settings: str = "", path: str | None = None, **kw: object) -> None:  # fmt: skip
        super().__init__(**kw)  # type: ignore[arg-type]
        self.extra_env = env or {}
        self.members = members or {}
        self.settings = settings
        self.path = path

    def _node(self) -> None:
        super()._node()
        conf = self.dir / "netplugin.yaml"
        text = conf.read_text()
        if self.members:
            plugins = self.dir / "plugins"
            for name, script in self.members.items():
                (plugins / name).mkdir(parents=True)
                (plugins / name / name).write_text(script)
                (plugins / name / name).chmod(0o755)
            plugins.chmod(0o755)
            text = text.replace(f"plugin_dir: {Path(__file__).resolve().parents[2] / 'exec_plugins'}",
                                f"plugin_dir: {plugins}")  # fmt: skip
        text += "".join(f"  {k}: '{v}'\n" for k, v in self.extra_env.items()) + self.settings
        conf.write_text(text)

    def _start(self) -> None:
        old = os.environ.get("PATH", "")
        if self.path:
            os.environ["PATH"] = f"{self.path}:{old}"
        try:
            super()._start()
        finally:
            os.environ["PATH"] = old

    def nft(self, *args: str, check: bool = True) -> str:
        done = subprocess.run(["ip", "netns", "exec", self.ns, NFT, *args], capture_output=True, text=True, timeout=60)
        assert not check or done.returncode == 0, done.stderr
        return done.stdout

    def hostport_shape(self) -> tuple[set[str], dict[str, str]] | None:
        """(the pod chains, port -> chain) of the table in the kernel; None: no table."""
        done = subprocess.run(["ip", "netns", "exec", self.ns, NFT, "-j", "list", "table", *TABLE],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        if done.returncode != 0:
            return None
        chains, ports = set(), {}
        for item in json.loads(done.stdout)["nftables"]:
            if "chain" in item and item["chain"]["name"].startswith("pod_"):
                chains.add(item["chain"]["name"])
            if "map" in item:
                for key, verdict in item["map"].get("elem", []):
                    *ip, proto, port = key["concat"]  # a hostIP's key: ip@ as the records write it
                    ports[f"{proto}.{port}" + (f"@{ip[0]}" if ip else "")] = verdict["jump"]["target"]
        return chains, ports

    def recorded_shape(self) -> tuple[set[str], dict[str, str]]:
        """(the recorded pods' chains, port -> chain) from the hostport records."""
        records = self.dir / "state" / "hostport"
        chains, ports = set(), {}
        for f in records.glob("pod_*"):
            lines = f.read_text().splitlines()
            chains.add(f.name)
            ports.update({k: f.name for k in (lines[1].split() if len(lines) > 1 else [])})
        return chains, ports

    def guard_ok(self) -> bool:
        out = self.nft("list", "chain", *TABLE, "guard", check=False)
        return "ip daddr 127.0.0.0/8 ip saddr != 127.0.0.0/8" in out and " drop" in out

    def cli(self, *args: str, alone: bool = False) -> subprocess.CompletedProcess[str]:
        """``netplugin ARGS`` in the node; ``alone``: without the daemon (use_daemon: never)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_")}
        if alone:
            env["NETPLUGIN_USE_DAEMON"] = "never"
        argv = ["ip", "netns", "exec", self.ns, sys.executable, "-m", "netplugin", "--config",
                str(self.dir / "netplugin.yaml"), *args]  # fmt: skip
        return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)

    def pods_condition(self) -> dict[str, str]:
        rows = self.request({"op": "pods"})["result"]["listing"]["pods"]
        return {p["name"]: p["condition"] for p in rows}


@pytest.fixture
def gate(request: pytest.FixtureRequest) -> None:
    kernel_gate(request)


# --- defect 1: the route_localnet guard never missing -------------------------------------------------


def test_the_guard_comes_back_after_a_flush_when_no_pod_holds_a_hostport(gate: None) -> None:
    """route_localnet stays on for the bridge after its hostPort pod is gone; a flush then must not
    leave the bridge without kube-proxy's guard (CVE-2020-8558)."""
    with Node(pods=2, env={"NETPLUGIN_HOSTPORT_LOCALHOST": "true"}) as node:
        p0 = node.pods[0][0]
        sysctl = subprocess.run(["ip", "netns", "exec", node.ns, "cat",
                                 f"/proc/sys/net/ipv4/conf/{node.bridge}/route_localnet"],
                                capture_output=True, text=True, timeout=60).stdout.strip()  # fmt: skip
        assert sysctl == "1"
        node.request({"op": "teardown", "namespace": "chaos", "pod": "p0", "infra_id": p0})
        assert node.recorded_shape() == (set(), {})
        node.nft("flush", "ruleset")
        node.wait(node.guard_ok, 10, "the route_localnet guard with no hostPort record")
        assert node.hostport_shape() == (set(), {})


# --- defect 2: a flush never fails a later hostPort setup --------------------------------------------


@pytest.mark.parametrize("chain", [BUILTIN_CHAIN, ("netplugin.io/bridge", "hostport")], ids=["built-in", "bash"])
def test_a_hostport_setup_after_a_flush_with_no_record_works(gate: None, chain: tuple[str, ...]) -> None:
    """The table is made by the setup that finds it gone (and by the daemon, with no record at all)."""
    with Node(pods=1, chain=chain) as node:
        node.request({"op": "teardown", "namespace": "chaos", "pod": "p0", "infra_id": node.pods[0][0]})
        time.sleep(1)  # the keeper's look at the teardown's nftables change is over (it holds the table's lock)
        node.proc.send_signal(19)  # SIGSTOP: no keeper puts the table back; the setup alone must cope
        try:
            node.nft("flush", "ruleset")
            setup = node.cli("setup", "chaos", "p0", node.pods[0][0], alone=True)
            assert setup.returncode == 0, setup
        finally:
            node.proc.send_signal(18)  # SIGCONT
        assert node.hostport_shape() == node.recorded_shape() and node.guard_ok()
        node.request({"op": "teardown", "namespace": "chaos", "pod": "p0", "infra_id": node.pods[0][0]})
        node.nft("flush", "ruleset")
        node.wait(lambda: node.hostport_shape() == (set(), {}), 10, "the table made by the daemon with no record")
        assert node.guard_ok()


# --- defect 3: keepers survive, and health/doctor say when one does not keep --------------------------


def test_the_node_keeper_survives_a_record_that_vanishes_and_keeps_repairing(gate: None) -> None:
    """A hostport record listed then gone (a dangling name: a teardown racing the rebuild) used to kill
    the node keeper's thread: no flush and no route was repaired again, and health said 0."""
    with Node(pods=2) as node:
        (node.dir / "state" / "hostport" / "pod_000000000000").symlink_to(node.dir / "gone")
        node.nft("flush", "ruleset")
        node.wait(node.tables_ok, 10, "the tables after the first flush")
        node.time_to_repair("nft flush")
        node.time_to_repair("route flush")
        health = node.cli("health")
        assert health.returncode == 0, health
        assert node.health()["keeper_problems"] == []
        assert "Traceback" not in node.log.read_text()


def test_health_and_doctor_report_a_keeper_stuck_past_its_interval(gate: None) -> None:
    """A member's node action that hangs holds the node keeper's pass past node_resync: health exits 7
    naming it, doctor's keepers check is a problem."""
    members = {"hang": member("node", node="sleep 20")}
    with Node(pods=1, chain=("netplugin.io/bridge", "hang"), members=members,
              settings="node_resync: 1\ntimeouts: {init: 30}\n") as node:  # fmt: skip
        node.wait(lambda: node.cli("health").returncode == 7, 20, "health exit 7")
        health = node.cli("health")
        assert "netplugin-nodes has not completed a pass" in health.stdout, health
        from netplugin.core.config import load_config
        from netplugin.frontends.checks import Node as Checked
        from netplugin.frontends.checks import check_keepers

        got = check_keepers(Checked(load_config(str(node.dir / "netplugin.yaml"), environ={}), "", (),
                                    health=node.health()))  # fmt: skip
        assert not got.ok and "netplugin-nodes" in (got.problem or ""), got


# --- defect 4: a failing repair is retried and the pod shown broken ------------------------------------


def test_a_pod_whose_repair_keeps_failing_is_broken_then_retried_until_it_works(gate: None, tmp_path: Path) -> None:
    marker = tmp_path / "fail"  # while it is there, every repair of the member fails
    script = member("repair", repair=f'[[ -e {marker} ]] && exit 1; echo "other: repaired"')
    marker.touch()
    try:
        with Node(pods=2, chain=("netplugin.io/bridge", "failer"), members={"failer": script}) as node:
            p0 = node.pods[0][0]
            node.ip("link", "set", "dev", veth_of(p0), "type", "bridge_slave", "hairpin", "off")
            node.wait(lambda: node.pods_condition().get("p0") == "broken", 15, "p0 shown broken")
            problems = [p for p in node.health()["node"]["problems"] if p["kind"] == "broken_pod"]
            assert len(problems) == 1 and "keeps failing" in problems[0]["reason"], problems
            assert node.pods_condition()["p1"] == "ready"
            marker.unlink()
            node.wait(lambda: node.pods_condition().get("p0") == "ready", 15, "p0 ready once its repair works")
            assert node.port_ok(p0)
            assert "failed (try 3" in node.log.read_text()
    finally:
        marker.unlink(missing_ok=True)


# --- defect 5: no DNAT resurrected, gc compares the kernel with the records ---------------------------


SLOW_NFT = f"""#!/bin/bash
# the rebuild of the hostPort table (a transaction deleting it) takes 2 s while $SLOW exists
if [[ $1 == -f && $2 == - ]]; then
    script=$(cat)
    if [[ -e {{slow}} && $script == *"delete table inet netplugin_hostport"* ]]; then sleep 2; fi
    exec {NFT} -f - <<<"$script"
fi
exec {NFT} "$@"
"""


def test_a_rebuild_racing_a_teardown_brings_no_dnat_back(gate: None, tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    slow = tmp_path / "slow"
    (bindir / "nft").write_text(SLOW_NFT.replace("{slow}", str(slow)))
    (bindir / "nft").chmod(0o755)
    with Node(pods=2, path=str(bindir)) as node:
        p0 = node.pods[0][0]
        assert node.hostport_shape() == node.recorded_shape() != (set(), {})
        slow.touch()
        node.nft("flush", "ruleset")
        time.sleep(0.5)  # the daemon's rebuild has read the records and waits in nft
        answer = node.request({"op": "teardown", "namespace": "chaos", "pod": "p0", "infra_id": p0})
        assert answer["ok"], answer
        slow.unlink()
        node.wait(lambda: node.hostport_shape() is not None, 10, "the table back")
        time.sleep(1)
        assert node.recorded_shape() == (set(), {})
        assert node.hostport_shape() == (set(), {}), "the torn-down pod's DNAT came back"


def test_gc_removes_hostport_rules_no_record_accounts_for(gate: None) -> None:
    with Node(pods=1) as node:
        time.sleep(1)  # the keeper's look at the setups' nftables changes is over (it holds the table's lock)
        node.proc.send_signal(19)  # SIGSTOP: gc alone must find it
        try:
            node.nft("add", "chain", *TABLE, "pod_00000000beef")
            node.nft("add", "element", *TABLE, "ports", "{ tcp . 19999 : jump pod_00000000beef }")
            gc = node.cli("gc", alone=True)
        finally:
            node.proc.send_signal(18)
        assert gc.returncode == 0, gc
        assert node.hostport_shape() == node.recorded_shape() != (set(), {}), gc.stdout


# --- defect 12: a repair that re-triggers itself is cut off --------------------------------------------


def test_a_member_whose_repair_retriggers_itself_is_cut_off_and_reported(gate: None) -> None:
    body = ('h=$NETPLUGIN_PREV_HOST_INTERFACE; ip link set dev "$h" type bridge_slave hairpin off; '
            'ip link set dev "$h" type bridge_slave hairpin on; echo "port: hairpin of $h set again"')  # fmt: skip
    looper = member("repair", repair=body)
    with Node(pods=2, chain=("netplugin.io/bridge", "looper"), members={"looper": looper}) as node:
        p0 = node.pods[0][0]
        node.ip("link", "set", "dev", veth_of(p0), "type", "bridge_slave", "hairpin", "off")

        def looping() -> list[dict[str, str]]:
            return [p for p in node.health()["node"]["problems"] if p["kind"] == "repair_loop"]

        node.wait(lambda: len(looping()) == 1, 30, "the loop reported")
        assert f"chaos/p0/{p0}" in looping()[0]["reason"] and "looper" in looping()[0]["reason"]
        calls = node.health()["node"]["pod_repair_calls"]
        time.sleep(2)
        assert node.health()["node"]["pod_repair_calls"] == calls  # cut off: no more rounds
        assert node.port_ok(p0) and node.port_ok(node.pods[1][0])
