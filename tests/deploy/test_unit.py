"""etc/systemd/netplugin.service: the directives the daemon relies on, and systemd's own verifier.

The installed unit (ExecStart= at a real venv) is verified in test_stock_install.py; here the shipped
file is checked with its ExecStart= pointed at an executable that exists on this machine.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "etc" / "systemd" / "netplugin.service"
INSTALL = REPO / "scripts" / "install.sh"


def _directives() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def test_unit_directives() -> None:
    d = _directives()
    assert d["Type"] == ["notify"]
    assert d["NotifyAccess"] == ["main"]
    # ExecStart= runs the venv that scripts/install.sh makes by default.
    prefix = re.search(r"^prefix=\$\{NETPLUGIN_PREFIX:-(.*)\}$", INSTALL.read_text(), re.M)
    assert prefix is not None
    # ... with the node's one config file, the file the CNI conflist names; no setting in the unit.
    conflist = json.loads((REPO / "etc" / "cni" / "10-netplugin.conflist").read_text())
    assert d["ExecStart"] == [f"{prefix.group(1)}/bin/netplugin serve --config {conflist['plugins'][0]['configFile']}"]
    assert "EnvironmentFile" not in d and "Environment" not in d
    assert d["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert "network-pre.target" in " ".join(d["After"])
    assert "Wants" not in d  # a plain service orders itself after network-pre.target, never pulls it in
    assert d["WatchdogSec"] and d["ProtectHostname"] == ["yes"]
    [syscalls] = d["SystemCallFilter"]
    assert syscalls.startswith("~")  # a deny list
    denied = set(syscalls[1:].split())
    assert {"@module", "@reboot", "@swap", "@clock", "@debug"} <= denied
    assert not denied & {"@mount", "@network-io", "setns", "@privileged"}  # ip netns needs these
    # Nothing that would give the service a mount namespace of its own (netns mounts must be shared).
    for key in ("ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateMounts", "ReadWritePaths"):
        assert key not in d, key


def test_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    unit = tmp_path / "netplugin.service"
    unit.write_text(re.sub(r"^ExecStart=\S+", f"ExecStart={sys.executable}", UNIT.read_text(), flags=re.M))
    out = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert not [line for line in out.stderr.splitlines() if "netplugin.service" in line], out.stderr
