"""The self-repair figure: how long the daemon takes to put back what an admin or a firewall reload broke.

On a node of its own (:class:`bench.chaosnode.ChaosNode`: a network namespace, the shipped daemon
``netplugin serve``, a static cluster and three pods), each breakage is made again and again, and
timed from the breaking command's return until the namespace's kernel state is back (polled every
2 ms, so a time is at most about 2 ms late). Two chains: the built-in members (bridge, hostport)
and the shipped bash plugins (bridge, bandwidth shaping one pod, whose qdisc is the extra kind),
each also on a dual-stack node for the bridge's IPv6 addresses flushed.
The daemon's idle CPU over a quiet spell is the proof that the watch costs nothing while nothing
changes (it blocks on netlink; only a static host's node files are re-read every 2 s).
"""

from __future__ import annotations

import os
import time

from .chaosnode import BUILTIN_CHAIN, EXEC_CHAIN, ChaosNode
from .context import RunContext
from .harness import Live, Plan, stat_row
from .report import Figure
from .util import BenchError

__all__ = ["REPAIR_KEYS", "fig_repair"]

#: the nodes the rows run on: (chain, dual-stack)
_BUILTIN, _BASH = (BUILTIN_CHAIN, False), (EXEC_CHAIN, False)
_BUILTIN_DUAL, _BASH_DUAL = (BUILTIN_CHAIN, True), (EXEC_CHAIN, True)
#: row key -> (node, breakage of bench.chaosnode.BREAKAGES, label)
_ROWS = {
    "nft": (_BUILTIN, "nft flush", "nft flush ruleset: egress and hostPort tables reinstalled"),
    "route": (_BUILTIN, "route flush", "ip route flush proto 78: the route to the peer re-added"),
    "hairpin": (_BUILTIN, "hairpin", "one port's hairpin off: back on (built-in bridge's repair)"),
    "bridge": (_BUILTIN, "bridge", "ip link del of the bridge: recreated, 3 ports re-attached (built-in)"),
    "bridge-bash": (_BASH, "bridge", "ip link del of the bridge: the same, by the bash bridge's repair"),
    "qdisc": (_BASH, "qdisc", "a shaped pod's tbf deleted: re-applied by the bash bandwidth's repair"),
    "ipv6": (_BUILTIN_DUAL, "ipv6 flush", "ip -6 addr flush of a dual-stack bridge: gateway, link-local (built-in)"),
    "ipv6-bash": (_BASH_DUAL, "ipv6 flush", "ip -6 addr flush of a dual-stack bridge: the same, by the bash bridge"),
}
REPAIR_KEYS = tuple(_ROWS)
_COLS = ["median", "p90", "min", "max"]


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _idle_cpu(node: ChaosNode, seconds: float) -> float:
    assert node.proc is not None
    before = _cpu_seconds(node.proc.pid)
    time.sleep(seconds)
    return _cpu_seconds(node.proc.pid) - before


def _timed(node: ChaosNode, breakage: str) -> float:
    try:
        return node.time_to_repair(breakage)
    except (AssertionError, RuntimeError) as e:  # not back in time, or a command of the breakage failed
        raise BenchError(f"{breakage}: {e}") from e


def fig_repair(ctx: RunContext, plan: Plan) -> list[Figure]:
    """Median time-to-repair per breakage, on the built-in and the bash chain; the daemon's idle CPU."""
    rounds = 2 if plan.quick else 10
    idle_for = 2.0 if plan.quick else 20.0
    live = Live(ctx, "repair", list(REPAIR_KEYS))
    samples: dict[str, list[float]] = {k: [] for k in REPAIR_KEYS}
    idle = None
    for chain, dual in dict.fromkeys(n for n, _, _ in _ROWS.values()):
        keys = [k for k, (n, _, _) in _ROWS.items() if n == (chain, dual)]
        stack = ", dual-stack" if dual else ""
        ctx.progress(f"  repair: {', '.join(chain)}{stack}: {len(keys)} breakages x {rounds}")
        try:
            with ChaosNode(pods=3, chain=chain, tag=ctx.tag, dual_stack=dual) as node:
                if (chain, dual) == _BUILTIN:
                    idle = _idle_cpu(node, idle_for)
                for _ in range(rounds):
                    for k in keys:
                        took = live.call(k, _timed, node, _ROWS[k][1])
                        if took is not None:
                            samples[k].append(took * 1000)
        except (RuntimeError, OSError) as e:  # the node could not be made (a setup, the daemon)
            raise BenchError(f"repair node with {', '.join(chain)}{stack}: {e}") from e
    f = Figure(
        "repair",
        f"Self-repair: time from the breakage until the kernel state is back ({rounds} rounds, 3 pods)",
        "ms",
        _COLS,
        samples=samples,
    )
    f.rows = [stat_row(live, k, _ROWS[k][2], samples[k], _COLS) for k in REPAIR_KEYS]
    f.params = {"rounds": rounds, "pods": 3}
    f.notes = [
        "The daemon as shipped (netplugin serve) in a node netns of the figure's own; each time runs from the "
        "breaking command's return until the state is back, polled every 2 ms.",
        "Every repair includes the watch's 50 ms wait for a burst of notifications to end, counted from the first "
        "notification (sent before the breaking command returns, so a time can be shorter).",
        f"Idle: the daemon used {idle if idle is not None else float('nan'):.2f} s of CPU over {idle_for:.0f} s "
        "with nothing changing (a static host re-reads its node files every 2 s; the kernel watch blocks).",
    ]
    return [f]
