"""The hostPort figure: what a pod's hostPort costs, netplugin's hostport member against CNI's portmap.

Per pod, interleaved (the order rotating per pod), in a network namespace of the figure's own (the
bench thread enters it; every process it starts is in it, so no rule touches the machine's own
firewall):

* A: CNI's ``portmap`` from containernetworking-plugins (the package of contender A of the other
  figures), exec'd as libcni runs it after a bridge: ``prevResult`` with the pod's address,
  ``runtimeConfig.portMappings``; DEL with the same;
* B: the shipped bash plugin ``exec_plugins/hostport`` exec'd as netplugin's chain runs it;
* N: the built-in ``netplugin.io/hostport``, called in process (as the daemon runs it).

Each pod maps one TCP and one UDP port. What is timed is the hostPort member alone: the bridge
before it is the same work on every side and is measured by the per-pod and chain figures. Also
timed: the built-in's rebuild of its table from 1,000 recorded mappings (500 pods x 2), one nft
transaction, as the daemon does at every start.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from collections.abc import Callable

from netplugin.core.hostports import parse_env
from netplugin.core.names import PodRef
from netplugin.core.netns import entered
from netplugin.core.plugin import CallContext
from netplugin.plugins.hostport import HostPortPlugin, chain_name, pod_rules, rebuild_script

from .context import RunContext
from .harness import Live, Plan, stat_row
from .report import Figure
from .util import REPO, BenchError

__all__ = ["HOSTPORT_KEYS", "fig_hostport"]

PORTMAP = "/usr/lib/cni/portmap"
HOSTPORT = REPO / "exec_plugins" / "hostport" / "hostport"
LABELS = {
    "A": "CNI portmap (containernetworking-plugins), exec'd as libcni does after a bridge",
    "B": "netplugin hostport, exec_plugins/hostport (bash), exec'd as the chain runs it",
    "N": "netplugin hostport, netplugin.io/hostport (built in, as the daemon runs it)",
}
HOSTPORT_KEYS = tuple(LABELS)


def _run(argv: list[str], env: dict[str, str], stdin: bytes, what: str) -> None:
    done = subprocess.run(argv, env=env, input=stdin, capture_output=True, timeout=60, check=False)
    if done.returncode != 0:
        raise BenchError(f"{what} failed: {(done.stderr or done.stdout).decode(errors='replace')[-400:]}")


class _Member:
    """One side: setup/teardown of pod ``i``'s two mappings (TCP 20000+i, UDP 30000+i) to 10.202.x.y."""

    def __init__(self, key: str, netns: str, state: str) -> None:
        self.key, self.netns, self.state = key, netns, state
        self.native = HostPortPlugin()
        self.env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), "NETPLUGIN_STATE_DIR": state}

    @staticmethod
    def ip(i: int) -> str:
        return f"10.202.{200 + i // 250}.{i % 250 + 2}"

    def _portmap(self, command: str, i: int) -> None:
        conf = {
            "cniVersion": "1.0.0", "name": "bench-hostport", "type": "portmap", "snat": True,
            "runtimeConfig": {"portMappings": [
                {"hostPort": 20000 + i, "containerPort": 80, "protocol": "tcp"},
                {"hostPort": 30000 + i, "containerPort": 53, "protocol": "udp"}]},
            "prevResult": {"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "sandbox": self.netns}],
                           "ips": [{"address": f"{self.ip(i)}/16", "interface": 0}]},
        }  # fmt: skip
        env = dict(self.env, CNI_COMMAND=command, CNI_CONTAINERID=f"bench{i}", CNI_NETNS=self.netns,
                   CNI_IFNAME="eth0", CNI_PATH="/usr/lib/cni")  # fmt: skip
        _run([PORTMAP], env, json.dumps(conf).encode(), f"portmap {command}")

    def _pod_env(self, i: int) -> dict[str, str]:
        ports = f"tcp/{20000 + i}/80 udp/{30000 + i}/53"
        return dict(self.env, NETPLUGIN_HOST_PORTS=ports, NETPLUGIN_PREV_IPS=self.ip(i))

    def _bash(self, action: str, i: int) -> None:
        env = self._pod_env(i)
        _run([str(HOSTPORT), action, "bench", f"p{i}", f"bench{i}"], env, b"", f"hostport {action}")

    def _native(self, action: str, i: int) -> None:
        ctx = CallContext(env=self._pod_env(i), state_dir=self.state)
        getattr(self.native, action)(PodRef("bench", f"p{i}", f"bench{i}"), ctx)

    def setup(self, i: int) -> None:
        {"A": lambda: self._portmap("ADD", i), "B": lambda: self._bash("setup", i),
         "N": lambda: self._native("setup", i)}[self.key]()  # fmt: skip

    def teardown(self, i: int) -> None:
        {"A": lambda: self._portmap("DEL", i), "B": lambda: self._bash("teardown", i),
         "N": lambda: self._native("teardown", i)}[self.key]()  # fmt: skip


def _ms(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000


def _rebuild_ms(state: str) -> float:
    records = os.path.join(state, "hostport-rebuild")
    os.makedirs(records)
    for i in range(500):
        chain = chain_name(f"rebuild-{i}")
        rules = pod_rules(chain, parse_env(f"tcp/{40000 + i}/80 udp/{50000 + i}/53"), [_Member.ip(i)])
        with open(os.path.join(records, chain), "w") as f:
            f.write(f"bench/r{i} rebuild-{i}\ntcp.{40000 + i} udp.{50000 + i}\n" + "\n".join(rules) + "\n")
    t0 = time.perf_counter()
    script = rebuild_script(records)
    done = subprocess.run(["nft", "-f", "-"], input=script, capture_output=True, text=True, timeout=120, check=False)
    ms = (time.perf_counter() - t0) * 1000
    if done.returncode != 0:
        raise BenchError(f"rebuild failed: {done.stderr[-400:]}")
    return ms


def fig_hostport(ctx: RunContext, plan: Plan, keys: list[str]) -> list[Figure]:
    """Per-pod hostPort setup and teardown, A vs B and N; the rebuild of 1,000 mappings."""
    keys = [k for k in HOSTPORT_KEYS if k in keys] or list(HOSTPORT_KEYS)
    if not os.access(PORTMAP, os.X_OK):
        keys = [k for k in keys if k != "A"]
    n, name = plan.pods, f"{ctx.tag}hostport"
    live = Live(ctx, "hostport", keys)
    setups: dict[str, list[float]] = {k: [] for k in keys}
    teardowns: dict[str, list[float]] = {k: [] for k in keys}
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        with tempfile.TemporaryDirectory() as state, entered(f"/run/netns/{name}"):
            subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
            members = {k: _Member(k, f"/run/netns/{name}", os.path.join(state, k)) for k in keys}
            for m in members.values():
                os.makedirs(m.state)
            HostPortPlugin().init(CallContext(env=members[keys[0]].env, state_dir=state))
            ctx.progress(f"  hostport: {n} pods x {len(keys)} contenders")
            for i in range(n):
                for k in live.order(i):
                    t = live.call(k, _ms, lambda k=k, i=i: members[k].setup(i + 1000 * "ABN".index(k)))
                    if t is not None:
                        setups[k].append(t)
            for i in range(n):
                for k in live.order(i):
                    if i < len(setups[k]):
                        t = live.call(k, _ms, lambda k=k, i=i: members[k].teardown(i + 1000 * "ABN".index(k)))
                        if t is not None:
                            teardowns[k].append(t)
            rebuild = _rebuild_ms(state)
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)
    out = []
    for fid, title, samples in (("hostport-setup", "setup", setups), ("hostport-teardown", "teardown", teardowns)):
        f = Figure(fid, f"hostPort: per-pod {title} of the hostPort member, 2 mappings ({n} pods)", "ms",
                   ["median", "p90"], ratio_column="median", samples=samples)
        f.rows = [stat_row(live, k, LABELS[k], samples[k], ["median", "p90"]) for k in keys]
        f.params = {"pods": n}
        f.notes = [
            "The hostPort member alone (the bridge before it is the same on every side), in a netns of the "
            "figure's own; one TCP and one UDP mapping per pod.",
            f"The built-in's rebuild of its table from 1,000 recorded mappings (500 pods): {rebuild:.1f} ms, "
            "one nft transaction (the daemon runs it at every start).",
            "Targets (issue 29, for the whole chain through the daemon): native setup <= 0.8x CNI's, bash <= 1.5x, "
            "teardown <= 1.0x.",
        ]
        out.append(f)
    return out
