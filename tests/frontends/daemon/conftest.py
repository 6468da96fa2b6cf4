"""Fixtures for the daemon tests: a real ``netplugin serve`` process per test, and CLI drivers.

The daemon is ready when it tells systemd so: the fixture listens on its own NOTIFY_SOCKET, which
also proves the sd_notify support. Processes the plugin gets carry ``NP_TEST_ORIGIN``: ``daemon``
when the daemon ran them, ``cli`` when a CLI process did, so a test can tell who did the work.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from netplugin.frontends.wire.client import request
from tests.support.waits import WITHIN, wait_for

REPO = Path(__file__).resolve().parents[3]

GATE = Path(__file__).resolve().parents[2] / "testplugins" / "gate"


class Daemon:
    """A running ``python -m netplugin serve``."""

    def __init__(self, proc: subprocess.Popen[bytes], socket_path: str, log: Path, notify: socket.socket) -> None:
        self.proc = proc
        self.socket = socket_path
        self.log = log
        self.notify = notify
        self.notes: list[str] = []

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_note(self, prefix: str, within: float = WITHIN) -> str:
        """Wait for an sd_notify message starting with ``prefix`` (READY=1, STOPPING=1)."""

        def note() -> str | None:
            found = next((n for n in self.notes if n.startswith(prefix)), None)
            if found is None and self.proc.poll() is not None and not select.select([self.notify], [], [], 0)[0]:
                raise AssertionError(f"daemon exited ({self.proc.returncode}) before {prefix}:\n{self.output()}")
            if found is None and select.select([self.notify], [], [], 0.2)[0]:
                self.notes.append(self.notify.recv(4096).decode())
            return found

        return wait_for(note, f"{prefix} from the daemon", within, detail=self.output, interval=0)

    def output(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def call(self, op: str, **args: Any) -> Any:
        return request(self.socket, op, timeout=60, **args)

    def health(self) -> dict[str, Any]:
        result: dict[str, Any] = self.call("health")
        return result

    def metrics(self) -> str:
        address = self.health()["metrics_address"]
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as resp:
            body: bytes = resp.read()
        return body.decode()

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def stop(self, within: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(within)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def daemon_env(cli_env: dict[str, str]) -> dict[str, str]:
    """The daemon's environment: the CLI's test dirs, and the origin marker ``daemon``."""
    env = dict(cli_env)
    env.pop("NETPLUGIN_USE_DAEMON", None)
    env["NP_TEST_ORIGIN"] = "daemon"
    return env


@pytest.fixture
def start_daemon(daemon_env: dict[str, str], tmp_path: Path) -> Iterator[Any]:
    """start_daemon(*args, env={...}, ready=True) -> Daemon; every daemon is stopped at the end."""
    started: list[Daemon] = []

    def start(*args: str, env: dict[str, str] | None = None, ready: bool = True) -> Daemon:
        n = len(started)
        notify_path = str(tmp_path / f"notify{n}")
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(notify_path)
        full = dict(daemon_env)
        full.update(env or {})
        full["NOTIFY_SOCKET"] = notify_path
        log = tmp_path / f"daemon{n}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "netplugin", "-v", "serve", "--metrics-address", "127.0.0.1:0", *args],
                env=full,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        sock = os.path.join(full["NETPLUGIN_RUN_DIR"], "netplugin.sock")
        d = Daemon(proc, full.get("NETPLUGIN_SOCKET", sock), log, notify)
        started.append(d)
        if ready:
            d.wait_note("READY=1")
        return d

    yield start
    for d in started:
        try:
            d.stop(within=30)
        except subprocess.TimeoutExpired:
            d.kill()
        d.notify.close()


@pytest.fixture
def cli(run_cli: Any) -> Any:
    """cli(*args, mode="auto", env=...) runs the real CLI with ``use_daemon`` = mode, origin ``cli``."""

    def run(
        *args: str, mode: str = "auto", env: dict[str, str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        full = {"NETPLUGIN_USE_DAEMON": mode, "NP_TEST_ORIGIN": "cli", **(env or {})}
        result: subprocess.CompletedProcess[str] = run_cli(*args, env=full, timeout=timeout)
        return result

    return run


@pytest.fixture
def cli_popen(cli_env: dict[str, str]) -> Iterator[Any]:
    """cli_popen(*args, mode="auto") starts the CLI in the background; all are reaped at the end."""
    procs: list[subprocess.Popen[str]] = []

    def start(*args: str, mode: str = "auto") -> subprocess.Popen[str]:
        env = {**cli_env, "NETPLUGIN_USE_DAEMON": mode, "NP_TEST_ORIGIN": "cli"}
        p = subprocess.Popen(
            [sys.executable, "-m", "netplugin", *args],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.communicate()


# --- a node of its own: `netplugin serve` in a network namespace, its cluster from Node files -----


def node_file(d: Path, name: str, cidr: str, addr: str) -> None:
    """Node ``name`` (pod CIDR ``cidr``, InternalIP ``addr``) as a file of the static host's ``nodes_dir``."""
    doc = {
        "kind": "Node",
        "metadata": {"name": name},
        "spec": {"podCIDRs": [cidr]},
        "status": {"addresses": [{"type": "InternalIP", "address": addr}]},
    }
    (d / f"{name}.json").write_text(json.dumps(doc))


class StaticNode:
    """``netplugin serve`` run inside ``netns`` as node ``me`` of the Node files in :attr:`nodes`
    (``host: static``, cluster CIDR 10.206.128.0/17); :meth:`start` after writing them."""

    def __init__(self, netns: str, root: Path, metrics_address: str) -> None:
        self.netns = netns
        self.nodes = root / "nodes"
        self.nodes.mkdir()
        self.log = root / "daemon.log"
        self.socket = str(root / "run" / "netplugin.sock")
        config = root / "netplugin.yaml"
        config.write_text(
            f"state_dir: {root}/state\nrun_dir: {root}/run\nplugin_dir: {root}\nhost: static\n"
            f"pods_dir: {root}/pods\nnodes_dir: {self.nodes}\nnode_name: me\nmetrics_address: {metrics_address}\n"
            "cluster_cidrs: [10.206.128.0/17]\n"
        )
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_")}
        self.env.update(NETPLUGIN_CONFIG=str(config), PYTHONPATH=str(REPO))
        #: the CLI run in the node's netns, with its settings
        self.cli = ["ip", "netns", "exec", netns, sys.executable, "-m", "netplugin"]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [*self.cli, "serve"], env=self.env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
            )

    def output(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def stop(self) -> int | None:
        """SIGTERM and its exit status (None: it never ran, or it was stopped already)."""
        if self.proc is None or self.proc.poll() is not None:
            return None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)


@pytest.fixture
def static_node(tmp_path: Path) -> Iterator[Callable[..., StaticNode]]:
    """static_node(netns, metrics_address="none"): a :class:`StaticNode`, stopped at the end if still running."""
    made: list[StaticNode] = []

    def make(netns: str, metrics_address: str = "none") -> StaticNode:
        root = tmp_path / f"node{len(made)}"
        root.mkdir()
        node = StaticNode(netns, root, metrics_address)
        made.append(node)
        return node

    yield make
    for node in made:
        try:
            node.stop()
        except subprocess.TimeoutExpired:
            assert node.proc is not None
            node.proc.kill()
