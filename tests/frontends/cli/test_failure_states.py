"""What the failure states say, through the real CLI: a setup whose rollback failed too, the pods
listing, gc waiting for a pod in progress, and ``gc --forget`` of a record that cannot be torn down."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.waits import WITHIN, wait_for

POD = ("default", "web-0", "infra0")


def test_a_setup_whose_rollback_failed_says_so_and_can_be_forgotten(
    plugin_dir: Any, run_cli: Any, np_dirs: dict[str, str]
) -> None:
    p = plugin_dir.install("p")
    p.set("setup", exit=3, stderr="no such bridge\n")
    p.set("teardown", exit=4, stderr="cannot either\n")
    r = run_cli("--plugin", "p", "setup", *POD)
    assert r.returncode == 1
    assert "and its rollback failed too" in r.stderr and "cannot either" in r.stderr, r.stderr
    assert "netplugin gc retries it" in r.stderr

    pods = run_cli("--plugin", "p", "pods")
    assert "rollback-failed" in pods.stdout and "setup-interrupted" not in pods.stdout, pods.stdout
    [row] = json.loads(run_cli("--plugin", "p", "-o", "json", "pods").stdout)["pods"]
    assert row["condition"] == "rollback-failed" and "cannot either" in row["rollback_error"]

    gc = run_cli("--plugin", "p", "gc")  # the teardown still fails: the record stays
    assert gc.returncode == 1 and "its setup failed and so did its rollback" in gc.stdout, gc
    assert len(list((Path(np_dirs["state_dir"]) / "pods").glob("*.json"))) == 1

    forget = run_cli("--plugin", "p", "gc", "--forget", "default/web-0")
    assert forget.returncode == 0, forget.stderr
    assert "forgot default/web-0 (infra0), state tearing-down; it may have left:" in forget.stdout  # gc tried
    assert "what p " in forget.stdout and "never torn down" in forget.stdout, forget.stdout
    assert list((Path(np_dirs["state_dir"]) / "pods").glob("*.json")) == []
    again = run_cli("--plugin", "p", "gc", "--forget", "default/web-0")
    assert again.returncode == 2 and "no record of it" in again.stderr, again.stderr
    bad = run_cli("--plugin", "p", "gc", "--forget", "web-0")
    assert bad.returncode == 2 and "NAMESPACE/NAME" in bad.stderr


def test_gc_says_which_pod_it_waits_for(plugin_dir: Any, cli_env: dict[str, str], run_cli: Any) -> None:
    p = plugin_dir.install("p")
    p.set("setup", sleep=3)
    env = {**cli_env, "NETPLUGIN_PLUGIN": "p"}
    slow = subprocess.Popen(
        [sys.executable, "-m", "netplugin", "setup", *POD], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        wait_for(lambda: "setup" in " ".join(p.calls()) or slow.poll() is not None, "the slow setup to start", WITHIN)
        assert slow.poll() is None, slow.communicate()
        gc = run_cli("gc", env={"NETPLUGIN_PLUGIN": "p"})
        assert gc.returncode == 0, gc
        assert "gc: waiting for default/web-0 (infra infra0): an action on it is in progress" in gc.stderr, gc.stderr
    finally:
        slow.communicate(timeout=60)
    assert slow.returncode == 0  # the pod in setup was not collected
    assert "ready" in run_cli("pods", env={"NETPLUGIN_PLUGIN": "p"}).stdout
