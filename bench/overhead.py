"""Figure 6, netplugin's overhead: the same trivial plugin exec'd directly, by the daemon and by the CLI."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from functools import partial

from .context import Network, RunContext, install_exec_plugin, netplugin_env, with_checkout
from .daemon import DaemonContender, health_request
from .harness import TRIVIAL_PLUGIN, Plan, interleaved, timed
from .processes import CliContender
from .report import Figure, Row
from .util import BenchError, Pod, Stats, SubnetPool

__all__ = ["fig_overhead"]


def fig_overhead(ctx: RunContext, plan: Plan, keys: Sequence[str], pool: SubnetPool) -> Figure:
    from netplugin.core.execplugin.invoke import run

    runs = plan.overhead_runs
    net = Network(ctx, "6o", pool.take(24))
    daemon: DaemonContender | None = None
    try:
        exec_dir = net.dir / "exec"
        install_exec_plugin(exec_dir, "trivial", script=TRIVIAL_PLUGIN)
        exe = str(exec_dir / "trivial" / "trivial")
        cli_env = with_checkout(netplugin_env(net, "trivial", plugin_dir=exec_dir), ctx.cli)
        variants: dict[str, Callable[[Pod], object]] = {}

        def direct(p: Pod) -> object:
            env = dict(cli_env)
            env.update(NETPLUGIN_ACTION="setup", NETPLUGIN_PLUGIN="trivial", NETPLUGIN_POD_NAMESPACE=p.namespace,
                       NETPLUGIN_POD_NAME=p.name, NETPLUGIN_INFRA_ID=p.infra_id, NETPLUGIN_NETNS=p.netns)
            done = run([exe, "setup", p.namespace, p.name, p.infra_id], env=env, timeout=30)
            if not done.ok:
                raise BenchError(f"trivial plugin failed: {done.stderr[-300:]!r}")
            return done

        variants["direct"] = direct
        if "C" in keys:
            daemon = DaemonContender(net, "C", "trivial", plugin_dir=exec_dir)
            daemon.start()
            variants["C"] = daemon.setup
            health = health_request()
            variants["C-health"] = lambda p: daemon.daemon.request(health, "health") if daemon else None
            variants["C-status"] = daemon.status
        if "B" in keys:
            variants["B"] = CliContender(net, env=cli_env).setup
        # Each variant sets up pods of its own: on a pod another variant set up first, a setup would
        # be a repeated one (an existing record to read and replace), not the fresh one measured.
        # The status request asks about the warm-up pod, which the daemon set up.
        pods = {v: [Pod("bench", f"p-ov{n}-{i}", f"{ctx.tag}-ov{n}-{i}", i) for i in range(runs + 1)]
                for n, v in enumerate(variants)}
        for v in variants:  # warm-up (init marker, caches)
            variants[v](pods[v][-1])
        if "C-status" in pods:
            pods["C-status"] = [pods["C"][-1]] * runs
        samples = interleaved(runs, {v: partial(_timed_pod, f, pods[v]) for v, f in variants.items()})
    finally:
        if daemon is not None:
            daemon.stop()
        net.close()
    fig = Figure("overhead", f"netplugin's overhead over running the plugin directly (trivial plugin, {runs} runs)",
                 "ms", ["median", "p90", "overhead"], samples=samples)
    base = statistics.median(samples["direct"])
    labels = {
        "direct": "the plugin exec'd directly with netplugin.core.execplugin.invoke.run",
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


def _timed_pod(fn: Callable[[Pod], object], pods: Sequence[Pod], i: int) -> float:
    return timed(fn, pods[i])
