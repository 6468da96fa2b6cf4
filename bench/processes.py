"""The contenders that are one process per action (A, B, X): the benchmark is the runtime calling them."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass

from .contenders import Contender, cni_dir
from .context import Network, bridge_plugin_dir, clean_environ, netplugin_env, with_checkout
from .util import BenchError, Pod

__all__ = ["Call", "CliContender", "CniContender", "CniDebianContender", "DirectBridgeContender", "ExecContender"]


@dataclass
class Call:
    """One process to start: its argv, environment and standard input."""

    argv: list[str]
    env: dict[str, str]
    stdin: bytes | None = None


def _spawn(call: Call) -> subprocess.Popen[bytes]:
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

    def call(self, action: str, pod: Pod) -> Call:
        raise NotImplementedError

    def _run(self, action: str, pod: Pod) -> None:
        _finish(_spawn(self.call(action, pod)), f"{self.key} {action} {pod.infra_id}")

    def setup(self, pod: Pod) -> None:
        self._run("setup", pod)

    def teardown(self, pod: Pod) -> None:
        self._run("teardown", pod)

    def all_at_once(self, action: str, pods: Sequence[Pod]) -> float:
        """``action`` for every pod as a runtime would: every process started back to back, then waited for.

        Returns the makespan in seconds; every process is waited for even when some fail.
        """
        calls = [self.call(action, p) for p in pods]
        t0 = time.perf_counter()
        procs = [_spawn(c) for c in calls]
        errors = []
        for p, pod in zip(procs, pods, strict=True):
            try:
                _finish(p, f"{self.key} {action} {pod.infra_id}")
            except BenchError as e:
                errors.append(str(e))
        t = time.perf_counter() - t0
        if errors:
            raise BenchError("; ".join(errors))
        return t

    def burst(self, pods: Sequence[Pod]) -> float:
        return self.all_at_once("setup", pods)

    def populate(self, pods: Sequence[Pod], width: int = 8) -> None:
        for i in range(0, len(pods), width):
            self.all_at_once("setup", pods[i : i + width])


class CniContender(ExecContender):
    """A: the CNI bridge with host-local IPAM (v1.10), exec'd like libcni (CNI_* env, config on stdin)."""

    key = "A"

    def __init__(self, net: Network) -> None:
        super().__init__(net)
        self.config = json.dumps({
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
        }).encode()
        self.base_env = clean_environ()
        self.cni_dir = cni_dir(self.key)
        self.base_env.update(CNI_IFNAME="eth0", CNI_PATH=self.cni_dir)

    def call(self, action: str, pod: Pod) -> Call:
        env = dict(self.base_env)
        env.update(
            CNI_COMMAND="ADD" if action == "setup" else "DEL",
            CNI_CONTAINERID=pod.infra_id,
            CNI_NETNS=pod.netns,
        )
        return Call([f"{self.cni_dir}/bridge"], env, self.config)


class CniDebianContender(CniContender):
    """O: as A, with Debian's containernetworking-plugins 1.1.1."""

    key = "O"



class CliContender(ExecContender):
    """B: ``netplugin setup|teardown NS POD INFRA`` with the bash bridge plugin."""

    key = "B"

    def __init__(self, net: Network, env: dict[str, str] | None = None) -> None:
        super().__init__(net)
        self.env = with_checkout(
            env if env is not None else netplugin_env(net, "bridge", plugin_dir=bridge_plugin_dir(net)), self.ctx.cli
        )

    def call(self, action: str, pod: Pod) -> Call:
        return Call([*self.ctx.cli, action, pod.namespace, pod.name, pod.infra_id], self.env)


class DirectBridgeContender(ExecContender):
    """X: the bash bridge plugin exec'd with the environment netplugin would give it, by the benchmark."""

    key = "X"

    def __init__(self, net: Network) -> None:
        super().__init__(net)
        self.exe = str(bridge_plugin_dir(net) / "bridge" / "bridge")
        self.env = netplugin_env(net, "bridge", plugin_dir=bridge_plugin_dir(net))
        self.env["NETPLUGIN_PLUGIN"] = "bridge"

    def call(self, action: str, pod: Pod) -> Call:
        env = dict(self.env)
        env.update(NETPLUGIN_ACTION=action, NETPLUGIN_POD_NAMESPACE=pod.namespace, NETPLUGIN_POD_NAME=pod.name,
                   NETPLUGIN_INFRA_ID=pod.infra_id, NETPLUGIN_NETNS=pod.netns)
        return Call([self.exe, action, pod.namespace, pod.name, pod.infra_id], env)

    def start(self) -> None:
        done = subprocess.run([self.exe, "init"], env={**self.env, "NETPLUGIN_ACTION": "init"},
                              capture_output=True, stdin=subprocess.DEVNULL, timeout=60)
        if done.returncode != 0:
            raise BenchError(f"X init failed: {done.stderr.decode(errors='replace')[-400:]}")

