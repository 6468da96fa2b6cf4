"""``netplugin demo``: netplugin's main job on one machine, no cluster needed.

Pods are described by manifests in a temporary StaticHost directory; their
"infra containers" are network namespaces named after the infra ids; the
plugin is the bridge plugin from ``exec_plugins/``. The demo sets up N pods,
proves pod-to-pod and host-to-pod TCP connectivity, tears everything down and
proves that nothing is left: no veth on the bridge, no netns, no allocated
address. Whatever happens (a failure, Ctrl-C, SIGTERM) it cleans up.

Everything lives under names unique to the run (bridge ``npdm<hex>``, netns
``np-demo-<hex>-<i>``) and a /24 inside 10.207.0.0/16, reserved for the demo.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from netplugin.core.config import Config, load_config
from netplugin.core.datadir import DATA_DIR_ENV, data_dirs
from netplugin.core.errors import InvalidArgument, NetpluginError, SystemFailure
from netplugin.core.execplugin.invoke import Background, SpawnError, run, start
from netplugin.core.names import PodRef
from netplugin.hosts.static import StaticHost
from netplugin.manager.manager import Manager

__all__ = ["DemoPod", "DemoReport", "bridge_ports", "check_prerequisites", "find_plugin_source", "run_demo", "run_ip"]

DEMO_NAMESPACE = "demo"
DEMO_PORT = 8080
#: how long a leftover check waits for the deletions a teardown left running after its answer
_DELETION_WAIT = 10.0
_LISTENER = r"""
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen(16)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(sys.argv[2].encode())
    c.close()
"""
_CONNECT = r"""
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)
print(c.recv(256).decode())
"""


@dataclass
class DemoPod:
    name: str
    infra_id: str
    ip: str = ""
    setup_ms: float = 0.0
    teardown_ms: float = 0.0

    @property
    def ref(self) -> PodRef:
        return PodRef(DEMO_NAMESPACE, self.name, self.infra_id)


@dataclass
class DemoReport:
    pods: list[DemoPod]
    bridge: str
    subnet: str
    plugin: str
    checks: list[tuple[str, str, bool]] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(ok for _, _, ok in self.checks) and not self.leftovers

    def to_dict(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "plugin": self.plugin,
            "bridge": self.bridge,
            "subnet": self.subnet,
            "pods": [vars(p) for p in self.pods],
            "checks": [{"from": a, "to": b, "ok": ok} for a, b, ok in self.checks],
            "leftovers": self.leftovers,
        }


def find_plugin_source(explicit: str | None = None) -> Path:
    """The directory holding the shipped exec plugins (``bridge/bridge`` inside).

    ``explicit`` (``--plugin-source``) is the only place tried when given; otherwise the data dirs
    of :mod:`netplugin.core.datadir` (the checkout, then ``<prefix>/share/netplugin``).
    """
    candidates = [Path(explicit)] if explicit else [d / "exec_plugins" for d in data_dirs()]
    for c in candidates:
        if (c / "bridge" / "bridge").is_file():
            return c
    raise SystemFailure(
        "cannot find the bridge plugin",
        ", ".join(str(c) for c in candidates),
        f"reinstall netplugin, set {DATA_DIR_ENV} or pass --plugin-source DIR",
    )


def run_ip(*args: str) -> str:
    """``ip ARGS``' stdout; a SystemFailure when it cannot run or fails (its stderr)."""
    try:
        done = run(["ip", *args], env=os.environ, timeout=20)
    except SpawnError as e:
        raise SystemFailure("cannot run ip (install iproute2)", None, e.reason) from e
    if done.returncode != 0:
        raise SystemFailure("ip " + " ".join(args), None, done.stderr.decode(errors="replace").strip())
    return done.stdout.decode()


def _connect(from_netns: str | None, ip: str) -> str:
    argv = [sys.executable, "-c", _CONNECT, ip, str(DEMO_PORT)]
    if from_netns:
        argv = ["ip", "netns", "exec", from_netns, *argv]
        done = run(argv, env=os.environ, timeout=10)
        return done.stdout.decode().strip() if done.returncode == 0 else ""
    try:
        with socket.create_connection((ip, DEMO_PORT), timeout=3) as c:
            return c.recv(256).decode()
    except OSError:
        return ""


def check_prerequisites() -> None:
    """Root, ``ip`` and ``flock``: what a demo needs before it makes anything (SystemFailure: which is missing)."""
    if os.geteuid() != 0:
        raise SystemFailure("netplugin demo", None, "must run as root (it creates network namespaces and a bridge)")
    for tool in ("ip", "flock"):
        if shutil.which(tool) is None:
            raise SystemFailure("netplugin demo", None, f"{tool} is not installed (run scripts/demo.sh once)")


def _make_config(
    tmp: Path, plugin: str, plugin_source: str | None, bridge: str, subnet: str, base: Config | None
) -> Config:
    """A throw-away node under ``tmp``: exec dir (with the bash bridge plugin when chosen), pods, state, run."""
    exec_dir, pods_dir, state_dir, run_dir = (tmp / d for d in ("exec", "pods", "state", "run"))
    for d in (exec_dir, pods_dir, state_dir, run_dir):
        d.mkdir(mode=0o755)
    if plugin == "bridge":
        shutil.copytree(find_plugin_source(plugin_source) / "bridge", exec_dir / "bridge")
        for p in (exec_dir / "bridge", exec_dir / "bridge" / "bridge"):
            os.chmod(p, 0o755)
    return load_config(
        os.devnull,
        environ={},
        overrides={
            "plugin_dir": str(exec_dir),
            "plugin": plugin,
            "state_dir": str(state_dir),
            "run_dir": str(run_dir),
            "pods_dir": str(pods_dir),
            "env": {
                "NETPLUGIN_BRIDGE_NAME": bridge,
                "NETPLUGIN_BRIDGE_SUBNET": subnet,
                "NETPLUGIN_BRIDGE_STATE_DIR": str(state_dir / "bridge"),
            },
        },
        base=base,
    )


class _DemoRun:
    """One demo run's resources, so that every exit path can release exactly what was made."""

    def __init__(self, manager: Manager, report: DemoReport, pods_dir: Path, progress: Callable[[str], None]) -> None:
        self.manager = manager
        self.report = report
        self.pods_dir = pods_dir
        self.progress = progress
        self.created_netns: list[str] = []
        self.set_up: list[DemoPod] = []
        self.listeners: list[Background] = []

    def set_up_pods(self) -> None:
        for pod in self.report.pods:
            manifest = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": pod.name, "namespace": DEMO_NAMESPACE, "labels": {"app": "demo"}},
                "spec": {"containers": [{"name": "app", "image": "busybox"}]},
            }
            (self.pods_dir / f"{pod.name}.json").write_text(json.dumps(manifest))
            run_ip("netns", "add", pod.infra_id)
            self.created_netns.append(pod.infra_id)
        for pod in self.report.pods:
            t0 = time.perf_counter()
            self.manager.setup(pod.ref)
            pod.setup_ms = (time.perf_counter() - t0) * 1000
            self.set_up.append(pod)
            status = self.manager.status(pod.ref)
            if status is None:
                raise SystemFailure("demo", None, f"plugin reported no IP for pod {pod.ref}")
            pod.ip = status.ip
        self.progress("")
        self.progress(f"{'POD':<14} {'INFRA ID':<22} {'IP':<16} {'SETUP':>8}")
        for pod in self.report.pods:
            self.progress(
                f"{DEMO_NAMESPACE + '/' + pod.name:<14} {pod.infra_id:<22} {pod.ip:<16} {pod.setup_ms:7.1f}ms"
            )
        self.progress("")

    def check_connectivity(self) -> None:
        report, progress = self.report, self.progress
        for pod in report.pods:
            bg = start(["ip", "netns", "exec", pod.infra_id, sys.executable, "-c", _LISTENER, str(DEMO_PORT), pod.name])
            self.listeners.append(bg)
            if bg.read_line(10).strip() != b"ready":
                raise SystemFailure("demo", None, f"the listener in pod {pod.name} did not start")
        for src in report.pods:
            for dst in report.pods:
                if src is not dst:
                    ok = _connect(src.infra_id, dst.ip) == dst.name
                    report.checks.append((src.name, dst.name, ok))
                    progress(f"  {src.name} -> {dst.name} ({dst.ip}:{DEMO_PORT}): {'ok' if ok else 'FAILED'}")
        for dst in report.pods:
            ok = _connect(None, dst.ip) == dst.name
            report.checks.append(("host", dst.name, ok))
            progress(f"  host -> {dst.name} ({dst.ip}:{DEMO_PORT}): {'ok' if ok else 'FAILED'}")
        self.stop_listeners()

    def stop_listeners(self) -> None:
        for bg in self.listeners:
            bg.stop()
        self.listeners.clear()

    def tear_down_pods(self) -> None:
        self.progress("")
        for pod in list(self.set_up):
            t0 = time.perf_counter()
            self.manager.teardown(pod.ref)
            pod.teardown_ms = (time.perf_counter() - t0) * 1000
            self.set_up.remove(pod)
            self.progress(f"  teardown {pod.ref}: {pod.teardown_ms:.1f}ms")
        for ns in list(self.created_netns):
            run_ip("netns", "del", ns)
            self.created_netns.remove(ns)

    def clean_up(self) -> None:
        """Best effort, after a failure or an interrupt: release whatever is still there."""
        self.stop_listeners()
        for pod in self.set_up:
            try:
                self.manager.teardown(pod.ref)
            except NetpluginError as e:
                self.progress(f"cleanup: teardown of {pod.ref} failed: {e}")
        for ns in self.created_netns:
            run(["ip", "netns", "del", ns], env=os.environ, timeout=20)


def run_demo(
    pods: int = 3,
    *,
    plugin: str = "bridge",
    plugin_source: str | None = None,
    subnet: str | None = None,
    progress: Callable[[str], None] = lambda _msg: None,
    base: Config | None = None,
) -> DemoReport:
    """Run the demo; see the module doc. Raises NetpluginError on a failure (after cleaning up)."""
    if not 1 <= pods <= 200:
        raise InvalidArgument("pods", pods, "must be between 1 and 200")
    check_prerequisites()
    tag = secrets.token_hex(3)
    bridge = f"npdm{tag}"
    subnet = subnet or f"10.207.{random.randrange(256)}.0/24"
    tmp = Path(tempfile.mkdtemp(prefix="netplugin-demo-"))
    os.chmod(tmp, 0o755)
    report = DemoReport([DemoPod(f"demo-{i}", f"np-demo-{tag}-{i}") for i in range(pods)], bridge, subnet, plugin)
    demo: _DemoRun | None = None
    try:
        cfg = _make_config(tmp, plugin, plugin_source, bridge, subnet, base)
        demo = _DemoRun(Manager(cfg, StaticHost(cfg.pods_dir)), report, tmp / "pods", progress)
        progress(f"plugin {plugin}, bridge {bridge}, subnet {subnet}, {pods} pod(s)")
        demo.set_up_pods()
        demo.check_connectivity()
        demo.tear_down_pods()
        report.leftovers = _leftovers(report, tmp / "state" / "bridge" / bridge)
        run_ip("link", "del", bridge)
    finally:
        if demo is not None:
            demo.clean_up()
        run(["ip", "link", "del", bridge], env=os.environ, timeout=20)  # absent already on success
        shutil.rmtree(tmp, ignore_errors=True)
    if report.leftovers:
        progress("left behind: " + "; ".join(report.leftovers))
    else:
        progress("nothing left behind: no veth on the bridge, no netns, no allocated address")
    return report


def bridge_ports(bridge: str) -> str:
    """The links still on ``bridge`` once the teardowns' deletions are over, empty when none.

    A teardown answers once the pod is off the network and deletes its host veth after (see
    docs/cni.md), so a veth may still be going when the last teardown returns: wait, bounded,
    rather than report a deletion in progress as a leftover.
    """
    deadline = time.monotonic() + _DELETION_WAIT
    while True:
        ports = run_ip("-o", "link", "show", "master", bridge).strip()
        if not ports or time.monotonic() >= deadline:
            return ports
        time.sleep(0.05)


def _leftovers(report: DemoReport, ipam_dir: Path) -> list[str]:
    found = []
    ports = bridge_ports(report.bridge)
    if ports:
        found.append(f"veths still on {report.bridge}: {ports}")
    names = set(run_ip("netns", "list").split())
    stray = [p.infra_id for p in report.pods if p.infra_id in names]
    if stray:
        found.append(f"netns still present: {', '.join(stray)}")
    ips = ipam_dir / "ips"
    held = sorted(os.listdir(ips)) if ips.is_dir() else []
    if held:
        found.append(f"addresses still allocated: {', '.join(held)}")
    return found
