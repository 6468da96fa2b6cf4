"""A ``netplugin serve`` and CNI shim calls under the same settings: the daemon path's world.

The daemon runs with a config file; the shim's network config points at the same file, so both
build the same settings and the shim forwards the call (``NP_TEST_ORIGIN`` says who ran a plugin).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from netplugin.frontends.wire.client import exchange
from tests.support.waits import wait_answering

REPO = Path(__file__).resolve().parents[3]

__all__ = ["World", "daemon_config"]


def daemon_config(
    path: Path, np_dirs: dict[str, str], plugin_dir: Any, plugin: str, env: dict[str, str], **settings: str
) -> Path:
    """A config file the shim, the daemon and the CLI share: ``plugin`` from ``plugin_dir``, the
    test's dirs, no cluster host, ``settings`` and the plugin's ``env``."""
    lines = [f"plugin: {plugin}", f"plugin_dir: {plugin_dir.path}", f"state_dir: {np_dirs['state_dir']}"]
    lines += [f"run_dir: {np_dirs['run_dir']}", "host: none", *(f"{k}: {v}" for k, v in settings.items())]
    lines += ["env:", *(f"  {k}: '{v}'" for k, v in env.items()), ""]
    path.write_text("\n".join(lines))
    return path


class World:
    """A daemon's config file, its process, and shim calls under the same settings."""

    def __init__(self, tmp: Path, np_dirs: dict[str, str], plugin_dir: Any) -> None:
        self.tmp = tmp
        self.run_dir = np_dirs["run_dir"]
        self.state_dir = np_dirs["state_dir"]
        self.socket = os.path.join(self.run_dir, "netplugin.sock")
        self.config = daemon_config(
            tmp / "daemon.yaml", np_dirs, plugin_dir, "fake", {"NETPLUGIN_BRIDGE_SUBNET": "10.201.5.0/24"},
            metrics_address="127.0.0.1:0",
        )  # fmt: skip
        self.netns = tmp / "netns-stand-in"
        self.netns.write_text("")
        self.base_env = {k: v for k, v in os.environ.items() if not k.startswith(("NETPLUGIN_", "CNI_"))}
        self.base_env.update(PYTHONPATH=str(REPO), NETPLUGIN_CONFIG=str(self.config))
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = tmp / "daemon.log"

    def conf(self, **changes: Any) -> dict[str, Any]:
        conf: dict[str, Any] = {
            "cniVersion": "1.1.0",
            "name": "nptest",
            "type": "netplugin-cni",
            "configFile": str(self.config),
            "runDir": self.run_dir,
            "logFile": str(self.tmp / "cni.log"),
        }
        conf.update(changes)
        return conf

    def start_daemon(self) -> None:
        env = {**self.base_env, "NP_TEST_ORIGIN": "daemon"}
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "netplugin", "serve"], env=env, stdout=out, stderr=subprocess.STDOUT
            )
        wait_answering(self.socket, self.proc, self.log)

    def health(self) -> dict[str, Any]:
        result: dict[str, Any] = exchange(self.socket, {"v": 1, "op": "health"}, timeout=10)["result"]
        return result

    def stop_daemon(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(60)

    def shim(self, command: str, conf: dict[str, Any], argv: list[str] | None = None, **env: str) -> Any:
        full = {
            **self.base_env,
            "NP_TEST_ORIGIN": "shim",
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": "c0ffee0123456789",
            "CNI_IFNAME": "eth0",
            "CNI_NETNS": str(self.netns),
            "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=web;K8S_POD_NAME=web-0",
            "CNI_PATH": "/opt/cni/bin",
            **env,
        }
        done = subprocess.run(
            argv or [sys.executable, "-m", "netplugin.frontends.cni"],
            input=json.dumps(conf).encode(),
            env=full,
            capture_output=True,
            timeout=120,
        )
        return done

    def log_entries(self) -> list[dict[str, Any]]:
        path = self.tmp / "cni.log"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
