"""The contenders: five ways of wiring a pod to a Linux bridge, behind one small interface.

A  the reference CNI ``bridge`` + ``host-local`` plugins (Debian containernetworking-plugins),
   exec'd the way libcni does it: CNI_* environment, the network config on stdin.
B  the ``netplugin`` CLI (a new process per action) with ``exec_plugins/bridge``.
C  the daemon (``netplugin serve``) with ``exec_plugins/bridge``; the benchmark is its client.
D  the daemon with the in-process plugin ``netplugin.io/bridge``.
E  the floor: the same netlink requests sent directly with pyroute2 from the benchmark's own
   process: no exec, no IPAM, no locks, no state.

Every contender wires a pod the same way: a veth pair whose host end is a port of the
network's bridge (hairpin on) and whose pod end is ``eth0`` with an address of the subnet and
a default route via the bridge's gateway address. ipMasq is off for A; no contender touches
iptables.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from .util import (
    NETNS_DIR,
    REPO,
    BenchError,
    Cleanup,
    NetnsFactory,
    Pod,
    ip,
    links_with_prefix,
    netns_socket,
    wait_until,
)

__all__ = [
    "CNI_BRIDGE",
    "CNI_DIR",
    "CONTENDERS",
    "LABELS",
    "CliContender",
    "CniContender",
    "Contender",
    "DaemonContender",
    "DirectBridgeContender",
    "FloorContender",
    "Network",
    "RunContext",
    "cli_command",
]

CNI_DIR = "/usr/lib/cni"
CNI_BRIDGE = f"{CNI_DIR}/bridge"
POD_NAMESPACE = "bench"

#: key -> one-line description, in report order
CONTENDERS = {
    "A": "CNI bridge + host-local (exec per ADD/DEL)",
    "B": "netplugin CLI + exec_plugins/bridge",
    "C": "netplugin daemon + exec_plugins/bridge",
    "D": "netplugin daemon + netplugin.io/bridge (native)",
    "E": "floor: pyroute2 in one process (no exec, no IPAM)",
}
#: row labels, contenders and the reference rows some figures add
LABELS = {
    **CONTENDERS,
    "X": "reference: exec_plugins/bridge exec'd directly, no netplugin",
}


def cli_command() -> tuple[list[str], str]:
    """How to start the ``netplugin`` CLI of this checkout: (argv prefix, description).

    The installed console script when it imports this checkout's package (what an operator
    runs); otherwise ``python -m netplugin`` with the checkout on PYTHONPATH. Where the script
    imports from is asked of a fresh interpreter outside the checkout: an editable install's
    import hook can win over PYTHONPATH there, so this process's own view does not tell.
    """
    script = Path(sys.executable).parent / "netplugin"
    if script.is_file() and os.access(script, os.X_OK):
        done = subprocess.run(
            [sys.executable, "-c", "import netplugin; print(netplugin.__file__)"],
            capture_output=True,
            text=True,
            cwd="/",
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        origin = Path(done.stdout.strip()).resolve() if done.returncode == 0 and done.stdout.strip() else None
        if origin is not None and REPO in origin.parents:
            return [str(script)], f"console script {script}"
    return [sys.executable, "-m", "netplugin"], f"{sys.executable} -m netplugin"


def clean_environ() -> dict[str, str]:
    """The benchmark's environment minus netplugin's own settings (so none of the machine's leak in)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_") and not k.startswith("CNI_")}
    env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    return env


@dataclass
class RunContext:
    """What every figure shares: the run's tag, scratch dir, netns factory and cleanup stack."""

    tag: str  # "np" + 6 hex digits
    workdir: Path
    netns: NetnsFactory
    cleanup: Cleanup
    cli: list[str] = field(default_factory=list)
    progress: Any = print
    #: failures that did not stop the run (a contender left out of a figure); they go into the report
    problems: list[str] = field(default_factory=list)
    _ids: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def next_id(self) -> int:
        with self._lock:
            self._ids += 1
            return self._ids


class Network:
    """One bridge and subnet, its pods' network namespaces and its scratch dir.

    Contenders set pods up on a network; the network owns what must be removed at the end:
    every netns it created (removing a netns also removes the veth pairs in it), then the
    bridge, then the directory.
    """

    def __init__(self, ctx: RunContext, name: str, subnet: Any) -> None:
        self.ctx = ctx
        self.name = name
        self.bridge = f"{ctx.tag}{name}"
        if len(self.bridge) > 15:
            raise ValueError(f"bridge name {self.bridge!r} is longer than 15 characters")
        self.subnet = subnet
        self.gateway = str(next(subnet.hosts()))
        self.dir = ctx.workdir / name
        self.dir.mkdir(mode=0o755)
        self._netns: list[str] = []
        self._count = 0
        self._closed = False
        ctx.cleanup.push(f"network {self.bridge}", self.close)

    def new_pods(self, n: int) -> list[Pod]:
        """``n`` new pods, each with a fresh network namespace (not timed by anyone)."""
        pods = []
        for _ in range(n):
            i = self._count
            self._count += 1
            infra = f"{self.ctx.tag}-{self.name}-{i}"
            self.ctx.netns.create(infra)
            self._netns.append(infra)
            pods.append(Pod(POD_NAMESPACE, f"p-{self.name}-{i}", infra, i))
        return pods

    def drop_pods(self, pods: Sequence[Pod]) -> None:
        """Remove the pods' network namespaces (after their teardown, or instead of it)."""
        gone = {p.infra_id for p in pods}
        for name in gone:
            self.ctx.netns.remove(name)
        self._netns = [n for n in self._netns if n not in gone]

    def ports(self) -> list[str]:
        try:
            return os.listdir(f"/sys/class/net/{self.bridge}/brif")
        except OSError:
            return []

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for name in self._netns:
            self.ctx.netns.remove(name)
        self._netns.clear()
        # The kernel removes the veths of deleted namespaces asynchronously: wait, so that the next
        # figure does not run while it is busy, and so that nothing of ours is left behind.
        wait_until(lambda: not self.ports(), timeout=120, interval=0.1)
        if os.path.exists(f"/sys/class/net/{self.bridge}"):
            ip("link", "del", self.bridge, check=False)
        shutil.rmtree(self.dir, ignore_errors=True)


class Contender:
    """One way of setting pods up. ``setup``/``teardown`` raise BenchError when the contender fails."""

    key: ClassVar[str] = "?"
    #: True when ``burst`` really runs setups concurrently
    concurrent: ClassVar[bool] = True

    def __init__(self, net: Network) -> None:
        self.net = net
        self.ctx = net.ctx

    @property
    def label(self) -> str:
        return LABELS[self.key]

    def start(self) -> None:
        """Get ready (start a daemon, create the bridge); not timed."""

    def setup(self, pod: Pod) -> None:
        raise NotImplementedError

    def teardown(self, pod: Pod) -> None:
        raise NotImplementedError

    def burst(self, pods: Sequence[Pod]) -> float:
        """Set all ``pods`` up at once; returns the makespan in seconds."""
        raise NotImplementedError

    def drain(self, pods: Sequence[Pod]) -> float:
        """Tear all ``pods`` down as fast as this contender can; returns seconds."""
        t0 = time.perf_counter()
        for p in pods:
            self.teardown(p)
        return time.perf_counter() - t0

    def populate(self, pods: Sequence[Pod]) -> None:
        """Set ``pods`` up by the fastest path this contender has (not timed)."""
        for p in pods:
            self.setup(p)

    def rss(self) -> int | None:
        """Resident memory of this contender's long-running process, if it has one (bytes)."""
        return None

    def stop(self) -> None:
        """Stop what ``start`` started (the network itself is closed by its owner)."""


# --- exec'd contenders (A, B) -------------------------------------------------------------------------


@dataclass
class _Call:
    argv: list[str]
    env: dict[str, str]
    stdin: bytes | None = None


def _spawn(call: _Call) -> subprocess.Popen[bytes]:
    p = subprocess.Popen(
        call.argv,
        stdin=subprocess.PIPE if call.stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=call.env,
        close_fds=True,
    )
    if call.stdin is not None:
        assert p.stdin is not None
        # A network config is far below the pipe's capacity: this write never blocks.
        p.stdin.write(call.stdin)
        p.stdin.close()
        p.stdin = None  # communicate() must not touch it again
    return p


def _finish(p: subprocess.Popen[bytes], what: str) -> None:
    out, err = p.communicate()
    if p.returncode != 0:
        text = (err or out).decode(errors="replace").strip()[-600:]
        raise BenchError(f"{what} failed (exit {p.returncode}): {text}")


class ExecContender(Contender):
    """A contender that is one process per action; the benchmark is the runtime calling it."""

    def call(self, action: str, pod: Pod) -> _Call:
        raise NotImplementedError

    def _run(self, action: str, pod: Pod) -> None:
        _finish(_spawn(self.call(action, pod)), f"{self.key} {action} {pod.infra_id}")

    def setup(self, pod: Pod) -> None:
        self._run("setup", pod)

    def teardown(self, pod: Pod) -> None:
        self._run("teardown", pod)

    def burst(self, pods: Sequence[Pod]) -> float:
        # As a runtime would: every process started back to back, then waited for.
        calls = [self.call("setup", p) for p in pods]
        t0 = time.perf_counter()
        procs = [_spawn(c) for c in calls]
        errors = []
        for p, pod in zip(procs, pods, strict=True):
            try:
                _finish(p, f"{self.key} setup {pod.infra_id}")
            except BenchError as e:
                errors.append(str(e))
        t = time.perf_counter() - t0
        if errors:
            raise BenchError("; ".join(errors))
        return t

    def populate(self, pods: Sequence[Pod], width: int = 8) -> None:
        for i in range(0, len(pods), width):
            chunk = pods[i : i + width]
            procs = [_spawn(self.call("setup", p)) for p in chunk]
            for p, pod in zip(procs, chunk, strict=True):
                _finish(p, f"{self.key} setup {pod.infra_id}")


class CniContender(ExecContender):
    """A: /usr/lib/cni/bridge with host-local IPAM, exec'd like libcni (CNI_* env, config on stdin)."""

    key = "A"

    def __init__(self, net: Network) -> None:
        super().__init__(net)
        self.config = json.dumps(
            {
                "cniVersion": "1.0.0",
                "name": f"{net.bridge}-net",
                "type": "bridge",
                "bridge": net.bridge,
                "isGateway": True,
                # the netplugin bridge plugins give every pod a default route via the gateway: same work
                "isDefaultGateway": True,
                "hairpinMode": True,
                "ipMasq": False,
                "mtu": 1500,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": str(net.subnet), "gateway": net.gateway}]],
                    "dataDir": str(net.dir / "cni-ipam"),
                },
            }
        ).encode()
        self.base_env = clean_environ()
        self.base_env.update(CNI_IFNAME="eth0", CNI_PATH=CNI_DIR)

    def call(self, action: str, pod: Pod) -> _Call:
        env = dict(self.base_env)
        env.update(
            CNI_COMMAND="ADD" if action == "setup" else "DEL",
            CNI_CONTAINERID=pod.infra_id,
            CNI_NETNS=pod.netns,
        )
        return _Call([CNI_BRIDGE], env, self.config)


def netplugin_env(
    net: Network, plugin: str, *, plugin_dir: Path, extra: dict[str, str] | None = None
) -> dict[str, str]:
    """The environment of a netplugin process (CLI or daemon) running on ``net``.

    Settings go in as environment variables, not a config file: reading YAML would add the
    import of ``yaml`` to the CLI's cold path, which a node configured by its environment does
    not pay. The bridge settings are inherited by the plugin (``inherit_env`` is on).
    """
    env = clean_environ()
    env.update(
        NETPLUGIN_PLUGIN_DIR=str(plugin_dir),
        NETPLUGIN_PLUGIN=plugin,
        NETPLUGIN_STATE_DIR=str(net.dir / "state"),
        NETPLUGIN_RUN_DIR=str(net.dir / "run"),
        NETPLUGIN_HOST="none",
        NETPLUGIN_USE_DAEMON="never",
        NETPLUGIN_BRIDGE_NAME=net.bridge,
        NETPLUGIN_BRIDGE_SUBNET=str(net.subnet),
        NETPLUGIN_BRIDGE_STATE_DIR=str(net.dir / "ipam"),
    )
    if os.path.exists("/etc/netplugin/netplugin.yaml"):
        # never read the machine's own config; an empty file costs a YAML import (noted in the report)
        empty = net.dir / "netplugin.yaml"
        empty.write_text("{}\n")
        env["NETPLUGIN_CONFIG"] = str(empty)
    env.update(extra or {})
    return env


def install_exec_plugin(dest: Path, name: str, source: Path | None = None, script: str | None = None) -> Path:
    """Put plugin ``name`` into exec dir ``dest`` (root-owned, 0755: netplugin refuses anything looser)."""
    dest.mkdir(mode=0o755, exist_ok=True)
    os.chmod(dest, 0o755)
    d = dest / name
    d.mkdir(mode=0o755, exist_ok=True)
    os.chmod(d, 0o755)
    exe = d / name
    if script is not None:
        exe.write_text(script)
    else:
        assert source is not None
        shutil.copyfile(source, exe)
    os.chmod(exe, 0o755)
    return dest


def bridge_plugin_dir(net: Network) -> Path:
    exe_dir = net.dir / "exec"
    if not (exe_dir / "bridge" / "bridge").exists():
        install_exec_plugin(exe_dir, "bridge", REPO / "exec_plugins" / "bridge" / "bridge")
    return exe_dir


class CliContender(ExecContender):
    """B: ``netplugin setup|teardown NS POD INFRA`` with the bash bridge plugin."""

    key = "B"

    def __init__(self, net: Network, env: dict[str, str] | None = None) -> None:
        super().__init__(net)
        self.env = env if env is not None else netplugin_env(net, "bridge", plugin_dir=bridge_plugin_dir(net))
        if self.ctx.cli[0] == sys.executable:
            self.env["PYTHONPATH"] = str(REPO)

    def call(self, action: str, pod: Pod) -> _Call:
        return _Call([*self.ctx.cli, action, pod.namespace, pod.name, pod.infra_id], self.env)


class DirectBridgeContender(ExecContender):
    """X: the bash bridge plugin exec'd with the environment netplugin would give it, by the benchmark."""

    key = "X"

    def __init__(self, net: Network) -> None:
        super().__init__(net)
        self.exe = str(bridge_plugin_dir(net) / "bridge" / "bridge")
        self.env = netplugin_env(net, "bridge", plugin_dir=bridge_plugin_dir(net))
        self.env["NETPLUGIN_PLUGIN"] = "bridge"

    def call(self, action: str, pod: Pod) -> _Call:
        env = dict(self.env)
        env.update(
            NETPLUGIN_ACTION=action,
            NETPLUGIN_POD_NAMESPACE=pod.namespace,
            NETPLUGIN_POD_NAME=pod.name,
            NETPLUGIN_INFRA_ID=pod.infra_id,
            NETPLUGIN_NETNS=pod.netns,
        )
        return _Call([self.exe, action, pod.namespace, pod.name, pod.infra_id], env)

    def start(self) -> None:
        done = subprocess.run(
            [self.exe, "init"],
            env={**self.env, "NETPLUGIN_ACTION": "init"},
            capture_output=True,
            stdin=subprocess.DEVNULL,
            timeout=60,
        )
        if done.returncode != 0:
            raise BenchError(f"X init failed: {done.stderr.decode(errors='replace')[-400:]}")


# --- the daemon (C, D) ------------------------------------------------------------------------------------


def _request_line(op: str, pod: Pod | None = None, **extra: Any) -> bytes:
    body: dict[str, Any] = {"v": 1, "op": op, **extra}
    if pod is not None:
        body.update(namespace=pod.namespace, pod=pod.name, infra_id=pod.infra_id)
    return json.dumps(body, separators=(",", ":")).encode() + b"\n"


def _check_answer(line: bytes, what: str) -> Any:
    try:
        answer = json.loads(line)
    except ValueError as e:
        raise BenchError(f"{what}: the daemon's answer is not JSON: {line[:200]!r}") from e
    if not isinstance(answer, dict) or answer.get("ok") is not True:
        err = answer.get("error") if isinstance(answer, dict) else answer
        raise BenchError(f"{what} failed in the daemon: {json.dumps(err)[:600]}")
    return answer.get("result")


class Daemon:
    """A ``netplugin serve`` process of the benchmark's own (its own socket, dirs and process group)."""

    def __init__(self, env: dict[str, str], socket_path: str, cli: list[str], log: Path) -> None:
        self.env = dict(env)
        self.env["NETPLUGIN_SOCKET"] = socket_path
        # port 0: two daemons (or a machine's own) never fight over the metrics port
        self.env["NETPLUGIN_METRICS_ADDRESS"] = "127.0.0.1:0"
        self.socket = socket_path
        self.cli = cli
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> None:
        logf = open(self.log, "wb")  # noqa: SIM115 - the child keeps it; closed below
        try:
            self.proc = subprocess.Popen(
                [*self.cli, "serve"],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=logf,
                close_fds=True,
                start_new_session=True,
            )
        finally:
            logf.close()
        end = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise BenchError(f"the daemon exited with {self.proc.returncode} at start: {self.log_tail()}")
            try:
                self.request(_request_line("health"), "health")
                return
            except (OSError, BenchError):
                if time.monotonic() > end:
                    raise BenchError(f"the daemon did not answer within {timeout:g}s: {self.log_tail()}") from None
                time.sleep(0.05)

    def log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace").strip()[-800:]
        except OSError:
            return ""

    def connect(self) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        s.connect(self.socket)
        return s

    def request(self, line: bytes, what: str, timeout: float = 120.0) -> Any:
        """One request on a fresh connection, as a thin client process would make it."""
        with self.connect() as s:
            s.settimeout(timeout)
            s.sendall(line)
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    raise BenchError(f"{what}: the daemon closed the connection: {self.log_tail()}")
                buf += chunk
        return _check_answer(buf, what)

    def many(self, lines: Sequence[bytes], what: str, timeout: float = 300.0) -> float:
        """Send every request at once, each on its own connection; seconds until the last answer."""
        sel = selectors.DefaultSelector()
        socks: list[socket.socket] = []
        bufs: dict[int, bytes] = {}
        socks_by_fd: dict[int, socket.socket] = {}
        errors: list[str] = []
        try:
            t0 = time.perf_counter()
            for line in lines:
                s = self.connect()
                socks.append(s)
                s.sendall(line)
                s.setblocking(False)
                bufs[s.fileno()] = b""
                socks_by_fd[s.fileno()] = s
                sel.register(s, selectors.EVENT_READ)
            pending = len(socks)
            end = time.monotonic() + timeout
            while pending:
                left = end - time.monotonic()
                if left <= 0:
                    raise BenchError(f"{what}: {pending} answer(s) missing after {timeout:g}s")
                for key, _ in sel.select(left):
                    s = socks_by_fd[key.fd]
                    chunk = s.recv(65536)
                    fd = s.fileno()
                    bufs[fd] += chunk
                    if not chunk or bufs[fd].endswith(b"\n"):
                        sel.unregister(s)
                        pending -= 1
                        try:
                            _check_answer(bufs[fd], what)
                        except BenchError as e:
                            errors.append(str(e))
            elapsed = time.perf_counter() - t0
        finally:
            sel.close()
            for s in socks:
                s.close()
        if errors:
            raise BenchError(f"{len(errors)} of {len(lines)} failed; first: {errors[0]}")
        return elapsed

    def rss(self) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None
        import psutil

        try:
            return int(psutil.Process(self.proc.pid).memory_info().rss)
        except psutil.Error:
            return None

    def stop(self) -> None:
        p = self.proc
        if p is None or p.returncode is not None:
            return
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        # anything left in its group (a plugin it was running) goes too
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class DaemonContender(Contender):
    """C and D: requests to a ``netplugin serve`` of the benchmark's own over its unix socket.

    Each sequential action is one request on a fresh connection, as a thin client (the CLI or
    the CNI shim) makes it; a burst or a drain sends every request at once, each on its own
    connection, and the daemon runs them concurrently.
    """

    def __init__(self, net: Network, key: str, plugin: str, plugin_dir: Path | None = None) -> None:
        super().__init__(net)
        self.key = key  # type: ignore[misc]  # an instance attribute shadows the ClassVar on purpose
        self.plugin = plugin
        pdir = plugin_dir if plugin_dir is not None else net.dir / "exec-empty"
        pdir.mkdir(mode=0o755, exist_ok=True)
        env = netplugin_env(net, plugin, plugin_dir=pdir)
        if self.ctx.cli[0] == sys.executable:
            env["PYTHONPATH"] = str(REPO)
        sock = str(net.dir / f"daemon-{key}.sock")
        self.daemon = Daemon(env, sock, self.ctx.cli, net.dir / f"daemon-{key}.log")

    def start(self) -> None:
        self.ctx.cleanup.push(f"daemon {self.key} on {self.net.bridge}", self.stop)
        self.daemon.start()

    def setup(self, pod: Pod) -> None:
        self.daemon.request(_request_line("setup", pod), f"{self.key} setup {pod.infra_id}")

    def teardown(self, pod: Pod) -> None:
        self.daemon.request(_request_line("teardown", pod), f"{self.key} teardown {pod.infra_id}")

    def status(self, pod: Pod) -> None:
        self.daemon.request(_request_line("status", pod), f"{self.key} status {pod.infra_id}")

    def burst(self, pods: Sequence[Pod]) -> float:
        return self.daemon.many([_request_line("setup", p) for p in pods], f"{self.key} burst setup")

    def drain(self, pods: Sequence[Pod]) -> float:
        return self.daemon.many([_request_line("teardown", p) for p in pods], f"{self.key} drain")

    def populate(self, pods: Sequence[Pod], width: int = 32) -> None:
        for i in range(0, len(pods), width):
            self.daemon.many([_request_line("setup", p) for p in pods[i : i + width]], f"{self.key} populate")

    def rss(self) -> int | None:
        return self.daemon.rss()

    def stop(self) -> None:
        self.daemon.stop()
        try:
            os.unlink(self.daemon.socket)
        except OSError:
            pass


# --- the floor (E) ---------------------------------------------------------------------------------------


class FloorContender(Contender):
    """E: the netlink requests every contender needs, sent with pyroute2 from this process.

    Per pod: one RTM_NEWLINK creating the veth with its peer already in the pod netns, the
    host end enslaved and up; hairpin through sysfs; a netlink socket opened inside the pod
    netns (the calling thread switches there for the ``socket()`` call only); lo up, the
    address, eth0 up and the default route. Teardown is one RTM_DELLINK. The address is the
    pod's index: no IPAM, no lock, no state, no exec.
    """

    key = "E"
    concurrent = False

    def __init__(self, net: Network) -> None:
        super().__init__(net)
        self._ipr: Any = None
        self._bridge_index = 0
        self._hosts: dict[str, tuple[str, int, str]] = {}
        # every host address but the gateway's, handed out lowest first and reused after teardown
        self._free = [str(a) for a in net.subnet.hosts()][:0:-1]

    def start(self) -> None:
        from pyroute2 import IPRoute

        self._ipr = IPRoute(groups=0)
        ipr = self._ipr
        ipr.link("add", ifname=self.net.bridge, kind="bridge")
        self._bridge_index = ipr.link_lookup(ifname=self.net.bridge)[0]
        ipr.addr("add", index=self._bridge_index, address=self.net.gateway, prefixlen=self.net.subnet.prefixlen)
        ipr.link("set", index=self._bridge_index, state="up")

    @contextmanager
    def _in_netns(self, path: str) -> Iterator[Any]:
        from pyroute2 import IPRoute

        sock = netns_socket(path)
        ipr = IPRoute(fileno=sock.detach(), groups=0)
        try:
            yield ipr
        finally:
            ipr.close()

    def setup(self, pod: Pod) -> None:
        host = f"{self.ctx.tag}e{self.ctx.next_id():05x}"
        addr = self._free.pop()
        fd = os.open(pod.netns, os.O_RDONLY | os.O_CLOEXEC)
        try:
            self._ipr.link(
                "add",
                ifname=host,
                kind="veth",
                mtu=1500,
                master=self._bridge_index,
                state="up",
                peer={"ifname": "eth0", "net_ns_fd": fd, "mtu": 1500},
            )
        finally:
            os.close(fd)
        with open(f"/sys/class/net/{host}/brport/hairpin_mode", "w") as f:
            f.write("1")
        with open(f"/sys/class/net/{host}/ifindex") as f:
            index = int(f.read())
        self._hosts[pod.infra_id] = (host, index, addr)
        with self._in_netns(pod.netns) as ns:
            ns.link("set", index=1, state="up")
            eth0 = ns.link_lookup(ifname="eth0")[0]
            ns.addr("add", index=eth0, address=addr, prefixlen=self.net.subnet.prefixlen)
            ns.link("set", index=eth0, state="up")
            ns.route("add", dst="default", gateway=self.net.gateway)

    def teardown(self, pod: Pod) -> None:
        _host, index, addr = self._hosts.pop(pod.infra_id)
        self._ipr.link("del", index=index)
        self._free.append(addr)

    def burst(self, pods: Sequence[Pod]) -> float:
        # One process, one thread: the floor has no concurrency to offer; this is back to back.
        t0 = time.perf_counter()
        for p in pods:
            self.setup(p)
        return time.perf_counter() - t0

    def drain_group(self, pods: Sequence[Pod]) -> float:
        """Every host veth into one link group, then one RTM_DELLINK for the group."""
        group = 0x4E500000 + (self.ctx.next_id() & 0xFFFFF)
        t0 = time.perf_counter()
        for p in pods:
            _host, index, addr = self._hosts.pop(p.infra_id)
            self._ipr.link("set", index=index, group=group)
            self._free.append(addr)
        self._ipr.link("del", group=group)
        return time.perf_counter() - t0

    def stop(self) -> None:
        if self._ipr is not None:
            self._ipr.close()
            self._ipr = None


def parallel(fn: Any, items: Sequence[Any], width: int) -> None:
    with ThreadPoolExecutor(width) as pool:
        for _ in pool.map(fn, items):
            pass


def leftovers(tag: str) -> list[str]:
    found = [f"link {n}" for n in links_with_prefix(tag)]
    found += [f"netns {n}" for n in os.listdir(NETNS_DIR) if n.startswith(tag)] if os.path.isdir(NETNS_DIR) else []
    return found
