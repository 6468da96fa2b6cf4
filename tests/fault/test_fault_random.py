"""1000 random setup/teardown/status operations over 50 pods, about 10% with an injected plugin fault,
through the library Manager and the real bridge plugin behind a fault-injecting wrapper.

Each faulty operation must fail with the error class its fault implies and leave no process behind.
Every 100 operations, and at the end, ``gc`` runs (faults off) and then the node must agree with
itself and with a model of what the operations did: the recorded pods are exactly the pods with a
live interface (host veth, bridge port) and exactly the pods holding an IPAM address, every address
is held by one of them or free, and they are exactly the pods whose last setup/teardown was a
successful setup. Seeded by ``NETPLUGIN_FAULT_SEED`` (default 4004).
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from typing import Any

import psutil
import pytest

from netplugin.core.errors import PluginError, PluginFailed, PluginOutputError, PluginTimeout
from netplugin.manager.gc import run_gc

from .conftest import BRIDGE, FaultNet, FPod, link_exists

pytestmark = pytest.mark.kernel

SEED = int(os.environ.get("NETPLUGIN_FAULT_SEED", "4004"))
OPS = int(os.environ.get("NETPLUGIN_FAULT_OPS", "1000"))
PODS = 50
FAULT_RATE = 0.10
CHECK_EVERY = 100

# "<action|*> <mode>" in $NETPLUGIN_FAULT_DIR/fault steers the next calls of that action.
FAULTY = r"""#!/usr/bin/env bash
ctl=$NETPLUGIN_FAULT_DIR
mode=none
if [[ $1 != init && -f $ctl/fault ]]; then
    read -r target m < "$ctl/fault" || true
    if [[ $target == "$1" || $target == "*" ]]; then mode=$m; fi
fi
case $mode in
    fail-before) echo "injected failure before $1" >&2; exit 1 ;;
    crash-before) kill -SEGV $$ ;;
    hang-before) sleep 300 ;;
    garbage) echo '{"ip": "not-an-ip"'; exit 0 ;;
esac
"$NETPLUGIN_FAULT_REAL" "$@"
rc=$?
case $mode in
    fail-after) echo "injected failure after $1" >&2; exit 1 ;;
    crash-after) kill -KILL $$ ;;
    hang-after) sleep 300 ;;
    children) sleep 300 & echo $! >> "$ctl/pids" ;;
esac
exit $rc
"""

# mode -> (relative weight, the error it must cause)
MODES: dict[str, tuple[int, type[PluginError]]] = {
    "fail-before": (4, PluginFailed),
    "fail-after": (4, PluginFailed),
    "crash-before": (2, PluginFailed),
    "crash-after": (2, PluginFailed),
    "children": (2, PluginFailed),
    "hang-before": (1, PluginTimeout),
    "hang-after": (1, PluginTimeout),
    "garbage": (2, PluginOutputError),  # status only
}


class Node:
    """What the test knows: the model of which pods should be up, and what is really there."""

    def __init__(self, net: FaultNet, pods: list[FPod]) -> None:
        self.net = net
        self.pods = pods
        self.up: set[str] = set()  # pods whose last setup/teardown was a successful setup
        self.dirty: set[str] = set()  # a failed action: the truth is known again only after gc

    def check(self, normal: Any) -> dict[str, int]:
        report = run_gc(normal)
        assert report.failed == [], report.text()
        self.dirty.clear()
        net = self.net
        store = net.store()
        scan = store.scan()
        assert scan.corrupt == [] and scan.stale_temps == []
        assert all(r.state == "ready" for r in scan.records), [r.state for r in scan.records]
        recorded = {r.ref.infra_id for r in scan.records}
        live = {p.infra_id for p in self.pods if link_exists(p.veth)}
        ports = net.bridge_ports()
        ipam_pods = net.ipam_files("pods")
        ips = net.ipam_files("ips")
        expected = {p.infra_id for p in self.pods if p.name in self.up}
        assert recorded == expected, f"records {sorted(recorded ^ expected)} differ from the model"
        assert live == recorded, f"live interfaces differ from records: {sorted(live ^ recorded)}"
        assert ports == {p.veth for p in self.pods if p.infra_id in live}
        assert set(ipam_pods) == recorded, f"IPAM pods differ from records: {sorted(set(ipam_pods) ^ recorded)}"
        assert set(ips.values()) == recorded and len(ips) == len(recorded), "an address is held by no live pod"
        for r in scan.records:
            addr = ipam_pods[r.ref.infra_id].split()[0].split("/")[0]
            assert ips[addr] == r.ref.infra_id
            assert r.ip in (None, addr), (r.ref, r.ip, addr)
        assert net.plugin_processes() == []
        return {"up": len(recorded), "addresses": len(ips)}


def test_random_operations_with_injected_faults_keep_records_interfaces_and_addresses_in_step(
    fault_net_factory: Any,
) -> None:
    t0 = time.monotonic()
    net: FaultNet = fault_net_factory(plugin="faulty", timeouts={"setup": 10, "teardown": 10, "status": 10,
                                                                 "init": 10})
    ctl = net.root / "faults"
    ctl.mkdir()
    net.extra_env.update(NETPLUGIN_FAULT_DIR=str(ctl), NETPLUGIN_FAULT_REAL=str(BRIDGE))
    net.install("faulty", FAULTY)
    net.write_config()
    normal = net.manager()
    # Hangs are cut short by a Manager with short time limits (same node, same state).
    net.timeouts = {"setup": 1, "teardown": 1, "status": 1, "init": 10}
    net.kill_grace = 0.2
    net.write_config()
    short = net.manager()
    pods = net.add_pods(PODS)
    normal.init()
    node = Node(net, pods)

    rng = random.Random(SEED)
    mode_names = sorted(MODES)
    stats: Counter[str] = Counter()
    for i in range(OPS):
        pod = rng.choice(pods)
        ref = pod.ref()
        op = rng.choices(["setup", "teardown", "status"], weights=[45, 35, 20])[0]
        fault = None
        if rng.random() < FAULT_RATE:
            modes = [m for m in mode_names if m != "garbage" or op == "status"]
            mode = rng.choices(modes, weights=[MODES[m][0] for m in modes])[0]
            target = rng.choices([op, "*"], weights=[4, 1])[0]
            fault = (target, mode)
        where = f"op {i} (seed {SEED}): {op} {pod.name} with fault {fault}"
        (ctl / "pids").unlink(missing_ok=True)
        if fault:
            (ctl / "fault").write_text(f"{fault[0]} {fault[1]}\n")
        else:
            (ctl / "fault").unlink(missing_ok=True)
        m = short if fault and fault[1].startswith("hang") else normal

        error: PluginError | None = None
        result: Any = None
        try:
            result = getattr(m, op)(ref)
        except PluginError as e:
            error = e
        if fault is None:
            assert error is None, f"{where}: {error}"
        else:
            want = MODES[fault[1]][1]
            assert type(error) is want, f"{where}: expected {want.__name__}, got {error!r}"
            stats[f"{op}:{fault[1]}"] += 1
            children = [int(x) for x in (ctl / "pids").read_text().split()] if (ctl / "pids").exists() else []
            for pid in children:
                try:
                    assert psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, f"{where}: {pid} survived"
                except psutil.NoSuchProcess:
                    pass
            assert net.plugin_processes() == [], f"{where}: plugin processes left"
        stats[op] += 1

        if op == "setup":
            node.up.discard(pod.name)
            if error is None:
                node.up.add(pod.name)
                node.dirty.discard(pod.name)
            else:
                node.dirty.add(pod.name)
        elif op == "teardown":
            node.up.discard(pod.name)
            if error is None:
                node.dirty.discard(pod.name)
            else:
                node.dirty.add(pod.name)
        elif error is None and pod.name not in node.dirty:
            if pod.name in node.up:
                assert result is not None and result.ip == net.pod_ip(pod), where
            else:
                assert result is None, f"{where}: a pod that is down has no status"

        if (i + 1) % CHECK_EVERY == 0:
            (ctl / "fault").unlink(missing_ok=True)
            counts = node.check(normal)
            stats["checks"] += 1
            stats["max-up"] = max(stats["max-up"], counts["up"])

    (ctl / "fault").unlink(missing_ok=True)
    node.check(normal)
    for pod in pods:
        if pod.name in node.up:
            status = normal.status(pod.ref())
            ipam_addr = net.ipam_files("pods")[pod.infra_id].split()[0].split("/")[0]
            assert status is not None and status.ip == net.pod_ip(pod) == ipam_addr
    faults = sum(v for k, v in stats.items() if ":" in k)
    print(f"\n{OPS} ops in {time.monotonic() - t0:.1f}s: {dict(stats)}; {faults} faults")
    assert 0.05 * OPS <= faults <= 0.15 * OPS
    assert stats["max-up"] > 5, "the run had pods up at once"
    for pod in pods:
        normal.teardown(pod.ref())
    node.up.clear()
    node.check(normal)
    assert net.ipam_files("ips") == {}
