"""The figures: each runs its contenders interleaved and returns :class:`~bench.report.Figure` objects.

Interleaving: within a figure, work alternates between contenders round-robin (per pod, per
round or per level), the order rotating every time, so that a slow spell of the machine
lands on all of them alike. Every figure builds its own networks (bridge, subnet, scratch
dir) and daemons, and removes them in ``finally``.
"""

from __future__ import annotations

import gc
import re
import statistics
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from .contenders import (
    CNI_BRIDGE,
    CONTENDERS,
    LABELS,
    CliContender,
    CniContender,
    Contender,
    Daemon,
    DaemonContender,
    DirectBridgeContender,
    ExecContender,
    FloorContender,
    Network,
    RunContext,
    bridge_plugin_dir,
    clean_environ,
    install_exec_plugin,
    netplugin_env,
)
from .report import Figure, Row
from .util import REPO, BenchError, Pod, Stats, SubnetPool, T, ms, rotate

__all__ = [
    "FACTORIES",
    "Plan",
    "fig_burst",
    "fig_coldstart",
    "fig_drain",
    "fig_overhead",
    "fig_pods",
    "fig_scale",
]

Factory = Callable[[Network], Contender]

FACTORIES: dict[str, Factory] = {
    "A": CniContender,
    "B": CliContender,
    "C": lambda net: DaemonContender(net, "C", "bridge", plugin_dir=bridge_plugin_dir(net)),
    "D": lambda net: DaemonContender(net, "D", "netplugin.io/bridge"),
    "E": FloorContender,
    "X": DirectBridgeContender,
}

TRIVIAL_PLUGIN = "#!/bin/sh\n# benchmark plugin: does nothing, successfully\nexit 0\n"


@dataclass(frozen=True)
class Plan:
    """Sizes of one run."""

    quick: bool
    pods: int = 60
    burst: int = 20
    burst_rounds: int = 7
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
            return cls(
                True,
                pods or 3,
                burst=5,
                burst_rounds=1,
                drain=5,
                drain_rounds=1,
                levels=(2, 8),
                level_samples=3,
                cold_runs=5,
                cold_warmups=1,
                overhead_runs=5,
            )
        return cls(False, pods or 60)


def _timed(fn: Callable[[Pod], object], pod: Pod) -> float:
    t0 = time.perf_counter()
    fn(pod)
    return ms(time.perf_counter() - t0)


@contextmanager
def _quiet_gc() -> Iterator[None]:
    # a collection in the benchmark process would land on whichever contender runs at that moment
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@contextmanager
def _contenders(
    ctx: RunContext,
    fig: str,
    keys: Sequence[str],
    pool: SubnetPool,
    prefixlen: int = 24,
    shared: dict[str, str] | None = None,
    factories: dict[str, Factory] | None = None,
) -> Iterator[dict[str, Contender]]:
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


def _health_line() -> bytes:
    return b'{"v":1,"op":"health"}\n'


class _Live:
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
        return self.call(key, _timed, fn, pod)

    def note(self, key: str, n: int) -> str:
        if key not in self.failed:
            return ""
        return f"FAILED after {n} sample(s): {self.failed[key][:160]}"


def _row(
    live: _Live,
    key: str,
    label: str,
    samples: Sequence[float],
    cols: Sequence[str],
    note: str = "",
    **extra: float | None,
) -> Row:
    """A row of stats (median, p90, min, max as ``cols`` asks); empty when there are no samples."""
    values: dict[str, float | None] = {c: None for c in cols}
    if samples:
        st = Stats.of(samples)
        values.update({c: getattr(st, c) for c in cols if hasattr(st, c)})
    values.update(extra)
    fail = live.note(key, len(samples))
    return Row(key, label, values, "; ".join(x for x in (note, fail) if x))


# --- 1: per-pod setup and teardown ---------------------------------------------------------------------


def fig_pods(ctx: RunContext, plan: Plan, keys: Sequence[str], pool: SubnetPool) -> list[Figure]:
    n = plan.pods
    # X, the bash plugin without netplugin, shows what of B's and C's time is the plugin itself
    keys = [*keys, "X"] if "B" in keys or "C" in keys else list(keys)
    setups: dict[str, list[float]] = {k: [] for k in keys}
    teardowns: dict[str, list[float]] = {k: [] for k in keys}
    first: dict[str, float | None] = {}
    live = _Live(ctx, "per-pod", keys)
    with _contenders(ctx, "1", keys, pool) as cs:
        pods = {k: c.net.new_pods(n + 1) for k, c in cs.items()}
        ctx.progress(f"  per-pod: 1 warm-up + {n} pods x {len(keys)} contenders")
        with _quiet_gc():
            for k in keys:  # the first setup creates the bridge (and runs init): reported apart
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
    fs = Figure(
        "setup",
        f"Per-pod setup ({n} pods, after one warm-up pod)",
        "ms",
        ["median", "p90", "first"],
        ratio_column="median",
        samples=setups,
        plot="setup.png",
    )
    fs.rows = [_row(live, k, LABELS[k], setups[k], ["median", "p90"], first=first.get(k)) for k in keys]
    fs.notes = [
        "first = the very first setup on a fresh network, not part of the median: for A and B it creates the "
        "bridge (B: netplugin's once-per-boot init); C and D ran init when their daemon started; X ran init "
        "before.",
        "A is an ADD; B a `netplugin setup` process; C and D one request each on a fresh connection "
        "to the daemon, timed by the client (the benchmark); E the netlink requests alone; X the bash plugin "
        "exec'd by the benchmark with the environment netplugin gives it (no ratio target: it shows how much "
        "of B and C is the plugin itself).",
    ]
    ft = Figure(
        "teardown",
        f"Per-pod teardown ({n} pods, netns still present)",
        "ms",
        ["median", "p90"],
        ratio_column="median",
        samples=teardowns,
        plot="teardown.png",
    )
    ft.rows = [_row(live, k, LABELS[k], teardowns[k], ["median", "p90"]) for k in keys]
    ft.notes = ["The kernel's veth deletion (RCU grace periods, ~15-25 ms) dominates every contender's teardown."]
    return [fs, ft]


# --- 2: a burst of concurrent setups --------------------------------------------------------------------------


def fig_burst(ctx: RunContext, plan: Plan, keys: Sequence[str], pool: SubnetPool) -> Figure:
    n, rounds = plan.burst, plan.burst_rounds
    samples: dict[str, list[float]] = {k: [] for k in keys}
    live = _Live(ctx, "burst", keys)
    with _contenders(ctx, "2", keys, pool) as cs:
        for k in keys:  # warm-up: bridge creation and init happen outside the bursts
            (p,) = cs[k].net.new_pods(1)
            live.call(k, cs[k].setup, p)
            live.call(k, cs[k].teardown, p)
            cs[k].net.drop_pods([p])
        ctx.progress(f"  burst: {rounds} round(s) of {n} concurrent setups x {len(keys)} contenders")
        for r in range(rounds):
            for k in live.order(r):
                c = cs[k]
                pods = c.net.new_pods(n)
                with _quiet_gc():
                    t = live.call(k, c.burst, pods)
                if t is not None:
                    samples[k].append(ms(t))
                live.call(k, c.drain, pods)
                c.net.drop_pods(pods)
    fig = Figure(
        "burst",
        f"Burst: {n} setups issued at once (makespan, {rounds} round(s))",
        "ms",
        ["median", "min", "max"],
        ratio_column="median",
        samples=samples,
        plot="burst.png",
    )
    for k in keys:
        note = "one thread: back to back, not concurrent" if k == "E" else ""
        fig.rows.append(_row(live, k, CONTENDERS[k], samples[k], ["median", "min", "max"], note))
    fig.notes = [
        "A and B: every process started back to back (Popen), then all waited for; makespan from the first "
        "start to the last exit. C and D: every request sent at once, each on its own connection; makespan "
        "until the last answer.",
        f"Per pod: A {_per_pod(fig, 'A', n)}, B {_per_pod(fig, 'B', n)}, C {_per_pod(fig, 'C', n)}, "
        f"D {_per_pod(fig, 'D', n)} ms (makespan / {n}).",
    ]
    return fig


def _per_pod(fig: Figure, key: str, n: int) -> str:
    v = fig.value(key, "median")
    return "-" if v is None else f"{v / n:.1f}"


# --- 3: draining pods -------------------------------------------------------------------------------------------


def fig_drain(ctx: RunContext, plan: Plan, keys: Sequence[str], pool: SubnetPool) -> Figure:
    n, rounds = plan.drain, plan.drain_rounds
    # B has no drain of its own: it would be n sequential `netplugin teardown` processes, i.e. n times
    # its per-pod teardown (figure 1), and the slowest part of the run; left out.
    keys = [k for k in keys if k != "B"]
    variants = list(keys)
    if "A" in keys:
        variants.append("A-par")
    if "E" in keys:
        variants.append("E-group")
    samples: dict[str, list[float]] = {v: [] for v in variants}
    live = _Live(ctx, "drain", variants)
    with _contenders(ctx, "3", keys, pool) as cs:
        ctx.progress(f"  drain: {rounds} round(s) of {n} pods x {len(variants)} variants")
        for r in range(rounds):
            pods: dict[str, list[Pod]] = {}
            for v in live.order(r):
                c = cs[v[0]]
                pods[v] = c.net.new_pods(n)
                live.call(v, c.populate, pods[v])
            for v in live.order(r):
                c = cs[v[0]]
                with _quiet_gc():
                    if v == "A-par":
                        assert isinstance(c, ExecContender)
                        t = live.call(v, _exec_all_at_once, c, pods[v])
                    elif v == "E-group":
                        assert isinstance(c, FloorContender)
                        t = live.call(v, c.drain_group, pods[v])
                    else:
                        t = live.call(v, c.drain, pods[v])
                if t is not None:
                    samples[v].append(ms(t))
            for v, ps in pods.items():
                cs[v[0]].net.drop_pods(ps)
    fig = Figure(
        "drain",
        f"Drain: tear down {n} pods ({rounds} round(s))",
        "ms",
        ["median", "min", "max", "per pod"],
        ratio_column="median",
        samples=samples,
        plot="drain.png",
        params={"pods": n, "rounds": rounds},
    )
    how = {
        "A": "sequential DELs, as the target states",
        "A-par": "all DELs started at once",
        "B": "sequential `netplugin teardown` processes",
        "C": "all teardown requests sent at once",
        "D": "all teardown requests sent at once",
        "E": "one RTM_DELLINK per pod, sequential",
        "E-group": "links moved into one link group, one RTM_DELLINK for the group",
    }
    for v in variants:
        per_pod = statistics.median(samples[v]) / n if samples[v] else None
        fig.rows.append(
            _row(live, v, CONTENDERS[v[0]], samples[v], ["median", "min", "max"], how[v], **{"per pod": per_pod})
        )
    fig.notes = [
        "The target compares D's drain with A's sequential DELs (row A). B is not run: the CLI has no drain; "
        "it would be n sequential `netplugin teardown` processes, n times its per-pod teardown above.",
        "Pods were set up (untimed) by each contender's own fastest path just before; their network "
        "namespaces stay until the drain ends (a DEL with the netns present deletes the veth).",
    ]
    return fig


def _exec_all_at_once(c: ExecContender, pods: Sequence[Pod]) -> float:
    from .contenders import _finish, _spawn

    calls = [c.call("teardown", p) for p in pods]
    t0 = time.perf_counter()
    procs = [_spawn(x) for x in calls]
    for p, pod in zip(procs, pods, strict=True):
        _finish(p, f"{c.key} teardown {pod.infra_id}")
    return time.perf_counter() - t0


# --- 4: setup with N pods present ---------------------------------------------------------------------------------

#: a Linux bridge takes at most BR_MAX_PORTS - 1 = 1023 ports (more: "RTNETLINK answers: Exchange full")
BRIDGE_MAX_PORTS = 1023


def fig_scale(ctx: RunContext, plan: Plan, keys: Sequence[str], pool: SubnetPool) -> tuple[Figure, Figure | None]:
    levels, k = plan.levels, plan.level_samples
    if levels[-1] + 2 > BRIDGE_MAX_PORTS:
        raise BenchError(f"{levels[-1]} pods do not fit on one bridge (at most {BRIDGE_MAX_PORTS} ports)")
    # B and C run the same plugin on one node: they share a network (and netplugin's state), and the
    # pods present are set up through the daemon, the fastest path for that plugin.
    shared = {"C": "B"} if "B" in keys and "C" in keys else {}
    samples: dict[str, dict[int, list[float]]] = {key: {lv: [] for lv in levels} for key in keys}
    rss: dict[str, dict[str, float]] = {}
    live = _Live(ctx, "scale", keys)
    # One block per network, one after the other, everything of a block removed before the next: "N pods
    # present" means N on the machine, as on a node, not N per contender times the contenders. Within a
    # block (B and C share one) the contenders alternate; across blocks machine drift does not cancel.
    blocks: list[list[str]] = []
    for key in keys:
        owner = shared.get(key, key)
        block = next((b for b in blocks if shared.get(b[0], b[0]) == owner), None)
        if block is None:
            blocks.append([key])
        else:
            block.append(key)
    for block in blocks:
        owner = shared.get(block[0], block[0])
        with _contenders(ctx, "4", block, pool, prefixlen=21, shared=shared) as cs:
            present = 0
            for key in block:  # warm-up (bridge, init); the pod stays, counted as present
                (p,) = cs[key].net.new_pods(1)
                live.call(key, cs[key].setup, p)
                present += 1
            for key in block:
                v = cs[key].rss()
                if v is not None:
                    rss.setdefault(key, {})["after 1 pod"] = v / 2**20
            # the fastest path that records what the contender records: B's pods go through C's daemon
            pop = "C" if "C" in block else owner
            for lv in levels:
                if not live.order(0) or all(key in live.failed for key in block):
                    break
                t0 = time.monotonic()
                if lv > present and pop not in live.failed:
                    live.call(pop, cs[pop].populate, cs[pop].net.new_pods(lv - present))
                    present = lv
                ctx.progress(
                    f"  scale {'+'.join(block)}: {lv} pods present (populated in "
                    f"{time.monotonic() - t0:.1f}s); measuring {k} setups each"
                )
                new = {key: cs[key].net.new_pods(k) for key in block}
                with _quiet_gc():
                    for i in range(k):
                        for key in rotate([b for b in block if b not in live.failed], i):
                            t = live.timed(key, cs[key].setup, new[key][i])
                            if t is not None:
                                samples[key][lv].append(t)
                                # torn down at once (untimed): N stays N, and a bridge takes only 1023 ports
                                live.call(key, cs[key].teardown, new[key][i])
                for key in block:
                    cs[key].net.drop_pods(new[key])
                    v = cs[key].rss()
                    if v is not None:
                        rss.setdefault(key, {})[f"N={lv}"] = v / 2**20
    cols = [f"N={lv}" for lv in levels]
    fig = Figure(
        "scale",
        f"Per-pod setup with N pods already present (median of {k})",
        "ms",
        [*cols, "growth", "growth beyond E"],
        ratio_column=cols[-1],
        unitless=["growth"],
        samples={f"{key}@{lv}": samples[key][lv] for key in keys for lv in levels},
        plot="scale.png",
    )
    for key in keys:
        vals: dict[str, float | None] = {
            f"N={lv}": statistics.median(samples[key][lv]) if samples[key][lv] else None for lv in levels
        }
        lo, hi = vals[cols[0]], vals[cols[-1]]
        vals["growth"] = hi / lo if lo and hi else None
        e = samples.get("E", {})
        if lo and hi and e and e[levels[0]] and e[levels[-1]] and key != "E":
            vals["growth beyond E"] = (hi - lo) - (statistics.median(e[levels[-1]]) - statistics.median(e[levels[0]]))
        note = "shares B's network" if key in shared else ""
        fail = live.note(key, sum(len(x) for x in samples[key].values()))
        fig.rows.append(Row(key, CONTENDERS[key], vals, "; ".join(x for x in (note, fail) if x)))
    fig.notes = [
        f"growth = median at N={levels[-1]} / median at N={levels[0]} (unitless; target ≤ 1.1 for B, C, D). "
        f"growth beyond E = the row's increase from N={levels[0]} to N={levels[-1]} minus the floor's (ms): "
        "what the contender adds to the kernel's own slow-down.",
        f"N = pods set up on the contender's network (populated untimed by its fastest path). Each measured "
        f"setup is torn down (untimed) right after, so N stays N; {k} setups per level. The contenders run one "
        "after the other (B and C together, alternating), each alone on the machine with its N pods, as on a "
        "node; so ratios to A in this figure come from different minutes, unlike the other figures.",
        "Absolute values here sit above figure 1's: each setup follows a teardown by a few milliseconds, "
        "and the kernel is still finishing that veth's deletion; compare a row with itself across N.",
        "E, the floor, shows what the kernel alone does as pods accumulate (every port added to a bridge "
        "walks the bridge's port list, for example); growth beyond E's is the contender's own.",
        f"A Linux bridge takes at most {BRIDGE_MAX_PORTS} ports (BR_MAX_PORTS; the next port fails with "
        '"Exchange full"): no bridge plugin, reference or netplugin\'s, can hold more pods on one bridge.',
    ]
    if shared:
        fig.notes.append(
            "B and C share one network and one netplugin state (both are netplugin on one node); "
            "its pods present were set up through C's daemon."
        )
    rss_fig = None
    if rss:
        rcols = list(next(iter(rss.values())).keys())
        rss_fig = Figure("rss", "Daemon resident memory (psutil RSS)", "MiB", rcols, plot="rss.png")
        for key, vals2 in rss.items():
            rss_fig.rows.append(Row(key, CONTENDERS[key], {c: vals2.get(c) for c in rcols}))
        rss_fig.notes = [
            "Measured in the scale figure's daemons: after their first pod, then after each level. "
            "A has no long-running process (no ratio)."
        ]
    return fig, rss_fig


# --- 5: CLI cold start --------------------------------------------------------------------------------


def _importtime(argv: list[str], env: dict[str, str]) -> tuple[float, list[tuple[str, float]]]:
    """(total ms of top-level imports, [(module, cumulative ms)] largest first) from ``-X importtime``."""
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    top: list[tuple[str, float]] = []
    for line in done.stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \| ( *)(\S+)", line)
        if m and not m.group(3):
            top.append((m.group(4), int(m.group(2)) / 1000))
    return sum(v for _, v in top), sorted(top, key=lambda x: -x[1])


def fig_coldstart(ctx: RunContext, plan: Plan, keys: Sequence[str], pool: SubnetPool) -> Figure:
    runs = plan.cold_runs
    net = Network(ctx, "5c", pool.take(24))
    daemon: Daemon | None = None
    try:
        env = netplugin_env(net, "", plugin_dir=net.dir / "exec")
        env.pop("NETPLUGIN_PLUGIN")  # no plugin named: kubernetes.io/no-op
        (net.dir / "exec").mkdir(mode=0o755)
        if ctx.cli[0] == sys.executable:
            env["PYTHONPATH"] = str(REPO)
        cni_env = clean_environ()
        cni_env.update(CNI_COMMAND="VERSION", CNI_PATH="/usr/lib/cni")
        # The same CLI on an interpreter started with -S: no .pth start-up hooks (an editable install's
        # finder, a machine's own hooks), only the paths; what a plain install costs without them.
        bare = (
            f"import sys; sys.path[:0] = {[str(REPO), sysconfig.get_paths()['purelib']]!r}; "
            "from netplugin.frontends.cli import main; main()"
        )
        variants: dict[str, Callable[[int], list[str]]] = {
            "B": lambda i: [*ctx.cli, "setup", "bench", f"p-cold-{i}", f"{ctx.tag}-cold-{i}"],
            "B-S": lambda i: [
                sys.executable,
                "-S",
                "-c",
                bare,
                "setup",
                "bench",
                f"p-cold-s-{i}",
                f"{ctx.tag}-cold-s-{i}",
            ],
            "py": lambda i: [sys.executable, "-c", "pass"],
            "py-S": lambda i: [sys.executable, "-S", "-c", "pass"],
        }
        if "A" in keys:
            variants["A"] = lambda i: [CNI_BRIDGE]
        envs = {"B": env, "B-S": env, "py": clean_environ(), "py-S": clean_environ(), "A": cni_env}
        if "C" in keys:
            # the same command through a running daemon: the thin client's cold start plus one round trip
            sock = str(net.dir / "daemon.sock")
            daemon = Daemon(env, sock, ctx.cli, net.dir / "daemon.log")
            ctx.cleanup.push("cold-start daemon", daemon.stop)
            daemon.start()
            envs["B-d"] = {**env, "NETPLUGIN_USE_DAEMON": "always", "NETPLUGIN_SOCKET": sock}
            variants["B-d"] = lambda i: [*ctx.cli, "setup", "bench", f"p-cold-d-{i}", f"{ctx.tag}-cold-d-{i}"]
        samples: dict[str, list[float]] = {v: [] for v in variants}

        def once(v: str, i: int) -> float:
            stdin = b'{"cniVersion":"1.0.0"}' if v == "A" else None
            t0 = time.perf_counter()
            done = subprocess.run(
                variants[v](i),
                env=envs[v],
                input=stdin,
                capture_output=True,
                stdin=None if stdin is not None else subprocess.DEVNULL,
                timeout=60,
            )
            t = ms(time.perf_counter() - t0)
            if done.returncode != 0:
                raise BenchError(f"cold start {v} failed: {done.stderr.decode(errors='replace')[-400:]}")
            return t

        for v in variants:  # warm the page cache and .pyc files: "cold" means a new process, not a cold disk
            for i in range(plan.cold_warmups):
                once(v, -1 - i)
        with _quiet_gc():
            for i in range(runs):
                for v in rotate(list(variants), i):
                    samples[v].append(once(v, i))
        it_argv = (
            [sys.executable, "-X", "importtime", *ctx.cli[1:]]
            if ctx.cli[0] == sys.executable
            else [sys.executable, "-X", "importtime", ctx.cli[0]]
        )
        totals = []
        for i in range(5 if not plan.quick else 1):
            totals.append(_importtime([*it_argv, "setup", "bench", f"p-it-{i}", f"{ctx.tag}-it-{i}"], env))
        totals.sort(key=lambda x: x[0])
        total, top = totals[len(totals) // 2]
    finally:
        if daemon is not None:
            daemon.stop()
        net.close()
    fig = Figure(
        "coldstart",
        f"CLI cold start: `netplugin setup` with the no-op plugin ({runs} runs)",
        "ms",
        ["median", "p90"],
        ratio_column="median",
        samples=samples,
        plot="coldstart.png",
    )
    labels = {
        "B": "netplugin setup (kubernetes.io/no-op), a new process",
        "B-d": "the same through a running daemon (use_daemon always: thin client + round trip)",
        "B-S": "the same, interpreter started with -S (no site .pth hooks)",
        "py-S": "reference: `python -S -c pass`",
        "py": "reference: `python -c pass`",
        "A": "reference: CNI bridge VERSION (a new Go process)",
    }
    for v in variants:
        s = Stats.of(samples[v])
        fig.rows.append(Row(v, labels[v], {"median": s.median, "p90": s.p90}))
    fig.notes = [
        f"Started as {' '.join(ctx.cli)} (pyc and page cache warm: {plan.cold_warmups} unmeasured run(s) of each "
        "first).",
        f"`-X importtime` (median of runs): top-level imports {total:.1f} ms in all; largest: "
        + ", ".join(f"{m} {v:.1f}" for m, v in top[:8])
        + ".",
    ]
    return fig


# --- 6: netplugin's overhead over the plugin alone ------------------------------------------------------------


def fig_overhead(ctx: RunContext, plan: Plan, keys: Sequence[str], pool: SubnetPool) -> Figure:
    from netplugin.core.invoke import run

    runs = plan.overhead_runs
    net = Network(ctx, "6o", pool.take(24))
    daemon: DaemonContender | None = None
    try:
        exec_dir = net.dir / "exec"
        install_exec_plugin(exec_dir, "trivial", script=TRIVIAL_PLUGIN)
        exe = str(exec_dir / "trivial" / "trivial")
        cli_env = netplugin_env(net, "trivial", plugin_dir=exec_dir)
        if ctx.cli[0] == sys.executable:
            cli_env["PYTHONPATH"] = str(REPO)
        variants: dict[str, Callable[[Pod], object]] = {}

        def direct(p: Pod) -> object:
            env = dict(cli_env)
            env.update(
                NETPLUGIN_ACTION="setup",
                NETPLUGIN_PLUGIN="trivial",
                NETPLUGIN_POD_NAMESPACE=p.namespace,
                NETPLUGIN_POD_NAME=p.name,
                NETPLUGIN_INFRA_ID=p.infra_id,
                NETPLUGIN_NETNS=p.netns,
            )
            done = run([exe, "setup", p.namespace, p.name, p.infra_id], env=env, timeout=30)
            if not done.ok:
                raise BenchError(f"trivial plugin failed: {done.stderr[-300:]!r}")
            return done

        variants["direct"] = direct
        if "C" in keys:
            daemon = DaemonContender(net, "C", "trivial", plugin_dir=exec_dir)
            daemon.start()
            variants["C"] = daemon.setup
            health = _health_line()
            variants["C-health"] = lambda p: daemon.daemon.request(health, "health") if daemon else None
            variants["C-status"] = daemon.status
        if "B" in keys:
            variants["B"] = CliContender(net, env=cli_env).setup
        pods = [Pod("bench", f"p-ov-{i}", f"{ctx.tag}-ov-{i}", i) for i in range(runs + 3)]
        for v in variants:  # warm-up (init marker, caches)
            variants[v](pods[-1])
        samples: dict[str, list[float]] = {v: [] for v in variants}
        with _quiet_gc():
            for i in range(runs):
                for v in rotate(list(variants), i):
                    samples[v].append(_timed(variants[v], pods[i]))
    finally:
        if daemon is not None:
            daemon.stop()
        net.close()
    fig = Figure(
        "overhead",
        f"netplugin's overhead over running the plugin directly (trivial plugin, {runs} runs)",
        "ms",
        ["median", "p90", "overhead"],
        samples=samples,
        plot="overhead.png",
    )
    base = statistics.median(samples["direct"])
    labels = {
        "direct": "the plugin exec'd directly with netplugin.core.invoke.run",
        "C": "daemon round trip (setup request, plugin exec'd by the daemon)",
        "C-health": "daemon round trip of a health request (no plugin, no thread)",
        "C-status": "daemon round trip of a status request (plugin exec'd; status writes no state record)",
        "B": "CLI process (`netplugin setup`, plugin exec'd by it)",
    }
    for v in variants:
        s = Stats.of(samples[v])
        fig.rows.append(Row(v, labels[v], {"median": s.median, "p90": s.p90, "overhead": s.median - base}))
    fig.notes = [
        "overhead = median of the row - median of the direct exec. The plugin is `#!/bin/sh` + `exit 0`: "
        "everything but the exec is netplugin (request, config, lock, init check, environment, invoke).",
        "No A row: CNI plugins are called by the runtime directly, there is no layer to compare.",
    ]
    return fig
