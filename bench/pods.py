"""The pod-action figures: per-pod setup and teardown, a burst of concurrent setups, draining pods."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from .contenders import CONTENDERS, LABELS
from .context import RunContext
from .floor import FloorContender
from .harness import Live, Plan, burst_rounds, open_contenders, per_pod_series, quiet_gc, stat_row
from .processes import ExecContender
from .report import Figure
from .util import Pod, SubnetPool, ms

__all__ = ["fig_burst", "fig_drain", "fig_pods"]


# --- 1: per-pod setup and teardown ---------------------------------------------------------------------


def fig_pods(ctx: RunContext, plan: Plan, keys: Sequence[str], pool: SubnetPool) -> list[Figure]:
    n = plan.pods
    # X, the bash plugin without netplugin, shows what of B's and C's time is the plugin itself
    keys = [*keys, "X"] if "B" in keys or "C" in keys else list(keys)
    live = Live(ctx, "per-pod", keys)
    with open_contenders(ctx, "1", keys, pool) as cs:
        ctx.progress(f"  per-pod: 1 warm-up + {n} pods x {len(keys)} contenders")
        # the first setup creates the bridge (and runs init): reported apart
        first, setups, teardowns = per_pod_series(live, cs, n)
    fs = Figure("setup", f"Per-pod setup ({n} pods, after one warm-up pod)", "ms", ["median", "p90", "first"],
                ratio_column="median", samples=setups)
    fs.rows = [stat_row(live, k, LABELS[k], setups[k], ["median", "p90"], first=first.get(k)) for k in keys]
    fs.notes = [
        "first = the very first setup on a fresh network, not part of the median: for A and B it creates the "
        "bridge (B: netplugin's once-per-boot init); C and D ran init when their daemon started; X ran init "
        "before.",
        "A is an ADD; B a `netplugin setup` process; C and D one request each on a fresh connection "
        "to the daemon, timed by the client (the benchmark); E the netlink requests alone; X the bash plugin "
        "exec'd by the benchmark with the environment netplugin gives it (no ratio target: it shows how much "
        "of B and C is the plugin itself).",
    ]
    ft = Figure("teardown", f"Per-pod teardown ({n} pods, netns still present)", "ms", ["median", "p90"],
                ratio_column="median", samples=teardowns)
    ft.rows = [stat_row(live, k, LABELS[k], teardowns[k], ["median", "p90"]) for k in keys]
    ft.notes = ["The kernel's veth deletion (RCU grace periods, ~15-25 ms) dominates every contender's teardown."]
    return [fs, ft]


# --- 2: a burst of concurrent setups --------------------------------------------------------------------------


def fig_burst(ctx: RunContext, plan: Plan, keys: Sequence[str], pool: SubnetPool) -> Figure:
    n, rounds = plan.burst, plan.burst_rounds
    samples: dict[str, list[float]] = {k: [] for k in keys}
    live = Live(ctx, "burst", keys)
    with open_contenders(ctx, "2", keys, pool) as cs:
        for k in keys:  # warm-up: bridge creation and init happen outside the bursts
            (p,) = cs[k].net.new_pods(1)
            live.call(k, cs[k].setup, p)
            live.call(k, cs[k].teardown, p)
            cs[k].net.drop_pods([p])
        ctx.progress(f"  burst: {rounds} round(s) of {n} concurrent setups x {len(keys)} contenders")
        burst_rounds(live, cs, samples, n, rounds)
    fig = Figure("burst", f"Burst: {n} setups issued at once (makespan, {rounds} round(s))", "ms",
                 ["median", "min", "max"], ratio_column="median", samples=samples)
    for k in keys:
        note = "one thread: back to back, not concurrent" if k == "E" else ""
        fig.rows.append(stat_row(live, k, CONTENDERS[k], samples[k], ["median", "min", "max"], note))
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
    live = Live(ctx, "drain", variants)
    with open_contenders(ctx, "3", keys, pool) as cs:
        ctx.progress(f"  drain: {rounds} round(s) of {n} pods x {len(variants)} variants")
        for r in range(rounds):
            pods: dict[str, list[Pod]] = {}
            for v in live.order(r):
                c = cs[v[0]]
                pods[v] = c.net.new_pods(n)
                live.call(v, c.populate, pods[v])
            for v in live.order(r):
                c = cs[v[0]]
                with quiet_gc():
                    if v == "A-par":
                        assert isinstance(c, ExecContender)
                        t = live.call(v, c.all_at_once, "teardown", pods[v])
                    elif v == "E-group":
                        assert isinstance(c, FloorContender)
                        t = live.call(v, c.drain_group, pods[v])
                    else:
                        t = live.call(v, c.drain, pods[v])
                if t is not None:
                    samples[v].append(ms(t))
            for v, ps in pods.items():
                cs[v[0]].net.drop_pods(ps)
    fig = Figure("drain", f"Drain: tear down {n} pods ({rounds} round(s))", "ms", ["median", "min", "max", "per pod"],
                 ratio_column="median", samples=samples, params={"pods": n, "rounds": rounds})
    how = {
        "A": "sequential DELs, as the target states",
        "A-par": "all DELs started at once",
        "O": "sequential DELs, as A (Debian's plugins 1.1.1)",
        "B": "sequential `netplugin teardown` processes",
        "C": "all teardown requests sent at once",
        "D": "all teardown requests sent at once",
        "E": "one RTM_DELLINK per pod, sequential",
        "E-group": "links moved into one link group, one RTM_DELLINK for the group",
    }
    for v in variants:
        per_pod = statistics.median(samples[v]) / n if samples[v] else None
        fig.rows.append(stat_row(live, v, CONTENDERS[v[0]], samples[v], ["median", "min", "max"], how[v],
                             **{"per pod": per_pod}))
    fig.notes = [
        "The target compares D's drain with A's sequential DELs (row A). B is not run: the CLI has no drain; "
        "it would be n sequential `netplugin teardown` processes, n times its per-pod teardown above.",
        "Pods were set up (untimed) by each contender's own fastest path just before; their network "
        "namespaces stay until the drain ends (a DEL with the netns present deletes the veth).",
    ]
    return fig
