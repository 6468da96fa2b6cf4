"""The hostPort chain figure: a bridge plus hostPort per pod, through the daemon, against CNI's portmap chain.

Each contender runs in a node network namespace of its own (so no rule touches the machine's own
firewall, and the two daemons' hostPort tables do not meet); per pod, interleaved round robin with
the order rotating, like the chain figure:

* A: CNI's chain from containernetworking-plugins (the package of contender A of the other figures),
  exec'd as libcni runs a conflist: ``bridge`` (with ``host-local``), then ``portmap`` with the
  bridge's result as ``prevResult`` and ``runtimeConfig.portMappings``; DEL in reverse;
* B: a ``netplugin serve`` started in its node netns with the chain ``[bridge, hostport]`` (the
  shipped bash plugins); one CNI call per action, as the CNI shim forwards it (op ``cni``: the
  ``CNI_*`` variables and the network config with ``runtimeConfig.portMappings``);
* N: the same with the built-in chain ``[netplugin.io/bridge, netplugin.io/hostport]``.

The daemons are entered into their node netns without remounting /sys, as containerd enters a
node. Each pod maps one TCP and one UDP port. Also timed: the built-in's rebuild of its table from
1,000 recorded mappings (500 pods x 2), one nft transaction, as the daemon does at every start.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from typing import Any

from netplugin.core.hostports import parse_env
from netplugin.core.netns import entered
from netplugin.frontends.wire import protocol as rpc
from netplugin.plugins.hostport import chain_name, pod_rules, rebuild_script

from .contenders import cni_dir, reference_version
from .context import Network, RunContext, bridge_plugin_dir, install_exec_plugin
from .daemon import DaemonOwner
from .harness import Factory, Live, Plan, open_contenders, per_pod_series, stat_row
from .processes import CniContender, _finish, _spawn
from .report import Figure
from .util import NETNS_DIR, REPO, BenchError, Pod, SubnetPool, node_namespaces

__all__ = ["HOSTPORT_KEYS", "fig_hostport"]

LABELS = {
    "A": "CNI chain: bridge + host-local + portmap {version} (exec'd as libcni does)",
    "B": "netplugin daemon, chain [exec_plugins/bridge, exec_plugins/hostport] (bash)",
    "N": "netplugin daemon, chain [netplugin.io/bridge, netplugin.io/hostport] (built in)",
}
HOSTPORT_KEYS = tuple(LABELS)


def _mappings(pod: Pod) -> list[dict[str, Any]]:
    """The pod's two hostPorts, unique per pod of the run (each contender has a node of its own)."""
    return [
        {"hostPort": 20000 + pod.index, "containerPort": 80, "protocol": "tcp"},
        {"hostPort": 30000 + pod.index, "containerPort": 53, "protocol": "udp"},
    ]


def _node(net: Network) -> str:
    return f"{NETNS_DIR}/{net.bridge}n"


def _check_mapped(net: Network, pod: Pod) -> None:
    """After the warm-up setup (not a timed one): the pod's TCP hostPort is in its node's rules, so the
    figure times real work. iptables-save too: CNI portmap may use iptables-legacy."""
    port = str(_mappings(pod)[0]["hostPort"])
    with entered(_node(net)):
        text = "".join(subprocess.run(argv, capture_output=True, text=True, check=False).stdout
                       for argv in (["nft", "list", "ruleset"], ["iptables-save", "-t", "nat"]))  # fmt: skip
    if port not in text:
        raise BenchError(f"hostPort {port} of {pod.infra_id} is in no rule of {_node(net)}")


class PortmapChainContender(CniContender):
    """A: the conflist [bridge, portmap], each plugin exec'd in turn, inside its node netns."""

    def __init__(self, net: Network) -> None:
        super().__init__(net)
        self.results: dict[str, bytes] = {}

    def _portmap(self, command: str, pod: Pod, prev: bytes) -> tuple[list[str], dict[str, str], bytes]:
        conf = {
            "cniVersion": "1.0.0", "name": f"{self.net.bridge}-net", "type": "portmap", "snat": True,
            "capabilities": {"portMappings": True}, "runtimeConfig": {"portMappings": _mappings(pod)},
            "prevResult": json.loads(prev),
        }  # fmt: skip
        env = dict(self.base_env, CNI_COMMAND=command, CNI_CONTAINERID=pod.infra_id, CNI_NETNS=pod.netns)
        return [f"{self.cni_dir}/portmap"], env, json.dumps(conf).encode()

    def _exec(self, argv: list[str], env: dict[str, str], stdin: bytes, what: str) -> bytes:
        done = subprocess.run(argv, env=env, input=stdin, capture_output=True, timeout=120, check=False)
        if done.returncode != 0:
            raise BenchError(f"{what} failed (exit {done.returncode}): {(done.stdout or done.stderr)[-600:]!r}")
        return done.stdout

    def setup(self, pod: Pod) -> None:
        with entered(_node(self.net)):
            p = _spawn(self.call("setup", pod))
            out, err = p.communicate()
            if p.returncode != 0:
                raise BenchError(f"A bridge ADD {pod.infra_id} failed: {(err or out).decode(errors='replace')[-600:]}")
            self.results[pod.infra_id] = out  # libcni's cache: DEL gets the final result
            self._exec(*self._portmap("ADD", pod, out), f"A portmap ADD {pod.infra_id}")
        if pod.index == 0:
            _check_mapped(self.net, pod)

    def teardown(self, pod: Pod) -> None:
        prev = self.results.pop(pod.infra_id, b"{}")
        with entered(_node(self.net)):
            self._exec(*self._portmap("DEL", pod, prev), f"A portmap DEL {pod.infra_id}")
            _finish(_spawn(self.call("teardown", pod)), f"A bridge DEL {pod.infra_id}")


class DaemonHostPortContender(DaemonOwner):
    """B and N: a daemon in its node netns running [bridge, hostport]; one ``cni`` request per action."""

    def __init__(self, net: Network, key: str, chain: tuple[str, str]) -> None:
        pdir = bridge_plugin_dir(net)
        install_exec_plugin(pdir, "hostport", REPO / "exec_plugins" / "hostport" / "hostport")
        super().__init__(net, key, chain[0], pdir)
        env = self.daemon.env
        env.pop("NETPLUGIN_PLUGIN", None)
        env["NETPLUGIN_PLUGINS"] = ",".join(chain)
        # the CNI shim's own settings are the node's (the daemon's), except that it forwards
        self.settings = {k: v for k, v in env.items() if k.startswith("NETPLUGIN_")}
        self.settings["NETPLUGIN_USE_DAEMON"] = "always"

    def start(self) -> None:
        with entered(_node(self.net)):  # the daemon and every plugin it runs live there
            super().start()

    def _cni(self, command: str, pod: Pod) -> None:
        environ = dict(
            self.settings, CNI_COMMAND=command, CNI_CONTAINERID=pod.infra_id, CNI_NETNS=pod.netns, CNI_IFNAME="eth0",
            CNI_PATH="/opt/cni/bin",
            CNI_ARGS=f"IgnoreUnknown=1;K8S_POD_NAMESPACE={pod.namespace};K8S_POD_NAME={pod.name}",
        )  # fmt: skip
        conf = {"cniVersion": "1.0.0", "name": "netplugin", "type": "netplugin-cni",
                "capabilities": {"portMappings": True}, "runtimeConfig": {"portMappings": _mappings(pod)}}  # fmt: skip
        what = f"{self.key} {command} {pod.infra_id}"
        answer = self.daemon.request(rpc.cni_request(environ, json.dumps(conf)), what)
        if not isinstance(answer, dict) or answer.get("code") != 0:
            raise BenchError(f"{what} failed in the daemon: {json.dumps(answer)[:600]}")

    def setup(self, pod: Pod) -> None:
        self._cni("ADD", pod)
        if pod.index == 0:
            _check_mapped(self.net, pod)

    def teardown(self, pod: Pod) -> None:
        self._cni("DEL", pod)


FACTORIES: dict[str, Factory] = {
    "A": PortmapChainContender,
    "B": lambda net: DaemonHostPortContender(net, "B", ("bridge", "hostport")),
    "N": lambda net: DaemonHostPortContender(net, "N", ("netplugin.io/bridge", "netplugin.io/hostport")),
}


def _rebuild_ms(ctx: RunContext) -> float:
    """The built-in's table rebuilt from 1,000 recorded mappings, in a netns of its own."""
    name = f"{ctx.tag}hpr"
    with tempfile.TemporaryDirectory() as records, node_namespaces([name]):
        for i in range(500):
            chain = chain_name(f"rebuild-{i}")
            ip = f"10.202.{200 + i // 250}.{i % 250 + 2}"
            rules = pod_rules(chain, parse_env(f"tcp/{40000 + i}/80 udp/{50000 + i}/53"), [ip])
            with open(os.path.join(records, chain), "w") as f:
                f.write(f"bench/r{i} rebuild-{i}\ntcp.{40000 + i} udp.{50000 + i}\n" + "\n".join(rules) + "\n")
        with entered(f"{NETNS_DIR}/{name}"):
            t0 = time.perf_counter()
            script = rebuild_script(records)
            done = subprocess.run(["nft", "-f", "-"], input=script, capture_output=True, text=True, timeout=120)
            ms = (time.perf_counter() - t0) * 1000
    if done.returncode != 0:
        raise BenchError(f"rebuild failed: {done.stderr[-400:]}")
    return ms


def fig_hostport(ctx: RunContext, plan: Plan, keys: list[str], pool: SubnetPool) -> list[Figure]:
    """Per-pod setup and teardown of bridge + hostPort, A (CNI) vs B and N (the daemon); the rebuild."""
    keys = [k for k in HOSTPORT_KEYS if k in keys]
    if "A" in keys and not os.access(f"{cni_dir('A')}/portmap", os.X_OK):
        keys.remove("A")
        ctx.problems.append(f"hostport: A left out: {cni_dir('A') or '(no dir)'}/portmap not found")
    n = plan.pods
    live = Live(ctx, "hostport", keys)
    nodes = [f"{ctx.tag}8{k.lower()}n" for k in keys]  # the bridge of network "8k" plus "n": see _node
    with node_namespaces(nodes), open_contenders(ctx, "8", keys, pool, factories=FACTORIES) as cs:
        ctx.progress(f"  hostport: 1 warm-up + {n} pods x {len(keys)} contenders")
        _, setups, teardowns = per_pod_series(live, cs, n)
    rebuild = _rebuild_ms(ctx)
    version = reference_version("A")
    out = []
    for fid, title, samples in (("hostport-setup", "setup", setups), ("hostport-teardown", "teardown", teardowns)):
        f = Figure(fid, f"hostPort chain: per-pod {title} of a bridge + hostPort, 2 mappings ({n} pods)", "ms",
                   ["median", "p90"], ratio_column="median", samples=samples)
        f.rows = [stat_row(live, k, LABELS[k].format(version=version), samples[k], ["median", "p90"]) for k in keys]
        f.params = {"pods": n}
        f.notes = [
            "Each contender in a node netns of its own, entered without remounting /sys (as containerd enters a "
            "node); one TCP and one UDP mapping per pod. A is three plugin execs (bridge runs host-local), B and N "
            "one CNI request each to their daemon, which runs both chain members.",
            f"The built-in's rebuild of its table from 1,000 recorded mappings (500 pods): {rebuild:.1f} ms, "
            "one nft transaction (the daemon runs it at every start).",
        ]
        out.append(f)
    return out
