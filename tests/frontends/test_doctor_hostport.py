"""``netplugin doctor``'s ``hostport`` check: with a hostport member in the chain it says whether
stale UDP flows can be flushed (``conntrack`` on the plugins' PATH) and whether 127.0.0.1 hostPorts
are on; a bad setting is a problem naming it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
_TOOLS = os.path.dirname(shutil.which("conntrack") or "/usr/sbin/conntrack")


def hostport_check(tmp: Path, chain: str, env: dict[str, str], conflist: bool = False) -> dict[str, Any]:
    config = tmp / "netplugin.yaml"
    if conflist:  # the shipped conflist's shape: the runtime passes the pods' port mappings
        member = {"type": "netplugin-cni", "configFile": str(config), "capabilities": {"portMappings": True}}
        doc = {"cniVersion": "1.0.0", "name": "netplugin", "plugins": [member]}
        (tmp / "10-netplugin.conflist").write_text(json.dumps(doc))
    config.write_text(
        f"plugins: [{chain}]\nstate_dir: {tmp / 'state'}\nrun_dir: {tmp / 'run'}\nhost: none\n"
        + ("env:\n" if env else "")
        + "".join(f"  {k}: {json.dumps(v)}\n" for k, v in env.items())
    )
    argv = [sys.executable, "-m", "netplugin", "--config", str(config), "-o", "json", "doctor",
            "--cni-conf-dir", str(tmp), "--cni-bin-dir", str(tmp)]  # fmt: skip
    base = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_")}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env={**base, "PYTHONPATH": str(REPO)})
    assert "Traceback" not in done.stderr, done.stderr
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    return dict(checks["hostport"])


#: (chain, the plugins' env, ok, words in the summary or the problem)
CASES = [
    ("netplugin.io/bridge", {}, True, "no hostport member"),
    ("netplugin.io/bridge, netplugin.io/hostport", {"PATH": _TOOLS}, True, "127.0.0.1 hostPorts on (route_localnet"),
    ("bridge, hostport", {"PATH": _TOOLS, "NETPLUGIN_HOSTPORT_LOCALHOST": "true"}, True, "hostPorts on"),
    ("bridge, hostport", {"PATH": _TOOLS, "NETPLUGIN_HOSTPORT_LOCALHOST": "false"}, True,
     "127.0.0.1 hostPorts off (NETPLUGIN_HOSTPORT_LOCALHOST=false)"),
    ("netplugin.io/bridge, netplugin.io/hostport", {"PATH": "/nonexistent"}, False, "no conntrack command"),
    ("netplugin.io/bridge, netplugin.io/hostport", {"NETPLUGIN_HOSTPORT_LOCALHOST": "sure"}, False,
     "invalid NETPLUGIN_HOSTPORT_LOCALHOST 'sure'"),
]  # fmt: skip


@pytest.mark.parametrize(("chain", "env", "ok", "words"), CASES)
def test_doctor_reports_the_hostport_members_needs(
    tmp_path: Path, chain: str, env: dict[str, str], ok: bool, words: str
) -> None:
    if not shutil.which("conntrack"):
        pytest.fail("conntrack is not installed (scripts/install-deps.sh installs it)", pytrace=False)
    check = hostport_check(tmp_path, chain, env)
    assert check["ok"] is ok, check
    assert words in (check["found"] if ok else check["problem"]), check
    if not ok:
        assert check["fix"] or "invalid" in check["problem"], check


@pytest.mark.parametrize(
    ("chain", "ok", "fix"),
    [
        ("netplugin.io/bridge", False, "plugins: [netplugin.io/bridge, netplugin.io/hostport]"),
        ("bridge", False, "plugins: [bridge, hostport]"),
        ("netplugin.io/bridge, netplugin.io/hostport", True, None),
        ("bridge, hostport", True, None),
    ],
)
def test_a_conflist_declaring_port_mappings_without_a_hostport_member_is_a_problem(
    tmp_path: Path, chain: str, ok: bool, fix: str | None
) -> None:
    check = hostport_check(tmp_path, chain, {"PATH": _TOOLS}, conflist=True)
    assert check["ok"] is ok, check
    if not ok:
        assert "declares portMappings, but no member of the chain maps them" in check["problem"], check
        assert fix is not None and fix in check["fix"], check
