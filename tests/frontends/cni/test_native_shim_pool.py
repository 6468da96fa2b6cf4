"""The compiled netplugin-cni's calls through the daemon's worker processes (frontends/daemon/callpool).

A burst of calls that meet one another runs in the daemon's worker processes as well as its own
threads; the scriptable plugin writes its caller's pid to ``parents.log``, so each test sees which
process ran each call. Every call must still answer as the daemon answers alone, be counted once
in ``/metrics``, survive its worker's death (the shim falls back), and leave no worker behind.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from netplugin.frontends.daemon.callpool import MAX_POOL, pool_size
from tests.frontends.cni.daemonworld import World
from tests.support.waits import WITHIN, wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")

#: calls at once: more than the daemon's own turn and its workers together on this machine
AT_ONCE = 6


@pytest.mark.parametrize(
    ("cpus", "workers"), [(1, 0), (2, 2), (4, 4), (MAX_POOL, MAX_POOL), (MAX_POOL + 8, MAX_POOL)]
)
def test_one_worker_per_cpu_none_on_one_cpu_and_at_most_max_pool(cpus: int, workers: int) -> None:
    assert pool_size(cpus) == workers


@pytest.fixture
def pooled(world: World) -> World:
    """``world``'s daemon started, with all its workers ready (none on a one-CPU machine: skipped)."""
    if pool_size() == 0:
        pytest.skip("one CPU: the daemon starts no worker processes (see the table test above)")
    world.start_daemon()
    wait_for(lambda: len(world.health()["workers"]) == pool_size(), "every worker ready", WITHIN)
    return world


def _pod_env(i: int) -> dict[str, str]:
    return {
        "CNI_CONTAINERID": f"feed{i:012x}",
        "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE=web;K8S_POD_NAME=web-{i}",
    }


def _submit(ex: ThreadPoolExecutor, world: World, shim: Path, command: str) -> list[Future[Any]]:
    """AT_ONCE calls of the compiled ``shim``, one per pod, all started at once."""
    return [
        ex.submit(world.shim, command, world.conf(), [str(shim)], NETPLUGIN_SOCKET=world.socket, **_pod_env(i))
        for i in range(AT_ONCE)
    ]


def _burst(world: World, shim: Path, command: str) -> list[Any]:
    with ThreadPoolExecutor(AT_ONCE) as ex:
        return [f.result() for f in _submit(ex, world, shim, command)]


def _parents(fake: Any, action: str) -> dict[str, int]:
    """infra id -> pid of the process that ran ``action`` for it (the last such call)."""
    log = fake.dir / "parents.log"
    lines = log.read_text().split("\n") if log.exists() else []
    return {f[1]: int(f[2]) for f in (line.split() for line in lines) if len(f) == 3 and f[0] == action}


def _counted(world: World, name: str) -> dict[str, float]:
    address = world.health()["metrics_address"]
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {
        s.labels.get("operation_type", ""): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == name
    }


def test_a_burst_runs_in_the_workers_too_and_answers_and_counts_as_one_process(
    pooled: World, fake: Any, shims: dict[str, Path]
) -> None:
    world = pooled
    workers = set(world.health()["workers"])
    assert world.proc is not None
    fake.set("setup", block=1)  # calls overlap: each holds its slot a second
    adds = _burst(world, shims["native"], "ADD")
    for add in adds:
        assert add.returncode == 0, add
        assert json.loads(add.stdout)["ips"] == [{"address": "10.201.5.7/24", "gateway": "10.201.5.1", "interface": 0}]
    ran = _parents(fake, "setup")
    assert sorted(ran) == sorted(_pod_env(i)["CNI_CONTAINERID"] for i in range(AT_ONCE)), ran
    assert set(ran.values()) <= workers | {world.proc.pid}, (ran, workers, world.proc.pid)
    assert set(ran.values()) & workers, f"no call ran in a worker process: {ran}"
    assert fake.env_of("setup")["NP_TEST_ORIGIN"] == "daemon"  # no shim fell back
    # Each call counted once, in the daemon's metrics, wherever it ran.
    assert _counted(world, "kubelet_network_plugin_operations_total")["set_up_pod"] == AT_ONCE
    # Each action's log line is in the daemon's log (workers share its stderr).
    text = world.log.read_text()
    for i in range(AT_ONCE):
        assert f"setup web/web-{i}: ok" in text, text[-3000:]
    dels = _burst(world, shims["native"], "DEL")
    assert [(d.returncode, d.stdout) for d in dels] == [(0, b"")] * AT_ONCE, dels
    assert list((Path(world.state_dir) / "pods").glob("*.json")) == []
    assert _counted(world, "kubelet_network_plugin_operations_total")["tear_down_pod"] == AT_ONCE


def test_a_worker_killed_during_a_call_is_replaced_and_its_call_done_by_the_shim(
    pooled: World, fake: Any, shims: dict[str, Path]
) -> None:
    world = pooled
    workers = set(world.health()["workers"])
    fake.set("setup", block=3)
    with ThreadPoolExecutor(AT_ONCE) as ex:
        futures = _submit(ex, world, shims["native"], "ADD")

        def a_worker_busy() -> int | None:
            busy = set(_parents(fake, "setup").values()) & workers
            return min(busy) if busy else None

        victim = wait_for(a_worker_busy, "a call running in a worker", WITHIN)
        os.kill(victim, signal.SIGKILL)
        adds = [f.result() for f in futures]
    for add in adds:
        assert add.returncode == 0, add  # the killed worker's call: answered U, then made by the shim itself
    assert world.proc is not None
    fell_back = [i for i, pid in _parents(fake, "setup").items() if pid not in workers | {world.proc.pid}]
    assert fell_back, "the killed worker's call was not made again by its shim"
    after = wait_for(
        lambda: (w := set(world.health()["workers"])) and victim not in w and len(w) == pool_size() and w,
        "a new worker in the killed one's place",
        WITHIN,
    )
    assert victim not in after
    assert f"worker process {victim} ended during a call" in world.log.read_text()


def test_the_workers_end_with_the_daemon(pooled: World) -> None:
    workers = pooled.health()["workers"]
    assert len(workers) == pool_size()
    pooled.stop_daemon()
    assert pooled.proc is not None and pooled.proc.returncode == 0, pooled.log.read_text()[-2000:]
    deadline = time.monotonic() + WITHIN
    while any(os.path.exists(f"/proc/{pid}") for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in workers if os.path.exists(f"/proc/{pid}")], "a worker outlived the daemon"


def test_a_reload_starts_workers_with_the_new_settings_and_ends_the_old(
    pooled: World, fake: Any, shims: dict[str, Path]
) -> None:
    world = pooled
    old = set(world.health()["workers"])
    assert world.proc is not None
    world.config.write_text(world.config.read_text().replace("env:\n", "env:\n  NP_TEST_GENERATION: 'two'\n"))
    world.proc.send_signal(signal.SIGHUP)
    new = wait_for(
        lambda: (w := set(world.health()["workers"])) and not (w & old) and len(w) == pool_size() and w,
        "the new settings' workers",
        WITHIN,
    )
    wait_for(lambda: not [p for p in old if os.path.exists(f"/proc/{p}")], "the old workers ended", WITHIN)
    assert world.log.read_text().count(f"starting {pool_size()} worker process(es) for new settings") == 1
    fake.set("setup", block=1)
    adds = _burst(world, shims["native"], "ADD")
    assert [a.returncode for a in adds] == [0] * AT_ONCE, adds
    in_workers = [pid for pid in _parents(fake, "setup").values() if pid in new]
    assert in_workers, "no call ran in the new workers"
    assert fake.env_of("setup")["NP_TEST_GENERATION"] == "two"


def test_a_reload_that_keeps_the_running_settings_keeps_the_workers(pooled: World) -> None:
    """A key that needs a restart keeps the running settings whole: the same workers serve on."""
    world = pooled
    old = set(world.health()["workers"])
    assert world.proc is not None
    world.config.write_text(world.config.read_text().replace("metrics_address: 127.0.0.1:0", "metrics_address: none"))
    world.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: world.health()["reloads"] == 1, "the reload done", WITHIN)
    assert "metrics_address" in world.health()["settings"]
    assert set(world.health()["workers"]) == old
    assert "worker process(es) for new settings" not in world.log.read_text()
