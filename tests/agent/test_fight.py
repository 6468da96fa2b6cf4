"""The fight: for 60 s something deletes the bridge, flushes nftables and flushes netplugin's routes
every 100 ms on a node with pods up; after 10 s of quiet every pod is attached and answering, the
hostPort table is exactly what the records say, and doctor names the fight (with its count) while
the repair log stayed rate-limited.

One 60 s run (the issue's figure); the figures (repairs, losses, time to converge) are printed.
"""

from __future__ import annotations

import subprocess
import time
from collections import Counter

import pytest

from bench.chaosnode import ChaosNode
from netplugin.agent.repairlog import LINES_PER_WINDOW
from netplugin.core.config import load_config
from netplugin.frontends.checks import Node, check_repairs
from tests.agent.test_hostile_keepers import NFT
from tests.agent.test_hostile_keepers import Node as KeptNode
from tests.support.nettest import kernel_gate

pytestmark = pytest.mark.kernel

FIGHT = 60.0
QUIET = 10.0
TICK = 0.1


def _fight(node: ChaosNode) -> int:
    """For FIGHT seconds, three loops at once, each every TICK: the bridge deleted, nftables flushed,
    netplugin's routes flushed. The rounds of the three, summed."""
    loop = f"end=$((SECONDS + {int(FIGHT)})); n=0; while ((SECONDS < end)); do %s; n=$((n + 1)); sleep {TICK}; done"
    loop += "; echo $n"
    breaks = [f"ip link del {node.bridge} 2>/dev/null", f"{NFT} flush ruleset", "ip route flush proto 78"]
    procs = [subprocess.Popen(["ip", "netns", "exec", node.ns, "bash", "-c", loop % b], stdout=subprocess.PIPE,
                              text=True) for b in breaks]  # fmt: skip
    return sum(int(p.communicate(timeout=FIGHT + 60)[0].strip() or 0) for p in procs)


def test_a_60s_fight_then_quiet_leaves_every_pod_attached_and_doctor_naming_it(request: pytest.FixtureRequest) -> None:
    kernel_gate(request)
    with KeptNode(pods=6) as node:
        assert node.bridge_ok() and node.tables_ok() and node.routes_ok()
        start = time.monotonic()
        rounds = _fight(node)
        fought = time.monotonic() - start

        def converged() -> bool:
            return (node.bridge_ok() and node.tables_ok() and node.routes_ok() and node.guard_ok()
                    and node.hostport_shape() == node.recorded_shape())  # fmt: skip

        took = node.wait(converged, QUIET, "every pod attached, the tables and routes back")
        time.sleep(max(0.0, QUIET - took))
        assert converged()
        assert node.recorded_shape() != (set(), {})  # p0's hostPort is recorded, and in the table
        for infra, addr in node.pods:
            assert node.ping(node.ns, addr), f"pod {infra} does not answer the node"
            assert node.ping(infra, "10.206.143.1"), f"pod {infra} does not reach its gateway"
        health = node.health()
        st = health["node"]
        assert health["keeper_problems"] == [] and st["broken"] == {} and st["repair_loops"] == {}, health
        fight = st["longest_fight"]
        repairs = sum(st["repairs"].values())
        print(f"\nfight: {rounds} breakages in {fought:.1f}s; {repairs} repairs ({st['repairs']}), "
              f"{st['repair_incidents']} incident(s), longest {fight['rounds']} rounds in {fight['seconds']}s; "
              f"{st['pod_repair_calls']} pod repairs, {st['kernel_wakeups']} kernel wakeups; converged "
              f"{took:.2f}s after the fight; {st['repair_lines_not_logged']} repair lines not logged")  # fmt: skip
        # doctor names the fight and its count
        checked = check_repairs(Node(load_config(str(node.dir / "netplugin.yaml"), environ={}), "", (), health=health))
        assert not checked.ok and "a fight" in (checked.problem or ""), checked
        assert f"{fight['rounds']} times in a row" in (checked.problem or "")
        # the log stayed rate-limited (a window of a second is in two calendar seconds at most), and
        # said what it left out
        log = node.log.read_text()
        per_second = Counter(line[:19] for line in log.splitlines() if " WARNING repair" in line)
        assert max(per_second.values()) <= 2 * (LINES_PER_WINDOW + 1), per_second.most_common(3)
        assert "Traceback" not in log
        if st["repair_lines_not_logged"]:
            assert "more line(s) not logged" in log
