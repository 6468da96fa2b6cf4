"""``netplugin demo --chain``: a plugin chain on one machine, a bridge then the bandwidth plugin.

Two pods, set up through the chain ``[bridge, bandwidth]`` (or the native bridge first): ``shaped``
carries ``kubernetes.io/ingress-bandwidth`` and ``kubernetes.io/egress-bandwidth``, ``plain`` carries
none. The demo measures a TCP transfer into and out of each pod (between the two pods, and between
``plain`` and the host), prints the rates next to the limits, tears both pods down and checks that
nothing is left (no veth, no ifb, no netns, no address). Names are unique to the run, the subnet a
/24 of the demo's 10.207.0.0/16, as ``netplugin demo``.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from netplugin.core.config import Config, load_config
from netplugin.core.errors import NetpluginError, SystemFailure
from netplugin.core.execplugin.invoke import run, start
from netplugin.core.names import PodRef
from netplugin.frontends.lab.demo import DEMO_NAMESPACE, bridge_ports, check_prerequisites, find_plugin_source, run_ip
from netplugin.hosts.static import StaticHost
from netplugin.manager.manager import Manager
from netplugin.manager.reporting import Hooks
from netplugin.plugins.bridge.settings import host_veth_name

__all__ = ["ChainDemoReport", "Transfer", "run_chain_demo", "tcp_rate"]

INGRESS, EGRESS = "kubernetes.io/ingress-bandwidth", "kubernetes.io/egress-bandwidth"
LIMITS = {INGRESS: ("20M", 20e6), EGRESS: ("10M", 10e6)}
_PORT = 5201
_SINK = r"""
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(1); print("ready", flush=True)
c, _ = s.accept(); n = 0; first = None
while True:
    b = c.recv(1 << 16)
    if not b: break
    if first is None: first = time.monotonic()
    n += len(b)
print(n, time.monotonic() - first, flush=True)
"""
_SOURCE = r"""
import socket, sys
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30) as c:
    c.sendall(b"x" * int(sys.argv[3]))
"""


@dataclass
class Transfer:
    what: str
    limit_bps: float | None
    measured_bps: float

    @property
    def ok(self) -> bool:
        if self.limit_bps is None:
            return self.measured_bps > 5 * LIMITS[INGRESS][1]  # unshaped: far above any limit here
        return 0.75 * self.limit_bps <= self.measured_bps <= 1.25 * self.limit_bps

    def to_dict(self) -> dict[str, object]:
        return {"what": self.what, "limit_bps": self.limit_bps, "measured_bps": round(self.measured_bps), "ok": self.ok}


@dataclass
class ChainDemoReport:
    chain: list[str]
    bridge: str
    subnet: str
    transfers: list[Transfer] = field(default_factory=list)
    #: each chain member's calls: pod, member, action, milliseconds, outcome (the manager's observer)
    calls: list[dict[str, Any]] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.transfers) and all(t.ok for t in self.transfers) and not self.leftovers

    def to_dict(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "chain": self.chain,
            "bridge": self.bridge,
            "subnet": self.subnet,
            "transfers": [t.to_dict() for t in self.transfers],
            "calls": self.calls,
            "leftovers": self.leftovers,
        }


def tcp_rate(src: str | None, dst: str | None, ip: str, nbytes: int) -> float:
    """Bits per second of ``nbytes`` over TCP from netns ``src`` to netns ``dst`` (None: the host)."""

    def argv(ns: str | None, *rest: str) -> list[str]:
        return ["ip", "netns", "exec", ns, sys.executable, *rest] if ns else [sys.executable, *rest]

    sink = start(argv(dst, "-c", _SINK, str(_PORT)))
    try:
        if sink.read_line(10).strip() != b"ready":
            raise SystemFailure("demo --chain", None, "the receiving end did not start")
        done = run(argv(src, "-c", _SOURCE, ip, str(_PORT), str(nbytes)), env=os.environ, timeout=120)
        if done.returncode != 0:
            raise SystemFailure("demo --chain", None, "transfer failed: " + done.stderr.decode(errors="replace")[-300:])
        words = sink.read_line(120).split()
    finally:
        sink.stop()
    if len(words) != 2 or int(words[0]) != nbytes:
        raise SystemFailure("demo --chain", None, f"the receiver got {words!r}, not {nbytes} bytes")
    return nbytes * 8 / float(words[1])


def _config(tmp: Path, first: str, plugin_source: str | None, bridge: str, subnet: str, base: Config | None) -> Config:
    exec_dir = tmp / "exec"
    for d in ("exec", "pods", "state", "run"):
        (tmp / d).mkdir(mode=0o755)
    source = find_plugin_source(plugin_source)
    for name in ("bridge", "bandwidth") if first == "bridge" else ("bandwidth",):
        shutil.copytree(source / name, exec_dir / name)
        for p in (exec_dir / name, exec_dir / name / name):
            os.chmod(p, 0o755)
    return load_config(
        os.devnull,
        environ={},
        base=base,
        overrides={
            "plugin_dir": str(exec_dir),
            "plugins": [first, "bandwidth"],
            "state_dir": str(tmp / "state"),
            "run_dir": str(tmp / "run"),
            "pods_dir": str(tmp / "pods"),
            "env": {
                "NETPLUGIN_BRIDGE_NAME": bridge,
                "NETPLUGIN_BRIDGE_SUBNET": subnet,
                "NETPLUGIN_BRIDGE_STATE_DIR": str(tmp / "state" / "bridge"),
            },
        },
    )


def _pods(tmp: Path, tag: str) -> dict[str, PodRef]:
    pods = {}
    for name in ("shaped", "plain"):
        meta: dict[str, object] = {"name": name, "namespace": DEMO_NAMESPACE}
        if name == "shaped":
            meta["annotations"] = {k: v[0] for k, v in LIMITS.items()}
        (tmp / "pods" / f"{name}.json").write_text(json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": meta}))
        pods[name] = PodRef(DEMO_NAMESPACE, name, f"np-chain-{tag}-{name}")
    return pods


def _observer(report: ChainDemoReport, current: list[str]) -> Callable[[str, str, float, str], None]:
    def observe(member: str, action: str, seconds: float, outcome: str) -> None:
        report.calls.append({"pod": current[0], "member": member, "action": action,
                             "ms": round(seconds * 1000, 2), "outcome": outcome})

    return observe


def _measure(report: ChainDemoReport, ips: dict[str, str], ns: dict[str, str], say: Callable[[str], None]) -> None:
    plan = [
        ("into shaped (plain -> shaped)", "plain", "shaped", LIMITS[INGRESS][1], 5_000_000),
        ("out of shaped (shaped -> plain)", "shaped", "plain", LIMITS[EGRESS][1], 2_500_000),
        ("into plain (host -> plain)", None, "plain", None, 50_000_000),
        ("out of plain (plain -> host)", "plain", None, None, 50_000_000),
    ]
    say(f"{'TRANSFER':<34} {'LIMIT':>10} {'MEASURED':>12}")
    for what, src, dst, limit, nbytes in plan:
        dst_ip = ips[dst] if dst else ips["gateway"]
        bps = tcp_rate(ns[src] if src else None, ns[dst] if dst else None, dst_ip, nbytes)
        t = Transfer(what, limit, bps)
        report.transfers.append(t)
        shown = f"{limit / 1e6:.0f} Mbit/s" if limit else "none"
        say(f"{what:<34} {shown:>10} {bps / 1e6:>7.1f} Mbit/s  {'ok' if t.ok else 'OFF'}")


def _clean_up(
    manager: Manager | None, up: list[PodRef], made: list[str], bridge: str, tmp: Path, progress: Callable[[str], None]
) -> None:
    """Whatever a failed run left: its pods torn down, its netns, bridge and files removed."""
    for ref in up:
        try:
            if manager is not None:
                manager.teardown(ref)
        except NetpluginError as e:
            progress(f"cleanup: teardown of {ref} failed: {e}")
    for ns in made:
        run(["ip", "netns", "del", ns], env=os.environ, timeout=20)
    run(["ip", "link", "del", bridge], env=os.environ, timeout=20)
    shutil.rmtree(tmp, ignore_errors=True)


def run_chain_demo(
    *,
    first: str = "bridge",
    plugin_source: str | None = None,
    subnet: str | None = None,
    progress: Callable[[str], None] = lambda _msg: None,
    base: Config | None = None,
) -> ChainDemoReport:
    """Run the chain demo; see the module doc. Raises NetpluginError on a failure (after cleaning up)."""
    check_prerequisites()
    tag = secrets.token_hex(3)
    bridge, subnet = f"npdc{tag}", subnet or f"10.207.{random.randrange(256)}.0/24"
    tmp = Path(tempfile.mkdtemp(prefix="netplugin-demo-chain-"))
    os.chmod(tmp, 0o755)
    report = ChainDemoReport([first, "bandwidth"], bridge, subnet)
    made: list[str] = []
    up: list[PodRef] = []
    manager: Manager | None = None
    try:
        cfg = _config(tmp, first, plugin_source, bridge, subnet, base)
        current = [""]  # the pod whose action runs (the observer is told the member, not the pod)
        manager = Manager(cfg, StaticHost(cfg.pods_dir), hooks=Hooks(observe=_observer(report, current)))
        pods = _pods(tmp, tag)
        progress(f"chain {', '.join(report.chain)}; bridge {bridge}, subnet {subnet}")
        progress(f"pod shaped: {INGRESS}={LIMITS[INGRESS][0]}, {EGRESS}={LIMITS[EGRESS][0]}; pod plain: none")
        ips = {"gateway": subnet.split("/")[0].rsplit(".", 1)[0] + ".1"}
        for name, ref in pods.items():
            current[0] = name
            run_ip("netns", "add", ref.infra_id)
            made.append(ref.infra_id)
            t0 = time.perf_counter()
            status = manager.setup(ref)
            up.append(ref)
            status = status or manager.status(ref)
            if status is None:
                raise SystemFailure("demo --chain", None, f"no IP for pod {ref}")
            ips[name] = status.ip
            progress(f"  setup {ref} through the chain: {(time.perf_counter() - t0) * 1000:.1f} ms, IP {status.ip}")
        _measure(report, ips, {n: r.infra_id for n, r in pods.items()}, progress)
        for ref in list(up):
            current[0] = ref.name
            manager.teardown(ref)
            up.remove(ref)
        for ns in list(made):
            run_ip("netns", "del", ns)
            made.remove(ns)
        report.leftovers = _leftovers(bridge, tmp / "state" / "bridge" / bridge, list(pods.values()))
    finally:
        _clean_up(manager, up, made, bridge, tmp, progress)
    progress(
        "left behind: " + "; ".join(report.leftovers)
        if report.leftovers
        else "nothing left behind: no veth, no ifb, no netns, no allocated address"
    )
    return report


def _leftovers(bridge: str, ipam_dir: Path, pods: list[PodRef]) -> list[str]:
    found = []
    ports = bridge_ports(bridge)
    if ports:
        found.append(f"veths still on {bridge}: {ports}")
    # the bandwidth plugin's ifb: "nbw" + the hash digits the bridge puts in its veth names
    # /proc/sys/net, not /sys/class/net: the first is this process's netns even under a bare nsenter
    names = ("nbw" + host_veth_name(p.infra_id)[2:] for p in pods)
    ifbs = [n for n in names if os.path.exists(f"/proc/sys/net/ipv4/conf/{n}")]
    held = sorted(os.listdir(ipam_dir / "ips")) if (ipam_dir / "ips").is_dir() else []
    if held:
        found.append(f"addresses still allocated: {', '.join(held)}")
    return found + ([f"ifb devices of the run still present: {', '.join(ifbs)}"] if ifbs else [])
