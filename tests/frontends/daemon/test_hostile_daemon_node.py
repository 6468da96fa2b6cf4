"""Issue 21 against the daemon: stuck in-process plugin calls (class 6) and hostile requests (class 8).

* An in-process plugin stuck in ``open(2)`` of a FIFO (a real blocking call, no sleep): 70 setups
  (more than the 64 workers) each get PluginTimeout at the action's limit, every worker is free
  again, and ``health`` lists the stuck calls.
* op ``cni`` with an environ key that is no variable name is CNI error 4 before anything runs, and
  the DEL that follows succeeds; an invalid op of 1 MB is answered, and logged, cut to 80 characters.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from netplugin.frontends.wire.client import exchange
from tests.support.waits import wait_answering

LAUNCHER = """
import os, runpy, sys
from netplugin.plugins import register_builtin


class Hang:
    name = "example.com/hang"

    def version(self):
        return "1"

    def version_key(self):
        return None

    def init(self, ctx):
        pass

    def setup(self, pod, ctx):
        open(os.environ["HANG_FIFO"], "rb")  # nobody ever writes: blocks in the kernel

    def teardown(self, pod, ctx):
        pass

    def status(self, pod, ctx):
        return None


register_builtin("example.com/hang", lambda config: Hang())
sys.argv = ["netplugin", "serve"]
runpy.run_module("netplugin", run_name="__main__")
"""


@pytest.fixture
def hang_daemon(daemon_env: dict[str, str], tmp_path: Path) -> Iterator[str]:
    """A daemon whose plugin is the in-process ``example.com/hang``; its socket path."""
    fifo = tmp_path / "never-written"
    os.mkfifo(fifo)
    launcher = tmp_path / "launch.py"
    launcher.write_text(LAUNCHER)
    env = dict(daemon_env, NETPLUGIN_PLUGIN="example.com/hang", NETPLUGIN_TIMEOUT="1", HANG_FIFO=str(fifo))
    sock = os.path.join(env["NETPLUGIN_RUN_DIR"], "netplugin.sock")
    with open(tmp_path / "daemon.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, str(launcher)], env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT)
    try:
        wait_answering(sock, proc, tmp_path / "daemon.log")
        yield sock
    finally:
        proc.kill()
        proc.wait()


def test_stuck_in_process_calls_free_their_workers_and_show_in_health(hang_daemon: str) -> None:
    def setup(i: int) -> dict[str, Any]:
        body = {"v": 1, "op": "setup", "namespace": "default", "pod": f"web-{i}", "infra_id": f"infra{i}"}
        return exchange(hang_daemon, body, timeout=60)

    with ThreadPoolExecutor(70) as pool:
        answers = list(pool.map(setup, range(70)))
    assert {a["error"]["error"] for a in answers} == {"PluginTimeout"}, answers[0]
    health = exchange(hang_daemon, {"v": 1, "op": "health"}, timeout=10)["result"]
    assert health["in_flight"] == 0
    stuck = health["stuck"]
    assert len(stuck) == 70 and all(s["limit"] == 1.0 and s["running_seconds"] >= 1.0 for s in stuck), stuck[:2]
    assert all(s["what"].startswith("example.com/hang setup of pod default/web-") for s in stuck), stuck[:2]


def test_the_cni_op_refuses_environ_keys_that_are_no_variable_names(start_daemon: Any, daemon_env: dict[str, str],
                                                                    plugin_dir: Any, np_dirs: dict[str, str]) -> None:
    fake = plugin_dir.install("fake")
    d = start_daemon(env={"NETPLUGIN_PLUGIN": "fake"})
    environ = {k: v for k, v in daemon_env.items() if k.startswith("NETPLUGIN_")}
    environ.update(NETPLUGIN_PLUGIN="fake", CNI_CONTAINERID="c0ffee42", CNI_IFNAME="eth0",
                   CNI_NETNS=str(plugin_dir.path), CNI_ARGS="K8S_POD_NAMESPACE=web;K8S_POD_NAME=web-0")
    stdin = json.dumps({"cniVersion": "1.0.0", "name": "nptest"})
    for bad in ("CNI_X=Y", "", "1ABC", "A B", "NETPLUGIN_\u00e9"):
        body = {"v": 1, "op": "cni", "environ": {**environ, "CNI_COMMAND": "ADD", bad: "1"}, "stdin": stdin}
        answer = exchange(d.socket, body, timeout=60)
        assert answer["ok"] and answer["result"]["code"] == 1, answer
        assert answer["result"]["doc"]["code"] == 4 and "is not a variable name" in answer["result"]["doc"]["msg"]
    assert [c for c in fake.calls() if c != "init"] == []
    assert not list(Path(np_dirs["state_dir"]).glob("pods/*.json"))
    body = {"v": 1, "op": "cni", "environ": {**environ, "CNI_COMMAND": "DEL"}, "stdin": stdin}
    assert exchange(d.socket, body, timeout=60)["result"]["code"] == 0


def test_an_invalid_op_is_answered_and_logged_cut_to_80_characters(start_daemon: Any) -> None:
    d = start_daemon()
    before = len(d.output())
    answer = exchange(d.socket, {"v": 1, "op": "x" * 1_000_000}, timeout=60)
    assert not answer["ok"] and answer["error"]["error"] == "InvalidArgument"
    assert len(json.dumps(answer)) < 1000, len(json.dumps(answer))
    assert len(answer["error"]["value"]) <= 80
    assert len(d.output()) - before < 2000
    assert exchange(d.socket, {"v": 1, "op": "health"}, timeout=10)["ok"]
