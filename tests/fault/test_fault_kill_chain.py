"""SIGKILL of the netplugin CLI running the chain ``[bridge, bandwidth]`` at seeded moments: between
the two members (in either direction) and anywhere inside one. After ``netplugin gc`` every pod is
either fully set up (record ``ready`` with both members ready, veth, eth0, address, the ifb and the
qdiscs of the bandwidth member) or fully gone (none of those), no plugin process is left, and the
next setup succeeds.

Landing a kill *between* two members is made deterministic: each member is the real plugin behind
a wrapper that, when the trial's control file names it and the action, stops its caller (SIGSTOP)
as it exits; the test then SIGKILLs the stopped caller, so the member has finished and the next has
not started. Every pod is shaped: the config passes the CNI bandwidth capability's variables.
Reproducible from ``NETPLUGIN_FAULT_SEED`` (default 4004).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import pytest

from .conftest import BRIDGE, FaultNet, FPod, link_exists

pytestmark = pytest.mark.kernel

SEED = int(os.environ.get("NETPLUGIN_FAULT_SEED", "4004"))
TRIALS = int(os.environ.get("NETPLUGIN_FAULT_CHAIN_TRIALS", "24"))
PODS = 4
BANDWIDTH = Path(BRIDGE).parents[1] / "bandwidth" / "bandwidth"
WRAPPER = """#!/usr/bin/env bash
"{real}" "$@"
rc=$?
if [ "$rc" = 0 ] && [ "$(cat "{ctl}" 2>/dev/null)" = "$NETPLUGIN_PLUGIN $1" ]; then
    kill -STOP "$PPID"
fi
exit "$rc"
"""
# Which member finishes first, per action: the kill lands between it and the next.
FIRST = {"setup": "bridge", "teardown": "bandwidth"}


def _ifb(pod: FPod) -> str:
    out = subprocess.run(["bash", "-c", f'source <(sed -n "/^ifb_name()/,/^}}/p" {BANDWIDTH}); '
                          'ifb_name "$1"; echo "$IFB"', "_", pod.infra_id], capture_output=True, text=True,
                         check=True)
    return out.stdout.strip()


def _tbf(dev: str) -> bool:
    r = subprocess.run(["tc", "qdisc", "show", "dev", dev, "root"], capture_output=True, text=True)
    return "tbf" in r.stdout


def chain_state(net: FaultNet, pod: FPod) -> str:
    """'up' or 'down', asserting that every piece of both members agrees."""
    rec = net.store().get(pod.ref())
    ifb = _ifb(pod)
    pieces = {
        "record": rec is not None,
        "veth": link_exists(pod.veth),
        "ipam": pod.infra_id in net.ipam_files("pods"),
        "ifb": link_exists(ifb),
        "tbf-in": link_exists(pod.veth) and _tbf(pod.veth),
        "tbf-out": link_exists(ifb) and _tbf(ifb),
    }
    assert len(set(pieces.values())) == 1, f"{pod.name} is half set up: {pieces}"
    if rec is None:
        return "down"
    assert rec.state == "ready" and [(m.plugin, m.state) for m in rec.chain] == [
        ("bridge", "ready"), ("bandwidth", "ready")], rec
    assert net.pod_ip(pod) == rec.ip
    return "up"


def test_sigkill_between_and_inside_chain_members_then_gc_leaves_nothing_behind(fault_net_factory: Any) -> None:
    net: FaultNet = fault_net_factory(
        plugins=["bridge", "bandwidth"],
        extra_env={"NETPLUGIN_BANDWIDTH_INGRESS_RATE": "50000000", "NETPLUGIN_BANDWIDTH_EGRESS_RATE": "20000000"},
    )
    ctl = net.root / "stop-after"
    for name, real in (("bridge", BRIDGE), ("bandwidth", BANDWIDTH)):
        net.install(name, WRAPPER.format(real=real, ctl=ctl))
    pods = net.add_pods(PODS)
    lib = net.manager()
    lib.setup(pods[0].ref())  # calibrate: how long one chain action takes here, now
    t0 = time.monotonic()
    lib.teardown(pods[0].ref())
    lib.setup(pods[0].ref())
    total = time.monotonic() - t0
    lib.teardown(pods[0].ref())

    rng = random.Random(SEED)
    outcomes: Counter[str] = Counter()
    gc_reasons: Counter[str] = Counter()
    for trial in range(TRIALS):
        pod = rng.choice(pods)
        action = rng.choice(["setup", "teardown"])
        between = rng.random() < 0.5
        delay = rng.uniform(0, total * 0.6)
        where = f"trial {trial} (seed {SEED}): {action} of {pod.name}, kill " + (
            f"between the members after {FIRST[action]}" if between else f"{delay * 1000:.0f} ms after start")
        if action == "setup":
            lib.teardown(pod.ref())
        else:
            lib.setup(pod.ref())
        ctl.write_text(f"{FIRST[action]} {action}\n" if between else "")

        p = subprocess.Popen(net.cli_argv(action, *pod.argv), env=net.cli_env, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            if between:
                end = time.monotonic() + 60
                while p.poll() is None and psutil.Process(p.pid).status() != psutil.STATUS_STOPPED:
                    assert time.monotonic() < end, f"{where}: the caller never stopped"
                    time.sleep(0.002)
            else:
                time.sleep(delay)
            killed = p.poll() is None
            if killed:
                p.send_signal(signal.SIGKILL)
        finally:
            _, err = p.communicate(timeout=120)
        ctl.write_text("")
        outcomes[("between" if between else "inside") + ("-killed" if killed else "-finished")] += 1
        if not killed:
            assert p.returncode == 0, f"{where}: {err!r}"
        if between:
            rec = net.store().get(pod.ref())
            assert rec is not None, where
            states = [m.state for m in rec.chain]
            # setup: bridge ran (its record says setting-up), bandwidth never started;
            # teardown: bandwidth finished, but its end is written after it exits: the kill came first
            assert states == (["setting-up", "pending"] if action == "setup" else ["ready", "ready"]), where

        r = net.cli("-o", "json", "gc")
        assert r.returncode == 0, f"{where}: gc failed: {r.stdout} {r.stderr}"
        for a in json.loads(r.stdout)["actions"]:
            assert a["outcome"] == "done", f"{where}: {a}"
            gc_reasons[a["reason"]] += 1
        for q in pods:
            state = chain_state(net, q)
            if q == pod:
                outcomes[f"{action}->{state}"] += 1
        assert net.plugin_processes() == [], where
        lib.setup(pod.ref())
        assert chain_state(net, pod) == "up", where

    for pod in pods:
        assert net.cli("teardown", *pod.argv).returncode == 0
        assert chain_state(net, pod) == "down"
    assert net.ipam_files("ips") == {} and net.ipam_files("pods") == {}
    print(f"\nchain kill trials: {dict(outcomes)}; gc: {dict(gc_reasons)}")
    assert outcomes["between-killed"] >= 4 and outcomes["inside-killed"] >= 3
    assert gc_reasons["its setup was interrupted"] >= 2 and gc_reasons["its teardown was interrupted"] >= 2
