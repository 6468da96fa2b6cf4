"""The kubelet's view through a real runtime (issue 18): RunPodSandbox and StopPodSandbox through a private containerd.

Rows, interleaved in one run on one containerd (the one the containerd test suite sets up,
``tests/frontends/cni/containerd.py``; its CRI plugin loads one network config at a time, so each
round switches the network untimed and then runs a block of sandboxes per row, the order rotating):

* A: the stock CNI ``bridge`` + ``host-local`` (containernetworking-plugins), as contender A;
* N: netplugin: the compiled ``netplugin-cni`` (as install.sh installs it) forwarding to
  ``netplugin serve`` with the native bridge (``netplugin.io/bridge``);
* HOST: a host-network sandbox (no network namespace, no CNI call): the floor of the runtime's own
  work (pause container, runc, its shim).

Each RunPodSandbox is timed by the CRI client from request to answer; StopPodSandbox likewise
(the CNI DEL happens there); RemovePodSandbox is not timed.

With containerd 2 (the peer build), a node's pods at once too: ``plan.sandbox_burst`` (110, a
node's maxPods) RunPodSandbox calls issued together, each from a thread of its own released at
the same instant, per row and round (the order rotating): the makespan until the last answer,
and each sandbox's own time (p50, p99). Then all are stopped and removed, untimed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from .contenders import cni_dir, reference_version
from .context import RunContext
from .daemon import health_request
from .harness import Live, Plan, stat_row, wave_row
from .report import Figure
from .util import REPO, BenchError, SubnetPool, ms, rotate

__all__ = ["CONTAINERD_LABELS", "fig_containerd"]

CONTAINERD_LABELS = {
    "A": "containerd + CNI bridge + host-local {version}",
    "N": "containerd + netplugin-cni (compiled) -> daemon + netplugin.io/bridge (native)",
    "HOST": "floor: containerd, host-network sandbox (no CNI call)",
}


def _daemon_config(base: Path, subnet: Any, bridge: str) -> tuple[Path, Path]:
    d = base / "ctd-np"
    (d / "exec").mkdir(parents=True, exist_ok=True)
    for sub in ("", "exec"):
        os.chmod(d / sub, 0o755)
    cfg = d / "netplugin.yaml"
    cfg.write_text(
        "plugin: netplugin.io/bridge\n"
        f"plugin_dir: {d / 'exec'}\nstate_dir: {d / 'state'}\nrun_dir: {d / 'run'}\n"
        "host: none\nmetrics_address: none\nenv:\n"
        f"  NETPLUGIN_BRIDGE_NAME: {bridge}\n  NETPLUGIN_BRIDGE_SUBNET: {subnet}\n"
        "  NETPLUGIN_BRIDGE_IP_FORWARD: 'false'\n"
        "  NETPLUGIN_BRIDGE_BR_NETFILTER: 'false'\n"
    )
    return cfg, d / "run"


def _start_daemon(base: Path, cfg: Path, run_dir: Path) -> subprocess.Popen[bytes]:
    from netplugin.frontends.wire.client import NotSent, exchange

    env = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_")}
    env.update(NETPLUGIN_CONFIG=str(cfg), PYTHONPATH=str(REPO))
    log = open(base / "ctd-daemon.log", "wb")  # noqa: SIM115 -- the daemon writes it until it stops
    proc = subprocess.Popen([sys.executable, "-m", "netplugin", "serve"], env=env, stdout=log, stderr=log)
    log.close()
    sock = str(run_dir / "netplugin.sock")
    deadline = time.monotonic() + 60
    while True:
        try:
            if exchange(sock, health_request(), timeout=10)["ok"]:
                return proc
        except NotSent:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise BenchError(f"netplugin daemon did not start: {(base / 'ctd-daemon.log').read_text()[-2000:]}")
        time.sleep(0.05)


def _shims(base: Path, run_dir: Path) -> Path:
    """The compiled shim (socket fixed at build, the Python entry script its fallback)."""
    from netplugin.frontends.cni.native import build_native
    from netplugin.frontends.entrypoints import install_entry

    python = install_entry("cni", str(base / "ctd-netplugin-cni-python"))
    return Path(build_native(str(base / "ctd-netplugin-cni"), socket=str(run_dir / "netplugin.sock"),
                             fallback=python))  # fmt: skip


def fig_containerd(ctx: RunContext, plan: Plan, pool: SubnetPool, peers: Path | None = None) -> list[Figure]:
    """RunPodSandbox / StopPodSandbox medians for A, N and HOST (see the module docstring).

    ``peers``: containerd 2 from the peer build (scripts/build-peers.sh) instead of Debian's 1.6.
    """
    sys.path.insert(0, str(REPO))
    from tests.frontends.cni.containerd import Containerd, unavailable_reason

    reason = unavailable_reason()
    if reason:
        raise BenchError(f"containerd figure: {reason}")
    per_block, rounds = (2, 2) if plan.quick else (6, 5)
    v = "2" if peers is not None else ""
    base = ctx.workdir / f"containerd{v}"
    base.mkdir(mode=0o755)
    np_bridge, cni_bridge = f"{ctx.tag}cn{v}", f"{ctx.tag}ca{v}"
    np_subnet, cni_subnet = pool.take(24), pool.take(24)
    cfg, run_dir = _daemon_config(base, np_subnet, np_bridge)
    daemon = _start_daemon(base, cfg, run_dir)
    ctd = Containerd(base / "ctd", _shims(base, run_dir), peers=peers)
    ctx.cleanup.push(f"containerd{v} figure", lambda: _close(ctd, daemon, (np_bridge, cni_bridge)))
    for plugin in ("bridge", "host-local"):
        shutil.copy2(f"{cni_dir('A')}/{plugin}", ctd.bin_dir / plugin)
    ctd.start()
    nets = {
        "N": {"cniVersion": "1.0.0", "name": "npbench", "plugins": [
            {"type": "netplugin-cni", "configFile": str(cfg), "runDir": str(run_dir)}]},
        "A": {"cniVersion": "1.0.0", "name": "cnibench", "plugins": [
            {"type": "bridge", "bridge": cni_bridge, "isGateway": True, "ipam": {
                "type": "host-local", "subnet": str(cni_subnet), "dataDir": str(base / "ctd-host-local")}}]},
    }  # fmt: skip
    live = Live(ctx, f"containerd{v}", list(CONTAINERD_LABELS))
    runs: dict[str, list[float]] = {k: [] for k in CONTAINERD_LABELS}
    stops: dict[str, list[float]] = {k: [] for k in CONTAINERD_LABELS}
    for r in range(rounds + 1):  # round 0 warms up each row (pause image, init, bridges): not kept
        for k in live.order(r):
            if k in nets:
                live.call(k, ctd.use_network, nets[k])
            got = live.call(k, _block, ctd, k, per_block)
            if got is not None and r > 0:
                runs[k] += got[0]
                stops[k] += got[1]
    from netplugin.frontends.wire.client import exchange

    bursts: list[Figure] = []
    if peers is not None:
        bursts.append(_bursts(ctx, plan, ctd, nets))
    served = exchange(str(run_dir / "netplugin.sock"), health_request(), timeout=10)["result"]["requests"]
    return [*_figures(live, runs, stops, per_block, rounds, served, v), *bursts]


def _burst(ctd: Any, key: str, n: int) -> tuple[float, list[float]]:
    """``n`` RunPodSandbox at once: (makespan, each call's time), ms; then every sandbox stopped and removed."""
    gate = threading.Event()
    done: list[tuple[int, float, str | None, str]] = []
    lock = threading.Lock()
    host = key == "HOST"

    def one(i: int) -> None:
        uid = str(uuid.uuid4())
        gate.wait()
        t0 = time.perf_counter()
        sid: str | None = None
        err = ""
        try:
            sid = ctd.run_pod_sandbox("burst", f"b{uid[:8]}", uid, host_network=host)
        except Exception as e:  # grpc.RpcError: the row fails, after every sandbox is cleaned up
            err = str(e)[:300]
        with lock:
            done.append((i, time.perf_counter() - t0, sid, err))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    time.sleep(0.05)  # every thread waiting at the gate
    t0 = time.perf_counter()
    gate.set()
    for t in threads:
        t.join()
    makespan = ms(time.perf_counter() - t0)
    sids = [sid for _, _, sid, _ in done if sid]

    def gone(sid: str) -> None:
        ctd.stop(sid)
        ctd.remove(sid)

    cleaners = [threading.Thread(target=gone, args=(sid,)) for sid in sids]
    for t in cleaners:
        t.start()
    for t in cleaners:
        t.join()
    errors = [err for _, _, _, err in done if err]
    if errors:
        raise BenchError(f"{len(errors)} of {n} RunPodSandbox failed; first: {errors[0]}")
    return makespan, [ms(d) for _, d, _, _ in done]


def _bursts(ctx: RunContext, plan: Plan, ctd: Any, nets: dict[str, Any]) -> Figure:
    n, rounds = plan.sandbox_burst, plan.node_burst_rounds
    live = Live(ctx, "containerd2-burst", list(CONTAINERD_LABELS))
    makespans: dict[str, list[float]] = {k: [] for k in CONTAINERD_LABELS}
    each: dict[str, list[float]] = {k: [] for k in CONTAINERD_LABELS}
    ctx.progress(f"  containerd 2: {rounds} round(s) of {n} RunPodSandbox at once x {len(CONTAINERD_LABELS)} rows")
    for r in range(rounds):
        for k in rotate(list(CONTAINERD_LABELS), r):
            if k in live.failed:
                continue
            if k in nets:
                live.call(k, ctd.use_network, nets[k])
            got = live.call(k, _burst, ctd, k, n)
            if got is not None:
                makespans[k].append(got[0])
                each[k] += got[1]
    cols = ["median", "min", "max", "per pod", "p50 each", "p99 each"]
    fig = Figure("containerd2-burst", f"containerd 2: {n} RunPodSandbox at once (makespan, {rounds} round(s))", "ms",
                 cols, ratio_column="median", samples=makespans, params={"burst": n, "rounds": rounds})  # fmt: skip
    for k, label in CONTAINERD_LABELS.items():
        name = label.format(version=reference_version("A"))
        fig.rows.append(wave_row(live, k, name, makespans[k], each[k], n, ("p50 each", "p99 each")))
    fig.notes = [
        f"{n} threads of the benchmark, released together, each one RunPodSandbox (the CRI client's time from "
        "request to answer: p50 and p99 each, over every round); makespan from the release to the last answer. "
        "Between rounds every sandbox is stopped and removed, untimed; the network config is switched before "
        "each row's burst.",
    ]
    return fig


def _block(ctd: Any, key: str, n: int) -> tuple[list[float], list[float]]:
    run_t: list[float] = []
    stop_t: list[float] = []
    for _ in range(n):
        uid = str(uuid.uuid4())
        t0 = time.perf_counter()
        sid = ctd.run_pod_sandbox("bench", f"p{uid[:8]}", uid, host_network=key == "HOST")
        run_t.append(ms(time.perf_counter() - t0))
        t0 = time.perf_counter()
        ctd.stop(sid)
        stop_t.append(ms(time.perf_counter() - t0))
        ctd.remove(sid)
    return run_t, stop_t


def _close(ctd: Any, daemon: subprocess.Popen[bytes], bridges: tuple[str, ...]) -> None:
    try:
        ctd.close()
    finally:
        if daemon.poll() is None:
            daemon.terminate()
            daemon.wait(60)
        for b in bridges:
            if os.path.exists(f"/sys/class/net/{b}"):
                subprocess.run(["ip", "link", "del", b], capture_output=True, timeout=60)


def _figures(live: Live, runs: dict[str, list[float]], stops: dict[str, list[float]], n: int, rounds: int,
             served: int, v: str) -> list[Figure]:  # fmt: skip
    cols = ["median", "p90"]
    name = f"containerd {v}" if v else "containerd"
    fig_run = Figure(f"containerd{v}-run", f"{name} RunPodSandbox ({n} x {rounds} per row, interleaved)", "ms",
                     cols, ratio_column="median", samples=runs)  # fmt: skip
    fig_stop = Figure(f"containerd{v}-stop", f"{name} StopPodSandbox ({n} x {rounds} per row, interleaved)", "ms",
                      cols, ratio_column="median", samples=stops)  # fmt: skip
    for fig, data in ((fig_run, runs), (fig_stop, stops)):
        labels = {k: label.format(version=reference_version("A")) for k, label in CONTAINERD_LABELS.items()}
        rows = [stat_row(live, k, labels[k], data[k], cols) for k in CONTAINERD_LABELS]
        floor = next((r.values.get("median") for r in rows if r.key == "HOST"), None)
        for row in rows:
            med = row.values.get("median")
            row.values["above floor"] = None if med is None or floor is None else med - floor
        fig.columns = [*cols, "above floor"]
        fig.rows = rows
    fig_run.notes = [
        "Timed by the CRI client around the RPC alone; the network config is switched between blocks, untimed "
        "(containerd's CRI plugin loads one at a time), and round 0 (warm-up) is not kept. N's daemon answered "
        f"{served} requests (the compiled shim's frames), so its calls were served by the daemon.",
        "above floor = median - HOST's median: what the network costs the sandbox start.",
    ]
    return [fig_run, fig_stop]
