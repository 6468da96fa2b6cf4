"""Figure 4, scale: per-pod setup with N pods already present, and the daemons' resident memory."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

from .contenders import CONTENDERS
from .context import RunContext
from .harness import Live, Plan, open_contenders, quiet_gc
from .report import Figure, Row
from .util import BenchError, SubnetPool, rotate

__all__ = ["BRIDGE_MAX_PORTS", "fig_scale"]


#: a Linux bridge takes at most BR_MAX_PORTS - 1 = 1023 ports (more: "RTNETLINK answers: Exchange full")
BRIDGE_MAX_PORTS = 1023


def fig_scale(ctx: RunContext, plan: Plan, keys: Sequence[str], pool: SubnetPool) -> tuple[Figure, Figure | None]:
    levels = plan.levels
    if levels[-1] + 2 > BRIDGE_MAX_PORTS:
        raise BenchError(f"{levels[-1]} pods do not fit on one bridge (at most {BRIDGE_MAX_PORTS} ports)")
    # B and C run the same plugin on one node: they share a network (and netplugin's state), and the
    # pods present are set up through the daemon, the fastest path for that plugin.
    shared = {"C": "B"} if "B" in keys and "C" in keys else {}
    samples: dict[str, dict[int, list[float]]] = {key: {lv: [] for lv in levels} for key in keys}
    rss: dict[str, dict[str, float]] = {}
    live = Live(ctx, "scale", keys)
    # One block per network, one after the other, everything of a block removed before the next: "N pods
    # present" means N on the machine, as on a node, not N per contender times the contenders. Within a
    # block (B and C share one) the contenders alternate; across blocks machine drift does not cancel.
    for block in _blocks(keys, shared):
        _measure_block(ctx, plan, pool, block, shared, live, samples, rss)
    return _scale_figures(plan, keys, shared, live, samples, rss)


def _blocks(keys: Sequence[str], shared: dict[str, str]) -> list[list[str]]:
    """The contenders grouped by the network they run on (a key and the keys that share its network)."""
    blocks: list[list[str]] = []
    for key in keys:
        owner = shared.get(key, key)
        block = next((b for b in blocks if shared.get(b[0], b[0]) == owner), None)
        if block is None:
            blocks.append([key])
        else:
            block.append(key)
    return blocks


def _measure_block(
    ctx: RunContext, plan: Plan, pool: SubnetPool, block: list[str], shared: dict[str, str], live: Live,
    samples: dict[str, dict[int, list[float]]], rss: dict[str, dict[str, float]],
) -> None:
    """Level after level on one network: populate to N pods, then time setups of the block's contenders."""
    levels, k = plan.levels, plan.level_samples
    owner = shared.get(block[0], block[0])
    with open_contenders(ctx, "4", block, pool, prefixlen=21, shared=shared) as cs:
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
            ctx.progress(f"  scale {'+'.join(block)}: {lv} pods present (populated in "
                         f"{time.monotonic() - t0:.1f}s); measuring {k} setups each")
            new = {key: cs[key].net.new_pods(k) for key in block}
            with quiet_gc():
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


def _scale_figures(
    plan: Plan, keys: Sequence[str], shared: dict[str, str], live: Live,
    samples: dict[str, dict[int, list[float]]], rss: dict[str, dict[str, float]],
) -> tuple[Figure, Figure | None]:
    levels, k = plan.levels, plan.level_samples
    cols = [f"N={lv}" for lv in levels]
    fig = Figure("scale", f"Per-pod setup with N pods already present (median of {k})", "ms",
                 [*cols, "growth", "growth beyond E"], ratio_column=cols[-1], unitless=["growth"],
                 samples={f"{key}@{lv}": samples[key][lv] for key in keys for lv in levels})
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
        "E and D give a pod on an IPv4-only bridge no IPv6 link-local address (either veth end): its MLD "
        "reports, DAD probe and router solicitations would be flooded by the bridge (no multicast querier) to "
        "every port for ~10 s after each pod starts. A's and the bash plugin's pods keep the kernel's default "
        "and send them, so their rows include that flood.",
        f"A Linux bridge takes at most {BRIDGE_MAX_PORTS} ports (BR_MAX_PORTS; the next port fails with "
        "\"Exchange full\"): no bridge plugin, reference or netplugin's, can hold more pods on one bridge.",
    ]
    if shared:
        fig.notes.append("B and C share one network and one netplugin state (both are netplugin on one node); "
                         "its pods present were set up through C's daemon.")
    rss_fig = None
    if rss:
        rcols = list(next(iter(rss.values())).keys())
        rss_fig = Figure("rss", "Daemon resident memory (psutil RSS)", "MiB", rcols)
        for key, vals2 in rss.items():
            rss_fig.rows.append(Row(key, CONTENDERS[key], {c: vals2.get(c) for c in rcols}))
        rss_fig.notes = ["Measured in the scale figure's daemons: after their first pod, then after each level; "
                         "a daemon's RSS is summed with its worker processes' (one per CPU, at most 4). "
                         "A has no long-running process (no ratio)."]
    return fig, rss_fig
