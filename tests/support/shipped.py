"""What the shipped files say, read the way a node reads them: the unit, the DaemonSet and its ConfigMap.

Shared by the end-to-end suites (a node installed as shipped, a cluster installed as shipped) and the
test that the settings they produce agree. Paths are "remapped" under a temp root the way a
DaemonSet's hostPath mounts map a node's directories: ``root + path``.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "INSTALL",
    "REPO",
    "SYSTEMD_BASE_ENV",
    "configmap_settings",
    "daemonset",
    "init_install_argv",
    "main_container",
    "run_install",
    "unit_command",
]

REPO = Path(__file__).resolve().parents[2]
INSTALL = REPO / "scripts" / "install.sh"
KUBE_DIR = REPO / "etc" / "kubernetes"
#: what systemd gives a service besides its unit's Environment= (systemd.exec(5): PATH, LANG)
SYSTEMD_BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


def unit_command(unit: Path) -> tuple[list[str], dict[str, str], list[str]]:
    """(ExecStart argv, the service's environment, ExecReload argv) exactly as the unit file says."""
    env = dict(SYSTEMD_BASE_ENV)
    start: list[str] = []
    reload: list[str] = []
    for line in unit.read_text().splitlines():
        if line.startswith("Environment="):
            for item in shlex.split(line.removeprefix("Environment=")):
                key, _, value = item.partition("=")
                env[key] = value
        elif line.startswith("ExecStart="):
            start = shlex.split(line.removeprefix("ExecStart="))
        elif line.startswith("ExecReload="):
            reload = shlex.split(line.removeprefix("ExecReload="))
    assert start, f"{unit} has no ExecStart="
    return start, env, reload


def _docs() -> list[dict[str, Any]]:
    out = []
    for path in sorted(KUBE_DIR.glob("*.yaml")):
        out += [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]
    return out


def daemonset() -> dict[str, Any]:
    [ds] = [d for d in _docs() if d.get("kind") == "DaemonSet"]
    return ds


def main_container() -> dict[str, Any]:
    [c] = [c for c in daemonset()["spec"]["template"]["spec"]["containers"] if c["name"] == "netplugin"]
    return c


def configmap_settings() -> dict[str, Any]:
    """The ConfigMap's netplugin.yaml, parsed."""
    [cm] = [d for d in _docs() if d.get("kind") == "ConfigMap"]
    settings: dict[str, Any] = yaml.safe_load(cm["data"]["netplugin.yaml"])
    return settings


def init_install_argv(
    remap: Callable[[str], str], configmap_file: Path, python: str, native_shim: Path | None = None
) -> list[str]:
    """The init container's install.sh argv: this tree's script, every host path remapped, the
    ConfigMap's file (as mounted) at ``configmap_file`` and the node's interpreter ``python``.

    The image's compiled shim (``--native-shim``) is ``native_shim``, a binary built here the way the
    image's build stage builds it; None drops the option, so that install.sh compiles one itself."""
    [init] = daemonset()["spec"]["template"]["spec"]["initContainers"]
    argv = [*init.get("command", []), *init.get("args", [])]
    [at] = [i for i, a in enumerate(argv) if a.endswith("scripts/install.sh")]
    out = ["bash", str(INSTALL)]
    args = argv[at + 1 :]
    i = 0
    while i < len(args):
        flag = args[i]
        if flag == "--no-venv":
            out.append(flag)
            i += 1
            continue
        value = args[i + 1]
        if flag == "--native-shim":
            if native_shim is not None:
                out += [flag, str(native_shim)]
            i += 2
            continue
        if flag == "--shim-fallback":  # a mode, not a path
            pass
        elif flag == "--source":
            value = str(REPO)
        elif flag == "--python":
            value = python
        elif flag == "--config-from":
            value = str(configmap_file)
        else:
            value = remap(value)
        out += [flag, value]
        i += 2
    return out


def run_install(argv: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    """Run install.sh with no NETPLUGIN_* of the caller's (their flags are what counts)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_")}
    full.update(env)
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, env=full, stdin=subprocess.DEVNULL)
