"""The chain figure (issue 20): a bridge plus a bandwidth plugin per pod, netplugin against CNI's chain.

Interleaved per pod, round robin with the order rotating, like the per-pod figure:

* A: CNI's own chain from containernetworking-plugins, exec'd as libcni runs a conflist: ``bridge``
  (with ``host-local`` IPAM, as contender A of the per-pod figure) then ``bandwidth`` with the
  bridge's result as ``prevResult`` and ``runtimeConfig.bandwidth``; DEL in reverse;
* C: a ``netplugin serve`` of its own with the chain ``[bridge, bandwidth]`` (both shipped bash
  plugins), one request per action;
* D: the same daemon chain with the native bridge first, ``[netplugin.io/bridge, bandwidth]``.

Every pod is shaped in both directions with the same rate and burst (the CNI capability for A,
netplugin's ``NETPLUGIN_BANDWIDTH_*`` variables, which its CNI shim sets from it, for C and D): the
same tc work (a tbf on the host veth, an ifb with mirred and a tbf) on every side.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from .contenders import reference_version
from .context import Network, RunContext, bridge_plugin_dir, install_exec_plugin
from .daemon import DaemonContender
from .harness import Factory, Live, Plan, open_contenders, per_pod_series, stat_row
from .processes import Call, CniContender, _finish, _spawn
from .report import Figure
from .util import REPO, BenchError, Pod, SubnetPool

__all__ = ["CHAIN_KEYS", "fig_chain"]

RATE = 100_000_000  # bits per second, both directions
BURST = 4_000_000  # bits (500 kB)
CHAIN_LABELS = {
    "A": "CNI chain: bridge + host-local + bandwidth {version} (exec'd as libcni does)",
    "O": "CNI chain: bridge + host-local + bandwidth 1.1.1, Debian's (exec'd as libcni does)",
    "C": "netplugin daemon, chain [exec_plugins/bridge, exec_plugins/bandwidth]",
    "D": "netplugin daemon, chain [netplugin.io/bridge, exec_plugins/bandwidth]",
}
CHAIN_KEYS = tuple(CHAIN_LABELS)
SHAPING = {
    "NETPLUGIN_BANDWIDTH_INGRESS_RATE": str(RATE),
    "NETPLUGIN_BANDWIDTH_INGRESS_BURST": str(BURST),
    "NETPLUGIN_BANDWIDTH_EGRESS_RATE": str(RATE),
    "NETPLUGIN_BANDWIDTH_EGRESS_BURST": str(BURST),
}


class CniChainContender(CniContender):
    """A: the conflist [bridge, bandwidth], each plugin exec'd in turn with the previous result."""

    def __init__(self, net: Network) -> None:
        super().__init__(net)
        self.name = f"{net.bridge}-net"
        self.results: dict[str, bytes] = {}

    def _bandwidth(self, action: str, pod: Pod, prev: bytes) -> Call:
        conf = {
            "cniVersion": "1.0.0",
            "name": self.name,
            "type": "bandwidth",
            "runtimeConfig": {"bandwidth": {"ingressRate": RATE, "ingressBurst": BURST,
                                            "egressRate": RATE, "egressBurst": BURST}},
            "prevResult": json.loads(prev),
        }
        env = dict(self.base_env, CNI_COMMAND="ADD" if action == "setup" else "DEL",
                   CNI_CONTAINERID=pod.infra_id, CNI_NETNS=pod.netns)
        return Call([f"{self.cni_dir}/bandwidth"], env, json.dumps(conf).encode())

    def setup(self, pod: Pod) -> None:
        p = _spawn(self.call("setup", pod))
        out, err = p.communicate()
        if p.returncode != 0:
            raise BenchError(f"A bridge ADD {pod.infra_id} failed: {(err or out).decode(errors='replace')[-600:]}")
        self.results[pod.infra_id] = out  # libcni's cache: DEL gets the final result
        _finish(_spawn(self._bandwidth("setup", pod, out)), f"A bandwidth ADD {pod.infra_id}")

    def teardown(self, pod: Pod) -> None:
        prev = self.results.pop(pod.infra_id, b"{}")
        _finish(_spawn(self._bandwidth("teardown", pod, prev)), f"A bandwidth DEL {pod.infra_id}")
        _finish(_spawn(self.call("teardown", pod)), f"A bridge DEL {pod.infra_id}")


class DaemonChainContender(DaemonContender):
    """C and D: a daemon whose config names the chain [first, bandwidth] and shapes every pod."""

    def __init__(self, net: Network, key: str, first: str, plugin_dir: Path) -> None:
        install_exec_plugin(plugin_dir, "bandwidth", REPO / "exec_plugins" / "bandwidth" / "bandwidth")
        super().__init__(net, key, first, plugin_dir=plugin_dir)
        env = self.daemon.env
        env.pop("NETPLUGIN_PLUGIN", None)
        env.update(NETPLUGIN_PLUGINS=f"{first},bandwidth", **SHAPING)


class CniDebianChainContender(CniChainContender):
    """O: as A, with Debian's containernetworking-plugins 1.1.1."""

    key = "O"


CHAIN_FACTORIES: dict[str, Factory] = {
    "A": CniChainContender,
    "O": CniDebianChainContender,
    "C": lambda net: DaemonChainContender(net, "C", "bridge", bridge_plugin_dir(net)),
    "D": lambda net: DaemonChainContender(net, "D", "netplugin.io/bridge", net.dir / "exec-chain"),
}


def fig_chain(ctx: RunContext, plan: Plan, keys: Sequence[str], pool: SubnetPool) -> list[Figure]:
    """Per-pod setup and teardown through a two-member chain, A vs C and D."""
    keys = [k for k in CHAIN_KEYS if k in keys]
    n = plan.pods
    live = Live(ctx, "chain", keys)
    with open_contenders(ctx, "7", keys, pool, factories=CHAIN_FACTORIES) as cs:
        ctx.progress(f"  chain: 1 warm-up + {n} pods x {len(keys)} contenders")
        _, setups, teardowns = per_pod_series(live, cs, n)
    out = []
    for fid, title, samples in (("chain-setup", "setup", setups), ("chain-teardown", "teardown", teardowns)):
        f = Figure(fid, f"Chain: per-pod {title} with a bridge and a bandwidth plugin ({n} pods)", "ms",
                   ["median", "p90"], ratio_column="median", samples=samples)
        labels = {k: CHAIN_LABELS[k].format(version=reference_version("A")) for k in keys}
        f.rows = [stat_row(live, k, labels[k], samples[k], ["median", "p90"]) for k in keys]
        f.params = {"pods": n}
        f.notes = [
            f"Every pod shaped both ways at {RATE // 1_000_000} Mbit/s, burst {BURST // 8_000} kB: the same tbf, ifb "
            "and mirred work on every side. A is two plugin execs (bridge runs host-local itself); C and D one "
            "request each to their daemon, which runs the chain's two members.",
            "Target (issue 20): the chain keeps the ratios of the one-plugin per-pod figure (D ≤ 0.5x A, C ≤ 1.0x A "
            "for setup).",
        ]
        out.append(f)
    return out
