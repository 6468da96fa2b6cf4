"""The runtime's view (issue 9): the CNI shim and the CLI as processes, with the daemon up.

A container runtime execs ``netplugin-cni`` for every ADD and DEL; what it waits for is the whole
process, start to exit. These rows time exactly that, interleaved in one run with contender A
(the reference CNI bridge + host-local, exec'd the same way):

* F: the compiled ``netplugin-cni`` (C, one binary frame to the daemon; issue 18), forwarding to a
  daemon of the same settings that runs the bash bridge plugin;
* G: the same with the daemon's in-process native plugin (``netplugin.io/bridge``);
* Fpy, Gpy: F and G with the Python entry script (``python -I -S``) instead, kept for comparison;
* H: ``netplugin setup|teardown`` (the CLI entry script) through a daemon whose exec plugin does
  nothing (``exit 0``), so that H minus P is the CLI's thin path itself: its imports, the request,
  the daemon's locks, records and exec;
* P: the bare interpreter, ``python -I -S -c pass``, on the same interpreter: H's floor.

Each ADD and DEL is a fresh process, as libcni runs it. Bursts of them (a node's pods at once) are
:mod:`bench.nodeburst`'s.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from .contenders import LABELS
from .context import Network, RunContext, bridge_plugin_dir, install_exec_plugin
from .daemon import DaemonOwner, health_request
from .harness import TRIVIAL_PLUGIN, Factory, Live, Plan, open_contenders, per_pod_series, stat_row
from .processes import Call, CniContender, CniDebianContender, ExecContender
from .report import Figure
from .util import BenchError, Pod, SubnetPool

__all__ = ["RUNTIME_KEYS", "RUNTIME_LABELS", "ShimContender", "empty_plugin_dir", "fig_runtime"]

RUNTIME_LABELS = {
    "A": LABELS["A"],
    "O": LABELS["O"],
    "F": "netplugin-cni (compiled) process -> daemon + exec_plugins/bridge",
    "G": "netplugin-cni (compiled) process -> daemon + netplugin.io/bridge (native)",
    "Fpy": "netplugin-cni (Python entry script) -> daemon + exec_plugins/bridge",
    "Gpy": "netplugin-cni (Python entry script) -> daemon + netplugin.io/bridge (native)",
    "H": "netplugin CLI process -> daemon + a no-op exec plugin",
    "P": "reference: python -I -S -c pass (same interpreter; the floor of H, Fpy and Gpy)",
}
RUNTIME_KEYS = tuple(RUNTIME_LABELS)


def entry_scripts(ctx: RunContext) -> dict[str, str]:
    """The CNI and CLI entry scripts of this checkout (as ``netplugin install-shim`` writes them), and
    the compiled shim (``cni-native``, as install.sh builds it, the CNI entry script its fallback)."""
    from netplugin.frontends.cni.native import build_native
    from netplugin.frontends.entrypoints import install_entry

    out = {}
    for kind in ("cni", "cli"):
        path = ctx.workdir / f"entry-{kind}"
        if not path.exists():
            install_entry(kind, str(path))
        out[kind] = str(path)
    native = ctx.workdir / "entry-cni-native"
    if not native.exists():
        build_native(str(native), fallback=out["cni"])
    out["cni-native"] = str(native)
    return out


class _DaemonBacked(DaemonOwner, ExecContender):
    """A process per action, talking to a daemon of this contender's own with the same settings."""

    def __init__(self, net: Network, key: str, plugin: str, plugin_dir: Path) -> None:
        super().__init__(net, key, plugin, plugin_dir, extra={"NETPLUGIN_USE_DAEMON": "auto"})
        # The caller's settings are the daemon's (its socket included); PYTHONPATH is ignored by -I.
        self.env = dict(self.daemon.env)
        self.scripts = entry_scripts(self.ctx)

    @property
    def label(self) -> str:
        return RUNTIME_LABELS[self.key]


class ShimContender(_DaemonBacked):
    """F and G: the netplugin-cni entry script exec'd like libcni does (CNI_* env, config on stdin)."""

    def __init__(self, net: Network, key: str, plugin: str, plugin_dir: Path) -> None:
        super().__init__(net, key, plugin, plugin_dir)
        self.env.update(CNI_IFNAME="eth0", CNI_PATH="/usr/lib/cni")
        self.config = json.dumps({"cniVersion": "1.0.0", "name": f"{net.bridge}-np", "type": "netplugin-cni"}).encode()

    def call(self, action: str, pod: Pod) -> Call:
        env = dict(self.env)
        env.update(
            CNI_COMMAND="ADD" if action == "setup" else "DEL",
            CNI_CONTAINERID=pod.infra_id,
            CNI_NETNS=pod.netns,
            CNI_ARGS=f"IgnoreUnknown=1;K8S_POD_NAMESPACE={pod.namespace};K8S_POD_NAME={pod.name}",
        )
        return Call([self.scripts["cni" if self.key.endswith("py") else "cni-native"]], env, self.config)

    def check_served(self) -> None:
        """The calls went to the daemon (not run alone): its request counter moved."""
        health = self.daemon.request(health_request(), "health")
        if not health.get("requests"):
            raise BenchError(f"{self.key}: the daemon served no request; the shim worked alone")


class CliThinContender(_DaemonBacked):
    """H: ``netplugin setup|teardown NS POD INFRA`` through the daemon (the CLI's stdlib-only path)."""

    def call(self, action: str, pod: Pod) -> Call:
        return Call([self.scripts["cli"], action, pod.namespace, pod.name, pod.infra_id], self.env)


class BareInterpreter(ExecContender):
    """P: ``python -I -S -c pass`` for both actions; the start-up every Python process pays."""

    key = "P"

    def call(self, action: str, pod: Pod) -> Call:
        return Call([os.path.realpath(sys.executable), "-I", "-S", "-c", "pass"], {"PATH": "/usr/bin:/bin"})

    @property
    def label(self) -> str:
        return RUNTIME_LABELS["P"]


FACTORIES: dict[str, Factory] = {
    "A": CniContender,
    "O": CniDebianContender,
    "F": lambda net: ShimContender(net, "F", "bridge", bridge_plugin_dir(net)),
    "G": lambda net: ShimContender(net, "G", "netplugin.io/bridge", empty_plugin_dir(net)),
    "Fpy": lambda net: ShimContender(net, "Fpy", "bridge", bridge_plugin_dir(net)),
    "Gpy": lambda net: ShimContender(net, "Gpy", "netplugin.io/bridge", empty_plugin_dir(net)),
    "H": lambda net: CliThinContender(net, "H", "noop", _noop_dir(net)),
    "P": BareInterpreter,
}


def _noop_dir(net: Network) -> Path:
    return install_exec_plugin(net.dir / "exec-noop", "noop", script=TRIVIAL_PLUGIN)


def empty_plugin_dir(net: Network) -> Path:
    d = net.dir / "exec-empty"
    d.mkdir(mode=0o755, exist_ok=True)
    return d


def fig_runtime(ctx: RunContext, plan: Plan, keys: Sequence[str], pool: SubnetPool) -> list[Figure]:
    """Per-pod ADD and DEL as processes (A F G H P, interleaved)."""
    keys = [k for k in RUNTIME_KEYS if k not in ("A", "O") or k in keys]
    n = plan.pods
    live = Live(ctx, "runtime", keys)
    with open_contenders(ctx, "9", keys, pool, factories=FACTORIES) as cs:
        ctx.progress(f"  runtime: 1 warm-up + {n} pods x {len(keys)} contenders")
        # the first ADD creates the bridge and warms the page cache of each entry script: not reported
        _first, adds, dels = per_pod_series(live, cs, n)
        for k in ("F", "G", "Fpy", "Gpy"):
            c = cs.get(k)
            if isinstance(c, ShimContender):
                live.call(k, c.check_served)
    return _figures(n, keys, live, adds, dels)


def _figures(
    n: int,
    keys: Sequence[str],
    live: Live,
    adds: dict[str, list[float]],
    dels: dict[str, list[float]],
) -> list[Figure]:
    fa = Figure("runtime-add", f"The runtime's view: ADD / setup as a process ({n} pods, daemon up)", "ms",
                ["median", "p90"], ratio_column="median", samples=adds)
    fa.rows = [stat_row(live, k, RUNTIME_LABELS[k], adds[k], ["median", "p90"]) for k in keys]
    fa.notes = [
        "Each sample is one process from exec to exit, as libcni (A, F, G) or an operator (H) runs it. F and G "
        "are the compiled netplugin-cni (C, `netplugin install-shim --kind cni-native`, as install.sh installs it): "
        "it sends the CNI_*/NETPLUGIN_* variables and stdin in one binary frame over the daemon's socket and writes "
        "the daemon's answer. Fpy and Gpy are the Python entry script `netplugin install-shim` writes (python -I -S; "
        "the compiled shim's fallback), kept for comparison. H is `netplugin setup` through a daemon whose exec "
        "plugin does nothing (the CLI's stdlib-only path; H - P is its whole cost). P is the bare interpreter.",
    ]
    fd = Figure("runtime-del", f"The runtime's view: DEL / teardown as a process ({n} pods, netns present)", "ms",
                ["median", "p90"], ratio_column="median", samples=dels)
    fd.rows = [stat_row(live, k, RUNTIME_LABELS[k], dels[k], ["median", "p90"]) for k in keys]
    return [fa, fd]
