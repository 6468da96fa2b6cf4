"""A node's pods at once: bursts of concurrent ADD processes, against the kernel floor, on 1 core and on 2.

A node that joins, or takes over a drained node's pods, gets up to its ``maxPods`` (110 by default)
in one wave, and the runtime starts their sandboxes concurrently: one CNI process per pod. This
figure starts ``size`` ADD processes back to back (20, then 110), as a runtime does, and times
the makespan from the first start to the last exit, for:

* A: CNI bridge + host-local v1.10, exec'd as libcni does;
* F: the compiled ``netplugin-cni`` -> the daemon + the bash bridge plugin;
* G: the compiled ``netplugin-cni`` -> the daemon + ``netplugin.io/bridge``;
* X: the bash bridge plugin exec'd directly (no netplugin): what F's plugin costs alone;
* K: the kernel floor (:mod:`bench.kernelfloor`): the native bridge's netlink requests from one
  process, pipelined; K-seq: the same one pod after the other.

Each contender lives in a node netns of its own (its bridge, daemon and host veths), entered as
containerd enters a node; the pod netns are made before timing. Rounds interleave the contenders
(the order rotating) and the core counts: in each round every contender bursts once limited to 1
CPU and once to all of them (``sched_setaffinity``: the benchmark's spawning thread, so every
process it starts, and every thread of a daemon). After each burst its pods are torn down
(untimed, all at once) and the next burst waits until the kernel has deleted every host veth.
"""

from __future__ import annotations

import os
import statistics
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from netplugin.core.netns import entered

from .contenders import LABELS, Contender
from .context import Network, RunContext, bridge_plugin_dir
from .daemon import DaemonOwner
from .harness import Factory, Live, Plan, open_contenders, quiet_gc, stat_row
from .kernelfloor import KERNEL_FLOOR_LABEL, KernelFloor
from .processes import CniContender, DirectBridgeContender, ExecContender
from .report import Figure, Row
from .runtime import RUNTIME_LABELS, ShimContender, empty_plugin_dir
from .util import NETNS_DIR, BenchError, Pod, SubnetPool, ms, node_namespaces, rotate, wait_until

__all__ = ["NODE_BURST_KEYS", "fig_node_burst"]

NODE_BURST_KEYS = ("A", "F", "G", "X", "K")
LABELS_HERE = {
    "A": LABELS["A"],
    "F": RUNTIME_LABELS["F"],
    "G": RUNTIME_LABELS["G"],
    "X": LABELS["X"],
    "K": KERNEL_FLOOR_LABEL,
    "K-seq": "kernel floor, back to back: one pod after the other, one thread",
}
_FIG = "u"  # the networks' name prefix (bridge = tag + "u" + key)


def node_of(net: Network) -> str:
    return f"{NETNS_DIR}/{net.bridge}n"


class InNode(Contender):
    """A contender whose every action runs inside its node netns (its daemon, its processes, its bridge)."""

    def __init__(self, inner: Contender) -> None:
        super().__init__(inner.net)
        self.inner = inner
        self.key = inner.key  # type: ignore[misc]  # an instance attribute shadows the ClassVar on purpose
        self.node = node_of(inner.net)

    @property
    def label(self) -> str:
        return LABELS_HERE[self.key]

    @contextmanager
    def _there(self) -> Iterator[None]:
        with entered(self.node):
            yield

    def start(self) -> None:
        with self._there():
            self.inner.start()

    def setup(self, pod: Pod) -> None:
        with self._there():
            self.inner.setup(pod)

    def teardown(self, pod: Pod) -> None:
        with self._there():
            self.inner.teardown(pod)

    def burst(self, pods: Sequence[Pod]) -> float:
        with self._there():
            return self.inner.burst(pods)

    def drain(self, pods: Sequence[Pod]) -> float:
        with self._there():
            if isinstance(self.inner, ExecContender):
                return self.inner.all_at_once("teardown", pods)
            return self.inner.drain(pods)

    def pids(self) -> list[int]:
        """The long-running processes of this contender (its daemon), to be limited to the round's CPUs."""
        inner = self.inner
        if isinstance(inner, DaemonOwner) and inner.daemon.proc is not None:
            return [inner.daemon.proc.pid]
        return []

    def stop(self) -> None:
        self.inner.stop()


def _in_node(make: Factory) -> Factory:
    return lambda net: InNode(make(net))


FACTORIES: dict[str, Factory] = {
    "A": _in_node(CniContender),
    "F": _in_node(lambda net: ShimContender(net, "F", "bridge", bridge_plugin_dir(net))),
    "G": _in_node(lambda net: ShimContender(net, "G", "netplugin.io/bridge", empty_plugin_dir(net))),
    "X": _in_node(DirectBridgeContender),
    "K": _in_node(lambda net: KernelFloor(net, node_of(net))),
}


def _pin(cpus: set[int], pids: Sequence[int]) -> None:
    """This thread (so every process it starts) and every thread of ``pids`` and of their children
    (a daemon's worker processes) on ``cpus`` only."""
    os.sched_setaffinity(0, cpus)
    for pid in [*pids, *(c for p in pids for c in _children(p))]:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except FileNotFoundError:
            continue
        for tid in tids:
            try:
                os.sched_setaffinity(int(tid), cpus)
            except (ProcessLookupError, FileNotFoundError):
                pass  # a thread that just ended


def _children(pid: int) -> list[int]:
    """The child processes of every thread of ``pid`` (none once it is gone)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return []
    out: list[int] = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
        except FileNotFoundError:
            pass
    return out


def _ports(c: InNode) -> int:
    done = subprocess.run(["ip", "-n", os.path.basename(c.node), "-o", "link", "show", "master", c.net.bridge],
                          capture_output=True, text=True, check=False)  # fmt: skip
    return len(done.stdout.splitlines())


def _settle(c: InNode, pods: Sequence[Pod]) -> None:
    """The burst's pods gone (torn down, their netns removed) and every host veth deleted by the kernel."""
    c.drain(pods)
    c.net.drop_pods(pods)
    if not wait_until(lambda: _ports(c) == 0, timeout=120, interval=0.02):
        raise BenchError(f"{c.key}: host veths still on {c.net.bridge} 120 s after the burst's teardown")


def core_levels() -> list[int]:
    """The CPU counts the bursts run on: 1 and all this process may use (just 1 on a 1-CPU machine)."""
    n = len(os.sched_getaffinity(0))
    return [1, n] if n > 1 else [1]


def fig_node_burst(ctx: RunContext, plan: Plan, keys: Sequence[str], pool: SubnetPool) -> list[Figure]:
    """Bursts of ``plan.node_bursts`` ADD processes (A F G X) and the kernel floor (K, K-seq), per core count."""
    keys = [k for k in NODE_BURST_KEYS if k != "A" or "A" in keys]
    everyone = sorted(os.sched_getaffinity(0))
    levels = core_levels()
    samples: dict[tuple[int, int, str], list[float]] = {}
    live = Live(ctx, "node-burst", keys)
    nodes = [f"{ctx.tag}{_FIG}{k.lower()}n" for k in keys]
    with node_namespaces(nodes), open_contenders(ctx, _FIG, keys, pool, factories=FACTORIES) as cs:
        for k in keys:  # warm-up: bridge creation, init, page cache, outside the bursts
            (p,) = cs[k].net.new_pods(1)
            live.call(k, cs[k].setup, p)
            live.call(k, cs[k].teardown, p)
            cs[k].net.drop_pods([p])
        daemons = [pid for c in cs.values() if isinstance(c, InNode) for pid in c.pids()]
        try:
            for size in plan.node_bursts:
                ctx.progress(f"  node burst: {plan.node_burst_rounds} round(s) of {size} x {len(keys)} contenders "
                             f"x {len(levels)} core count(s)")  # fmt: skip
                for r in range(plan.node_burst_rounds):
                    for cores in rotate(levels, r):
                        _pin(set(everyone[:cores]), daemons)
                        _round(live, cs, samples, size, cores, r)
        finally:
            _pin(set(everyone), daemons)
    return _figures(plan, keys, levels, live, samples)


def _round(live: Live, cs: dict[str, Contender], samples: dict[tuple[int, int, str], list[float]], size: int,
           cores: int, r: int) -> None:  # fmt: skip
    for k in live.order(r):
        c = cs[k]
        assert isinstance(c, InNode)
        runs = [(k, c.burst)]
        if k == "K":
            floor = c.inner
            assert isinstance(floor, KernelFloor)
            runs.append(("K-seq", floor.back_to_back))
        for key, run in runs:
            pods = c.net.new_pods(size)
            with quiet_gc():
                t = live.call(k, run, pods)
            if t is not None:
                samples.setdefault((size, cores, key), []).append(ms(t))
            live.call(k, _settle, c, pods)


def _median(samples: dict[tuple[int, int, str], list[float]], size: int, cores: int, key: str) -> float | None:
    got = samples.get((size, cores, key))
    return statistics.median(got) if got else None


def _figures(plan: Plan, keys: Sequence[str], levels: Sequence[int], live: Live,
             samples: dict[tuple[int, int, str], list[float]]) -> list[Figure]:  # fmt: skip
    rows = [*keys, "K-seq"] if "K" in keys else list(keys)
    top = levels[-1]
    out = []
    for size in plan.node_bursts:
        fig = Figure(
            f"node-burst-{size}",
            f"Node burst: {size} ADD processes at once, in a node netns, {top} CPU(s) "
            f"(makespan, {plan.node_burst_rounds} round(s))",
            "ms", ["median", "min", "max", "per pod", "/ K"], ratio_column="median",
            samples={k: samples.get((size, top, k), []) for k in rows}, unitless=["/ K"],
            params={"burst": size, "rounds": plan.node_burst_rounds, "cores": top},
        )  # fmt: skip
        floor = _median(samples, size, top, "K")
        for k in rows:
            got = samples.get((size, top, k), [])
            med = statistics.median(got) if got else None
            row = stat_row(live, k[0], LABELS_HERE[k], got, ["median", "min", "max"])
            row.key = k
            row.values["per pod"] = None if med is None else med / size
            row.values["/ K"] = None if med is None or not floor else med / floor
            fig.rows.append(row)
        fig.notes = [
            "Every process started back to back (Popen), then all waited for; makespan from the first start to the "
            "last exit. F and G: the compiled shim forwards each call to the daemon, which runs them concurrently. "
            "K: the floor's requests from one thread, pipelined; K-seq: one pod after the other.",
            "/ K = the row's median over the kernel floor's burst (K) of the same size: how far from the physical "
            "limit of this machine each contender is. Where G's burst serialises (the daemon's Python per pod, "
            "one GIL; the kernel's RTNL), measured: docs/benchmarks.md, \"Where a burst serialises in the daemon\".",
        ]
        out.append(fig)
    if len(levels) > 1:
        out.append(_cores_figure(plan, keys, levels, samples))
    return out


def _cores_figure(plan: Plan, keys: Sequence[str], levels: Sequence[int],
                  samples: dict[tuple[int, int, str], list[float]]) -> Figure:  # fmt: skip
    lo, hi = levels[0], levels[-1]
    cols = [f"{lo} CPU", f"{hi} CPUs", "speedup"]
    fig = Figure("node-burst-cores", f"Node burst: {lo} CPU against {hi} (makespan medians)", "ms", cols,
                 unitless=["speedup"], params={"low": lo, "high": hi})
    for size in plan.node_bursts:
        for k in keys:
            a, b = _median(samples, size, lo, k), _median(samples, size, hi, k)
            fig.rows.append(Row(f"{k}-{size}", f"{LABELS_HERE[k]}, {size} at once",
                                {cols[0]: a, cols[1]: b, "speedup": None if a is None or not b else a / b}))
            fig.samples[f"{k}-{size}@{lo}"] = samples.get((size, lo, k), [])
            fig.samples[f"{k}-{size}@{hi}"] = samples.get((size, hi, k), [])
    fig.notes = [
        f"speedup = the makespan on {lo} CPU over that on {hi}: 2.00x would be perfect scaling. The daemon and "
        "every process a contender starts were limited to the CPUs with sched_setaffinity (as taskset does), "
        "in the same rounds, interleaved.",
    ]
    return fig
