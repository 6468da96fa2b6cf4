"""How a figure measures: its contenders, run interleaved, with failures recorded instead of fatal.

Interleaving: within a figure, work alternates between contenders round-robin (per pod, per
round or per level), the order rotating every time, so that a slow spell of the machine lands
on all of them alike. Every figure builds its own networks (bridge, subnet, scratch dir) and
daemons with :func:`open_contenders`, which removes them in ``finally``. The loops every figure
shares are here once: :func:`per_pod_series` (setups, then teardowns, pod by pod),
:func:`burst_rounds` (concurrent setups, then a drain) and :func:`interleaved` (any measurement,
run after run).
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from .contenders import Contender
from .context import Network, RunContext, bridge_plugin_dir
from .daemon import DaemonContender
from .floor import FloorContender
from .processes import CliContender, CniContender, CniDebianContender, DirectBridgeContender
from .report import Row
from .util import BenchError, Pod, Stats, SubnetPool, T, ms, rotate

__all__ = [
    "FACTORIES",
    "TRIVIAL_PLUGIN",
    "Factory",
    "Live",
    "Plan",
    "burst_rounds",
    "interleaved",
    "open_contenders",
    "per_pod_series",
    "quiet_gc",
    "stat_row",
    "timed",
    "wave_row",
]

Factory = Callable[[Network], Contender]

FACTORIES: dict[str, Factory] = {
    "A": CniContender,
    "B": CliContender,
    "C": lambda net: DaemonContender(net, "C", "bridge", plugin_dir=bridge_plugin_dir(net)),
    "D": lambda net: DaemonContender(net, "D", "netplugin.io/bridge"),
    "E": FloorContender,
    "X": DirectBridgeContender,
    "O": CniDebianContender,
}

TRIVIAL_PLUGIN = "#!/bin/sh\n# benchmark plugin: does nothing, successfully\nexit 0\n"


@dataclass(frozen=True)
class Plan:
    """Sizes of one run."""

    quick: bool
    pods: int = 60
    burst: int = 20
    burst_rounds: int = 7
    #: the node-scale bursts (ADD processes at once) and their rounds, each on 1 CPU and on all
    node_bursts: tuple[int, ...] = (20, 110)
    node_burst_rounds: int = 5
    #: RunPodSandbox calls at once through containerd 2 (its rounds: node_burst_rounds)
    sandbox_burst: int = 110
    #: the replicas of the kubelet cluster's Deployment (its rounds: node_burst_rounds)
    deployment_replicas: int = 110
    drain: int = 100
    drain_rounds: int = 3
    levels: tuple[int, ...] = (10, 100, 500, 1000)
    level_samples: int = 40
    cold_runs: int = 30
    cold_warmups: int = 3
    overhead_runs: int = 100

    @classmethod
    def make(cls, quick: bool, pods: int | None) -> Plan:
        if quick:
            return cls(True, pods or 3, burst=5, burst_rounds=1, drain=5, drain_rounds=1, levels=(2, 8),
                       level_samples=3, cold_runs=5, cold_warmups=1, overhead_runs=5, node_bursts=(3,),
                       node_burst_rounds=1, sandbox_burst=3, deployment_replicas=3)
        return cls(False, pods or 60)


def timed(fn: Callable[[Pod], object], pod: Pod) -> float:
    """Milliseconds ``fn(pod)`` took."""
    t0 = time.perf_counter()
    fn(pod)
    return ms(time.perf_counter() - t0)


@contextmanager
def quiet_gc() -> Iterator[None]:
    # a collection in the benchmark process would land on whichever contender runs at that moment
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@contextmanager
def open_contenders(
    ctx: RunContext,
    fig: str,
    keys: Sequence[str],
    pool: SubnetPool,
    prefixlen: int = 24,
    shared: dict[str, str] | None = None,
    factories: dict[str, Factory] | None = None,
) -> Iterator[dict[str, Contender]]:
    """The contenders ``keys`` of figure ``fig``, started, each on its network (or ``shared``'s owner's).

    On the way out every contender is stopped and every network closed, even when some fail.
    """
    nets: dict[str, Network] = {}
    conts: dict[str, Contender] = {}
    make = factories or FACTORIES
    try:
        for k in keys:
            owner = (shared or {}).get(k, k)
            if owner not in nets:
                nets[owner] = Network(ctx, f"{fig}{owner.lower()}", pool.take(prefixlen))
            conts[k] = make[k](nets[owner])
        for c in conts.values():
            c.start()
        yield conts
    finally:
        for c in conts.values():
            try:
                c.stop()
            except Exception as e:  # the networks must still be closed
                ctx.progress(f"  warning: stopping {c.key}: {e}")
        for n in nets.values():
            n.close()


class Live:
    """The contenders of a figure still working: one that fails is reported and left out of the rest.

    A failure is a finding, so it is recorded (and shown in its row) instead of ending the run.
    """

    def __init__(self, ctx: RunContext, fig: str, keys: Sequence[str]) -> None:
        self.ctx = ctx
        self.fig = fig
        self.keys = list(keys)
        self.failed: dict[str, str] = {}

    def order(self, i: int) -> list[str]:
        return rotate([k for k in self.keys if k not in self.failed], i)

    def call(self, key: str, fn: Callable[..., T], *args: Any) -> T | None:
        if key in self.failed:
            return None
        try:
            return fn(*args)
        except BenchError as e:
            self.failed[key] = str(e)
            self.ctx.problems.append(f"{self.fig}: contender {key} failed and was left out of the rest: {e}")
            self.ctx.progress(f"  {key} FAILED: {str(e)[:300]}")
            return None

    def timed(self, key: str, fn: Callable[[Pod], object], pod: Pod) -> float | None:
        return self.call(key, timed, fn, pod)

    def note(self, key: str, n: int) -> str:
        if key not in self.failed:
            return ""
        return f"FAILED after {n} sample(s): {self.failed[key][:160]}"


def stat_row(live: Live, key: str, label: str, samples: Sequence[float], cols: Sequence[str],
             note: str = "", **extra: float | None) -> Row:
    """A row of stats (median, p90, min, max as ``cols`` asks); empty when there are no samples."""
    values: dict[str, float | None] = {c: None for c in cols}
    if samples:
        st = Stats.of(samples)
        values.update({c: getattr(st, c) for c in cols if hasattr(st, c)})
    values.update(extra)
    fail = live.note(key, len(samples))
    return Row(key, label, values, "; ".join(x for x in (note, fail) if x))


def wave_row(live: Live, key: str, label: str, makespans: Sequence[float], each: Sequence[float], n: int,
             each_cols: tuple[str, str]) -> Row:  # fmt: skip
    """A row of a wave of ``n`` at once: the makespans' median, min and max, the median per pod, and
    each member's own time over every round at p50 and p99 (named ``each_cols``)."""
    row = stat_row(live, key, label, makespans, ("median", "min", "max"))
    med = row.values.get("median")
    row.values["per pod"] = None if med is None else med / n
    lat = sorted(each)
    row.values[each_cols[0]] = statistics.median(lat) if lat else None
    row.values[each_cols[1]] = lat[min(len(lat) - 1, round(0.99 * (len(lat) - 1)))] if lat else None
    return row


def per_pod_series(
    live: Live, cs: Mapping[str, Contender], n: int
) -> tuple[dict[str, float | None], dict[str, list[float]], dict[str, list[float]]]:
    """Per-pod setups, then teardowns, interleaved: (first setup, setups, teardowns) in ms per contender.

    Each contender gets ``n + 1`` fresh pods; the first setup (bridge creation, init, a cold page
    cache) is timed apart, then ``n`` setups and their ``n`` teardowns alternate between the
    contenders, the order rotating per pod. A pod whose setup failed is not torn down.
    """
    keys = list(live.keys)
    first: dict[str, float | None] = {}
    setups: dict[str, list[float]] = {k: [] for k in keys}
    teardowns: dict[str, list[float]] = {k: [] for k in keys}
    pods = {k: cs[k].net.new_pods(n + 1) for k in keys}
    with quiet_gc():
        for k in keys:
            first[k] = live.timed(k, cs[k].setup, pods[k][0])
        for i in range(1, n + 1):
            for k in live.order(i):
                t = live.timed(k, cs[k].setup, pods[k][i])
                if t is not None:
                    setups[k].append(t)
        for i in range(1, n + 1):
            for k in live.order(i):
                if i <= len(setups[k]):
                    t = live.timed(k, cs[k].teardown, pods[k][i])
                    if t is not None:
                        teardowns[k].append(t)
        for k in live.order(0):
            live.call(k, cs[k].teardown, pods[k][0])
    return first, setups, teardowns


def burst_rounds(live: Live, cs: Mapping[str, Contender], out: dict[str, list[float]], size: int, rounds: int) -> None:
    """``rounds`` bursts of ``size`` concurrent setups for every contender in ``out``, each followed by a drain.

    The makespans (ms) go to ``out``; the order of the contenders rotates per round, and each
    burst's pods are drained (untimed) and their netns removed before the next contender runs.
    """
    for r in range(rounds):
        for k in live.order(r):
            if k not in out:
                continue
            c = cs[k]
            pods = c.net.new_pods(size)
            with quiet_gc():
                t = live.call(k, c.burst, pods)
            if t is not None:
                out[k].append(ms(t))
            live.call(k, c.drain, pods)
            c.net.drop_pods(pods)


def interleaved(runs: int, measures: Mapping[str, Callable[[int], float]]) -> dict[str, list[float]]:
    """``runs`` samples of every measure (called with the run's number), round-robin, the order rotating."""
    samples: dict[str, list[float]] = {v: [] for v in measures}
    with quiet_gc():
        for i in range(runs):
            for v in rotate(list(measures), i):
                samples[v].append(measures[v](i))
    return samples
