"""`netplugin demo`: the main job, on the real kernel, including its clean-up on failure and on signals."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: creates network namespaces and a bridge"),
]


def _demo_leftovers() -> list[str]:
    """Demo-named links and netns currently on the machine (they carry a run-unique tag)."""
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return re.findall(r"npdm[0-9a-f]{6}", links) + re.findall(r"np-demo-[0-9a-f]{6}-\d+", netns)


def _demo(*args: str, **kw: object) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.Popen(
        [sys.executable, "-m", "netplugin", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,  # type: ignore[call-overload]
    )


@pytest.mark.parametrize("extra", [[], ["--native"]], ids=["exec-bridge", "native-bridge"])
def test_demo_networks_pods_and_leaves_nothing(extra: list[str]) -> None:
    before = _demo_leftovers()
    proc = _demo("-o", "json", "demo", "--pods", "3", *extra)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    report = json.loads(out)
    assert report["ok"] is True
    ips = [p["ip"] for p in report["pods"]]
    assert len(ips) == 3 and len(set(ips)) == 3
    assert all(ip.startswith("10.207.") for ip in ips)
    # 3*2 pod-to-pod checks and 3 host-to-pod checks, all passing
    assert len(report["checks"]) == 9 and all(c["ok"] for c in report["checks"])
    assert report["leftovers"] == []
    assert _demo_leftovers() == before


def test_demo_failure_cleans_up() -> None:
    before = _demo_leftovers()
    # A gateway-less /31 gives the bridge plugin no address to hand out: setup fails midway.
    proc = _demo("demo", "--pods", "2", "--subnet", "10.207.255.0/31")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "Traceback" not in err
    assert "netplugin: error:" in err
    assert _demo_leftovers() == before


def test_demo_cleans_up_on_sigint() -> None:
    before = _demo_leftovers()
    proc = _demo("demo", "--pods", "6")
    assert proc.stdout is not None
    # Interrupt once the pods are up (the table header is printed after the last setup).
    deadline = time.monotonic() + 120
    for line in proc.stdout:
        if line.startswith("POD") or time.monotonic() > deadline:
            break
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert _demo_leftovers() == before
