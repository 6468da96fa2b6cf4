"""`netplugin demo`: the main job, on the real kernel, including its clean-up on failure and on signals."""

from __future__ import annotations

import json
import os
import re
import select
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


def _demo_leftovers(tag: str = "[0-9a-f]{6}") -> list[str]:
    """Demo-named links and netns on the machine (of the run ``tag``; the default: of any run)."""
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return re.findall(rf"npdm{tag}", links) + re.findall(rf"np-demo-{tag}-\d+", netns)


def _tag_of(output: str) -> str:
    """A run's tag, from its first progress line ("plugin bridge, bridge npdm<tag>, ...") or report.
    Other tests and engineers run demos meanwhile: only this run's names are its leftovers."""
    found = re.search(r"npdm([0-9a-f]{6})", output)
    assert found is not None, output[-2000:]
    return found.group(1)


def _demo(*args: str, prefix: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.Popen(
        [*prefix, sys.executable, "-m", "netplugin", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("extra", [[], ["--native"]], ids=["exec-bridge", "native-bridge"])
def test_demo_networks_pods_and_leaves_nothing(extra: list[str]) -> None:
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
    assert _demo_leftovers(_tag_of(report["bridge"])) == []


def test_demo_failure_cleans_up() -> None:
    # A gateway-less /31 gives the bridge plugin no address to hand out: setup fails midway.
    proc = _demo("demo", "--pods", "2", "--subnet", "10.207.255.0/31")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "Traceback" not in err
    assert "netplugin: error:" in err
    assert _demo_leftovers(_tag_of(out)) == []


def _ports_on_demo_bridge(before: list[str]) -> int:
    """The most ports on a bridge of a demo started since ``before`` (its pods' host-side veths)."""
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    bridges = set(re.findall(r"npdm[0-9a-f]{6}", links)) - set(before)
    return max((len(re.findall(rf"master {b}\b", links)) for b in bridges), default=0)


# A shell without job control starts background commands with SIGINT ignored, and Python keeps an
# inherited SIG_IGN: the demo is started as from a terminal, where Ctrl-C reaches it. env(1) resets
# it, not a preexec_fn, which would fork() the pytest process and run grpc's fork handlers.
INTERRUPTIBLE = ("env", "--default-signal=INT")


def test_demo_cleans_up_on_sigint() -> None:
    before = _demo_leftovers()
    proc = _demo("demo", "--pods", "6", prefix=INTERRUPTIBLE)
    assert proc.stdout is not None
    # Interrupt once the pods are up, as the kernel shows them: six veths on the demo's bridge.
    deadline = time.monotonic() + 120
    while _ports_on_demo_bridge(before) < 6 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the demo ended before its pods were seen up"
    # Its progress is flushed line by line to the pipe: the pods' table is there while it still runs.
    seen, fd = b"", proc.stdout.fileno()  # read unbuffered: select() sees only the pipe, not a reader's buffer
    while b"\nPOD " not in seen and select.select([fd], [], [], 30)[0]:
        chunk = os.read(fd, 65536)
        assert chunk, f"the demo closed its stdout before the pods' table: {seen!r}"
        seen += chunk
    assert b"\nPOD " in seen, f"the pods' table did not reach the pipe within 30 s: {seen!r}"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "netplugin: interrupted" in err
    assert _demo_leftovers(_tag_of(seen.decode())) == []
