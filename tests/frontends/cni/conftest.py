"""CNI shim fixtures: run ``python -m netplugin.frontends.cni`` as the runtime would, against test exec plugins.

The shim runs as a real process with a CNI environment and the network config on stdin; its
exec plugin is the shared scriptable test plugin (``tests/testplugins/scriptable``: records argv, env
and stdin of every call, and is steered by control files). Nothing here needs root: for ADD and
CHECK ``CNI_NETNS`` only has to exist, so a plain file stands in for the namespace.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest

from netplugin.frontends.cni.native import build_native
from tests.frontends.cni.daemonworld import REPO, World


@dataclass
class CniCall:
    """What one shim run returned."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def doc(self) -> Any:
        """stdout as JSON (None when empty)."""
        return json.loads(self.stdout) if self.stdout.strip() else None

    def error(self) -> dict[str, Any]:
        """The CNI error document, asserting the shape the spec requires."""
        assert self.returncode != 0, self
        doc = self.doc
        assert isinstance(doc, dict), self
        assert isinstance(doc.get("code"), int) and isinstance(doc.get("msg"), str), doc
        assert "cniVersion" in doc, doc
        assert "Traceback" not in self.stderr, self.stderr
        return doc


class Shim:
    """Runs the CNI shim. ``conf`` is the network config every call starts from."""

    def __init__(self, tmp_path: Path, np_dirs: dict[str, str], plugin_dir: Any) -> None:
        self.tmp = tmp_path
        self.netns = tmp_path / "netns-stand-in"
        self.netns.write_text("")
        self.plugin_dir = plugin_dir
        self.conf: dict[str, Any] = {
            "cniVersion": "1.0.0",
            "name": "nptest",
            "type": "netplugin-cni",
            "plugin": "fake",
            "pluginDir": str(plugin_dir.path),
            "stateDir": np_dirs["state_dir"],
            "runDir": np_dirs["run_dir"],
            "env": {"NETPLUGIN_BRIDGE_SUBNET": "10.201.5.0/24"},
        }
        # No NETPLUGIN_* from the developer's shell, and no /etc/netplugin/netplugin.yaml.
        self.base_env = {k: v for k, v in os.environ.items() if not k.startswith(("NETPLUGIN_", "CNI_"))}
        self.base_env["NETPLUGIN_CONFIG"] = np_dirs["config"]
        self.base_env["PYTHONPATH"] = str(REPO)

    def run(
        self,
        command: str | None,
        *,
        conf: dict[str, Any] | None = None,
        stdin: str | bytes | None = None,
        container_id: str | None = "c0ffee0123456789abcdef",
        ifname: str | None = "eth0",
        netns: str | None = None,
        args: str | None = "IgnoreUnknown=1;K8S_POD_NAMESPACE=web;K8S_POD_NAME=web-0",
        extra_env: dict[str, str] | None = None,
        timeout: float = 60,
    ) -> CniCall:
        env = dict(self.base_env)
        values = {
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": container_id,
            "CNI_IFNAME": ifname,
            "CNI_NETNS": str(self.netns) if netns is None else netns,
            "CNI_ARGS": args,
            "CNI_PATH": "/opt/cni/bin",
        }
        env.update({k: v for k, v in values.items() if v is not None})
        env.update(extra_env or {})
        if stdin is None:
            conf = self.conf if conf is None else conf
            if command in ("STATUS", "GC") and conf.get("cniVersion") == self.conf["cniVersion"]:
                # libcni sends these only to configs of 1.1.0 or later (a test of that rule passes stdin)
                conf = {**conf, "cniVersion": "1.1.0"}
            stdin = json.dumps(conf)
        data = stdin.encode() if isinstance(stdin, str) else stdin
        done = subprocess.run(
            [sys.executable, "-m", "netplugin.frontends.cni"],
            input=data,
            env=env,
            capture_output=True,
            timeout=timeout,
        )
        return CniCall(done.returncode, done.stdout.decode(), done.stderr.decode())

    def with_conf(self, **changes: Any) -> dict[str, Any]:
        conf: dict[str, Any] = json.loads(json.dumps(self.conf))
        for key, value in changes.items():
            if value is None:
                conf.pop(key, None)
            else:
                conf[key] = value
        return conf


class ShimNet(Protocol):
    """A runtime suite's network: where its exec plugin, state, socket and log are, its bridge and subnet."""

    exec_dir: Path
    state: Path
    run_dir: Path
    log: Path
    bridge: str
    subnet: ipaddress.IPv4Network | ipaddress.IPv6Network


def bridge_shim_conf(net: ShimNet, plugin: str = "bridge") -> dict[str, Any]:
    """The ``netplugin-cni`` entry of ``net``'s conflist: the exec ``plugin`` (the bash bridge by
    default), no cluster host, and nothing of the host's changed: ip_forward and br_netfilter are
    the host's, and pods on one bridge need neither."""
    return {
        "type": "netplugin-cni",
        "plugin": plugin,
        "pluginDir": str(net.exec_dir),
        "stateDir": str(net.state),
        "runDir": str(net.run_dir),
        "logFile": str(net.log),
        "netplugin": {"host": "none"},
        "env": {
            "NETPLUGIN_BRIDGE_NAME": net.bridge,
            "NETPLUGIN_BRIDGE_SUBNET": str(net.subnet),
            "NETPLUGIN_BRIDGE_IP_FORWARD": "false",
            "NETPLUGIN_BRIDGE_BR_NETFILTER": "false",
        },
    }


@pytest.fixture
def world(tmp_path: Path, np_dirs: dict[str, str], plugin_dir: Any) -> Iterator[World]:
    """A daemon's world (test_cni_hostile_node and test_cni_writes_and_inputs use hostworld's instead)."""
    w = World(tmp_path, np_dirs, plugin_dir)
    try:
        yield w
    finally:
        w.stop_daemon()


@pytest.fixture
def shim(tmp_path: Path, np_dirs: dict[str, str], plugin_dir: Any) -> Shim:
    return Shim(tmp_path, np_dirs, plugin_dir)


@pytest.fixture
def fake(plugin_dir: Any) -> Any:
    """The scriptable plugin installed as ``fake``; its status reports 10.201.5.7."""
    p = plugin_dir.install("fake")
    p.set("status", stdout='{"apiVersion":"v1beta1","kind":"PodNetworkStatus","ip":"10.201.5.7"}')
    return p


@pytest.fixture(scope="module")
def shims(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """{"python": the entry script, "native": compiled with it as fallback, "cluster": no fallback}."""
    bin_dir = tmp_path_factory.mktemp("cni-bin")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-m", "netplugin", "install-shim", str(bin_dir / "netplugin-cni-python")],
                   env=env, check=True, capture_output=True)  # fmt: skip
    python = bin_dir / "netplugin-cni-python"
    return {
        "python": python,
        "native": Path(build_native(str(bin_dir / "netplugin-cni"), fallback=str(python))),
        "cluster": Path(build_native(str(bin_dir / "netplugin-cni-cluster"), fallback="")),
    }
