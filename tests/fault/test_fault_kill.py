"""SIGKILL of the netplugin CLI at seeded random moments of setup and teardown, with the real bridge
plugin and real network namespaces. After ``netplugin gc`` every pod is either fully set up (record
``ready``, host veth, eth0 with its address, one IPAM address) or fully gone (none of those), no
plugin process is left, and the next setup of the same pod succeeds.

The plugin runs in its own session, so killing netplugin leaves it running: gc must wait for it (or
stop it at its deadline) before tearing the pod down, or the orphaned setup would recreate what the
teardown removed.

A third of the trials use ``slow``: the bridge plugin behind a 1 s sleep, so that the kill lands
while the plugin has yet to do its work and gc really meets the orphaned plugin (the bare bridge
plugin is done within the 150 ms or more gc needs to start).

Reproducible: the trial plan (pod, plugin, action, kind of moment, and the moment's place within the
action, as a fraction of its measured duration) comes from ``NETPLUGIN_FAULT_SEED`` (default 4004).
Durations are measured as the run goes, because load on the machine changes them; what the scheduler
does within a run may still differ between runs, and every outcome must satisfy the same invariants.
"""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import subprocess
import time
from collections import Counter
from typing import Any

import pytest

from .conftest import BRIDGE, FaultNet, FPod, link_exists

pytestmark = pytest.mark.kernel

SEED = int(os.environ.get("NETPLUGIN_FAULT_SEED", "4004"))
TRIALS = int(os.environ.get("NETPLUGIN_FAULT_TRIALS", "60"))
PODS = 6
SLOW = """#!/usr/bin/env bash
sleep 1
exec "$NETPLUGIN_FAULT_REAL" "$@"
"""
# The record shows these states from just before the plugin runs until it is done.
BEGUN = {"setup": "setting-up", "teardown": "tearing-down"}


def _ip_link_eth0(pod: FPod) -> bool:
    r = subprocess.run(["ip", "-n", pod.netns, "-o", "link", "show", "dev", "eth0"], capture_output=True,
                       text=True, timeout=30)
    return r.returncode == 0


def pod_state(net: FaultNet, pod: FPod) -> str:
    """'up' or 'down', asserting that every piece agrees (no half-set-up pod)."""
    rec = net.store().get(pod.ref())
    ipam_pods = net.ipam_files("pods")
    owned = sorted(addr for addr, owner in net.ipam_files("ips").items() if owner == pod.infra_id)
    pieces = {
        "record": rec is not None,
        "veth": link_exists(pod.veth),
        "eth0": _ip_link_eth0(pod),
        "ipam-pod": pod.infra_id in ipam_pods,
        "ipam-ip": bool(owned),
    }
    assert len(set(pieces.values())) == 1, f"{pod.name} is half set up: {pieces}"
    if rec is None:
        return "down"
    assert rec.state == "ready", rec
    assert len(owned) == 1
    assert ipam_pods[pod.infra_id].split()[0].split("/")[0] == owned[0]
    assert net.pod_ip(pod) == owned[0]
    return "up"


def check_everything(net: FaultNet, pods: list[FPod]) -> dict[str, str]:
    states = {p.name: pod_state(net, p) for p in pods}
    up = {p for p in pods if states[p.name] == "up"}
    assert net.bridge_ports() == {p.veth for p in up}
    owners = set(net.ipam_files("ips").values())
    assert owners == {p.infra_id for p in up}, "every allocated address belongs to a set-up pod"
    assert sorted(r.ref.name for r in net.store().scan().records) == sorted(p.name for p in up)
    leftovers = [f for f in os.listdir(net.state_dir / "pods") if ".tmp." in f] if (
        net.state_dir / "pods").exists() else []
    assert leftovers == []
    assert net.plugin_processes() == []
    return states


def record_state(net: FaultNet, pod: FPod) -> str | None:
    path = net.store().path_for(pod.ref())
    try:
        with open(path) as f:
            return str(json.load(f)["state"])
    except (OSError, ValueError, KeyError):
        return None


def calibrate(net: FaultNet, pod: FPod, plugin: str) -> dict[str, tuple[float, float]]:
    """Per action: (time from start until the process exits, time it runs after the record shows it began)."""
    out: dict[str, list[tuple[float, float]]] = {"setup": [], "teardown": []}
    for _ in range(3):
        for action in ("setup", "teardown"):
            t0 = time.monotonic()
            p = subprocess.Popen(net.cli_argv("--plugin", plugin, action, *pod.argv), env=net.cli_env,
                                 stdin=subprocess.DEVNULL)
            seen = None
            while p.poll() is None:
                if seen is None and record_state(net, pod) == BEGUN[action]:
                    seen = time.monotonic() - t0
                time.sleep(0.0005)
            total = time.monotonic() - t0
            assert p.returncode == 0
            out[action].append((total, total - (seen if seen is not None else total * 0.7)))
    return {a: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)) for a, v in out.items()}


def test_sigkill_during_setup_and_teardown_then_gc_leaves_nothing_behind(
    fault_net_factory: Any,
) -> None:
    net: FaultNet = fault_net_factory(extra_env={"NETPLUGIN_FAULT_REAL": str(BRIDGE)})
    net.install("slow", SLOW)
    pods = net.add_pods(PODS)
    assert net.cli("init").returncode == 0
    timing = calibrate(net, pods[0], "bridge")
    # Load on the machine changes during a run: follow it with the durations of recent unkilled runs.
    recent: dict[str, list[float]] = {a: [t[0]] * 3 for a, t in timing.items()}
    share_after_begin = {a: t[1] / t[0] for a, t in timing.items()}
    lib = net.manager()
    rng = random.Random(SEED)
    outcomes: Counter[str] = Counter()
    gc_reasons: Counter[str] = Counter()
    orphans_waited = 0

    for trial in range(TRIALS):
        pod = rng.choice(pods)
        plugin = rng.choice(["bridge", "bridge", "slow"])
        action = rng.choice(["setup", "teardown"])
        anywhere = rng.random() < 0.25
        total = statistics.median(recent[action][-5:])
        after_begin = total * share_after_begin[action]
        if plugin == "slow":
            total, after_begin = total + 1.0, after_begin + 1.0
        delay = rng.uniform(0, total * 1.1) if anywhere else rng.uniform(0, after_begin * 1.2)
        where = f"trial {trial} (seed {SEED}): {plugin} {action} of {pod.name}, kill " + (
            f"{delay * 1000:.0f} ms after start" if anywhere else f"{delay * 1000:.0f} ms after the record")

        # The pod starts in the state the action changes.
        if action == "setup":
            lib.teardown(pod.ref())
        else:
            lib.setup(pod.ref())

        started = time.monotonic()
        p = subprocess.Popen(net.cli_argv("--plugin", plugin, action, *pod.argv), env=net.cli_env,
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            if not anywhere:
                while p.poll() is None and record_state(net, pod) != BEGUN[action]:
                    time.sleep(0.0002)
            time.sleep(delay)
            killed = p.poll() is None
            if killed:
                p.send_signal(signal.SIGKILL)
        finally:
            _, err = p.communicate(timeout=120)
        outcomes["killed" if killed else "finished"] += 1
        if not killed:
            assert p.returncode == 0, f"{where}: {err!r}"
            if plugin == "bridge":
                recent[action].append(time.monotonic() - started)

        r = net.cli("-o", "json", "gc")
        assert r.returncode == 0, f"{where}: gc failed: {r.stdout} {r.stderr}"
        for a in json.loads(r.stdout)["actions"]:
            assert a["outcome"] == "done", f"{where}: {a}"
            gc_reasons[a["reason"]] += 1
            orphans_waited += bool(a.get("pids"))

        state = check_everything(net, pods)[pod.name]
        outcomes[f"{action}->{state}"] += 1

        lib.setup(pod.ref())  # the next setup of the same pod succeeds (raises if not)
        assert pod_state(net, pod) == "up", where

    for pod in pods:
        assert net.cli("teardown", *pod.argv).returncode == 0
    check_everything(net, pods)
    assert all(not link_exists(p.veth) for p in pods)
    assert net.ipam_files("ips") == {} and net.ipam_files("pods") == {}

    print(f"\nkill trials: {dict(outcomes)}; gc: {dict(gc_reasons)}; orphans waited for: {orphans_waited}")
    # The plan must have really hit the interesting moments, or this test proves little.
    assert outcomes["killed"] >= TRIALS * 0.3
    assert gc_reasons["its setup was interrupted"] >= 3 and gc_reasons["its teardown was interrupted"] >= 3
    assert orphans_waited >= 3, "too few kills landed while the plugin ran"
