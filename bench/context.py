"""What every figure shares: the run's context, the networks pods live on, the environments of netplugin processes.

A :class:`Network` is one bridge and subnet with its pods' network namespaces and scratch dir;
every figure makes its own and closes them in ``finally``. :func:`netplugin_env` is the one
place that says how a netplugin process (CLI, shim or daemon) of the benchmark is configured.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .util import NETNS_DIR, REPO, Cleanup, NetnsFactory, Pod, ip, links_with_prefix, wait_until

__all__ = [
    "POD_NAMESPACE",
    "Network",
    "RunContext",
    "bridge_plugin_dir",
    "clean_environ",
    "cli_command",
    "install_exec_plugin",
    "leftovers",
    "netplugin_env",
    "with_checkout",
]

POD_NAMESPACE = "bench"


def cli_command() -> tuple[list[str], str]:
    """How to start the ``netplugin`` CLI of this checkout: (argv prefix, description).

    The installed console script when it imports this checkout's package and starts (what an
    operator runs); otherwise ``python -m netplugin`` with the checkout on PYTHONPATH. Where the
    script imports from is asked of a fresh interpreter outside the checkout: an editable
    install's import hook can win over PYTHONPATH there, so this process's own view does not
    tell. A script installed before its entry point moved fails at start: it is not used.
    """
    script = Path(sys.executable).parent / "netplugin"
    if script.is_file() and os.access(script, os.X_OK):
        done = subprocess.run(
            [sys.executable, "-c", "import netplugin; print(netplugin.__file__)"],
            capture_output=True, text=True, cwd="/", timeout=60, stdin=subprocess.DEVNULL,
        )
        origin = Path(done.stdout.strip()).resolve() if done.returncode == 0 and done.stdout.strip() else None
        if origin is not None and REPO in origin.parents:
            starts = subprocess.run([str(script), "--version"], capture_output=True, cwd="/", timeout=60,
                                    stdin=subprocess.DEVNULL, env=clean_environ())
            if starts.returncode == 0:
                return [str(script)], f"console script {script}"
    return [sys.executable, "-m", "netplugin"], f"{sys.executable} -m netplugin"


def clean_environ() -> dict[str, str]:
    """The benchmark's environment minus netplugin's own settings (so none of the machine's leak in)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_") and not k.startswith("CNI_")}
    env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    return env


def with_checkout(env: dict[str, str], cli: Sequence[str]) -> dict[str, str]:
    """``env`` for a netplugin started as ``cli``: ``python -m netplugin`` needs the checkout on its path."""
    if cli[:1] == [sys.executable]:
        env["PYTHONPATH"] = str(REPO)
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
        """The bridge's ports, over netlink: /sys may show another netns's links (a figure's node netns)."""
        done = subprocess.run(["ip", "-o", "link", "show", "master", self.bridge], capture_output=True, text=True,
                              check=False)  # fmt: skip
        return [line.split(": ")[1].split("@")[0] for line in done.stdout.splitlines() if ": " in line]

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
        ip("link", "del", self.bridge, check=False)
        shutil.rmtree(self.dir, ignore_errors=True)



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
    """``net``'s exec dir holding this checkout's bash bridge plugin."""
    exe_dir = net.dir / "exec"
    if not (exe_dir / "bridge" / "bridge").exists():
        install_exec_plugin(exe_dir, "bridge", REPO / "exec_plugins" / "bridge" / "bridge")
    return exe_dir


def leftovers(tag: str) -> list[str]:
    """What of the run tagged ``tag`` is still on the machine (links, network namespaces)."""
    found = [f"link {n}" for n in links_with_prefix(tag)]
    found += [f"netns {n}" for n in os.listdir(NETNS_DIR) if n.startswith(tag)] if os.path.isdir(NETNS_DIR) else []
    return found
