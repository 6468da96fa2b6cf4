"""The daemon runs gc itself: at start (before it is ready) and every ``gc_interval`` seconds.

Pods are set up by the real CLI working alone (as after a reboot, before the daemon runs); their
"network namespaces" are plain files under a tmp dir, so a pod lost in a reboot is one whose file
is gone. A live pod (its file there) is never touched.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from netplugin.frontends.wire.client import exchange
from tests.support.nettest import live_netns_file
from tests.support.waits import WITHIN, wait_for


def _sample(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            got = dict(re.findall(r'(\w+)="([^"]*)"', line.split(" ")[0]))
            if all(got.get(k) == v for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def _pods(state_dir: str) -> set[str]:
    return {p.name for p in (Path(state_dir) / "pods").glob("*.json")}


def test_gc_at_start_and_periodically_frees_lost_pods_only(
    start_daemon: Any, cli: Any, plugin_dir: Any, np_dirs: dict[str, str], tmp_path: Path
) -> None:
    p = plugin_dir.install("scripted")
    netns = tmp_path / "netns"
    netns.mkdir()
    env = {"NETPLUGIN_PLUGIN": "scripted", "NETPLUGIN_NETNS_TEMPLATE": str(netns / "{infra_id}")}
    for pod in ("lost", "live", "later"):
        live_netns_file(netns / f"i-{pod}")
        assert cli("setup", "default", pod, f"i-{pod}", mode="never", env=env).returncode == 0
    assert len(_pods(np_dirs["state_dir"])) == 3
    (netns / "i-lost").unlink()  # a reboot took its namespace

    d = start_daemon(env={**env, "NETPLUGIN_GC_INTERVAL": "1"})  # ready: gc at start has run
    left = _pods(np_dirs["state_dir"])
    assert len(left) == 2 and not any("lost" in n for n in left), left
    assert "gc (start): freed 1" in d.output() and "tore down default/lost" in d.output(), d.output()
    assert p.env_of("teardown")["NP_TEST_ORIGIN"] == "daemon"
    text = d.metrics()
    assert _sample(text, "netplugin_gc_runs_total", trigger="start", outcome="ok") == 1
    assert _sample(text, "netplugin_gc_freed_total", kind="teardown") == 1

    (netns / "i-later").unlink()
    wait_for(lambda: len(_pods(np_dirs["state_dir"])) == 1, "the periodic gc to free the second lost pod", WITHIN)
    assert any("live" in n for n in _pods(np_dirs["state_dir"]))  # the live pod, never touched
    wait_for(lambda: _sample(d.metrics(), "netplugin_gc_freed_total", kind="teardown") == 2, "the count", WITHIN)
    assert _sample(d.metrics(), "netplugin_gc_runs_total", trigger="periodic", outcome="ok") >= 1
    assert d.health()["gc"]["trigger"] == "periodic"


def test_gc_interval_zero_runs_only_at_start(
    start_daemon: Any, cli: Any, plugin_dir: Any, np_dirs: dict[str, str], tmp_path: Path
) -> None:
    plugin_dir.install("scripted")
    netns = tmp_path / "netns"
    netns.mkdir()
    env = {"NETPLUGIN_PLUGIN": "scripted", "NETPLUGIN_NETNS_TEMPLATE": str(netns / "{infra_id}")}
    live_netns_file(netns / "i-a")
    assert cli("setup", "default", "a", "i-a", mode="never", env=env).returncode == 0
    d = start_daemon(env={**env, "NETPLUGIN_GC_INTERVAL": "0"})
    assert "gc (start): nothing to free (1 record(s) checked)" in d.output(), d.output()
    (netns / "i-a").unlink()
    wait_for(lambda: d.health()["uptime_seconds"] > 2.5, "a few seconds of the daemon", WITHIN)
    assert len(_pods(np_dirs["state_dir"])) == 1  # nobody ran gc
    assert _sample(d.metrics(), "netplugin_gc_runs_total", trigger="periodic", outcome="ok") == 0


def test_a_deleted_pod_whose_teardown_never_came_is_collected(
    start_daemon: Any, cli: Any, plugin_dir: Any, np_dirs: dict[str, str], tmp_path: Path
) -> None:
    """host: kube: the daemon watches this node's Pods; a deleted one whose record is still there
    after the teardown's time limit (and the kill grace) is torn down by a gc run of its own."""
    import json

    from netplugin.frontends.lab.simcluster.apiobjects import make_node, make_pod
    from netplugin.frontends.lab.simcluster.apiserver import ApiServer

    plugin_dir.install("scripted")
    api = ApiServer(bookmark_interval=1.0)
    try:
        api.apply(make_node("me", ["10.206.140.0/24"], ["10.206.0.40"]))
        for pod in ("doomed", "kept"):
            api.apply(make_pod("default", pod, "me"))
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "sim", "cluster": {"server": api.url}}],
                    "users": [{"name": "sim", "user": {}}],
                    "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "sim"}}],
                    "current-context": "sim",
                }
            )
        )
        config = tmp_path / "node.yaml"
        netns = tmp_path / "netns"
        netns.mkdir()
        config.write_text(
            f"plugin: scripted\nhost: kube\nkubeconfig: {kubeconfig}\nnode_name: me\nnode_routes: false\n"
            f"netns_template: {netns}/{{infra_id}}\ngc_interval: 0\nkill_grace: 0\n"
            "timeouts:\n  teardown: 1\n"
        )
        no_proxy = dict.fromkeys(("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"), "")
        env = {"NETPLUGIN_CONFIG": str(config), **no_proxy}
        for pod in ("doomed", "kept"):
            live_netns_file(netns / f"i-{pod}")
            done = cli("setup", "default", pod, f"i-{pod}", mode="never", env=env)
            assert done.returncode == 0, done.stderr
        d = start_daemon(env=env)
        assert len(_pods(np_dirs["state_dir"])) == 2
        api.delete("Pod", "doomed", "default")  # the runtime's teardown never comes
        wait_for(lambda: len(_pods(np_dirs["state_dir"])) == 1, "the deleted pod's record to be collected", WITHIN)
        assert any("kept" in n for n in _pods(np_dirs["state_dir"]))
        wait_for(lambda: "gc (pod-deleted): freed 1" in d.output(), "the run's log line", WITHIN)
        assert "the host says the pod no longer exists" in d.output(), d.output()
    finally:
        api.close()


def test_gc_through_the_daemon_streams_each_pod_it_waits_for(
    start_daemon: Any, cli: Any, plugin_dir: Any, cli_env: dict[str, str]
) -> None:
    """The progress line reaches the CLI while the daemon's gc still waits (streamed, not in the answer)."""
    p = plugin_dir.install("scripted")
    p.set("setup", sleep=4)
    env = {"NETPLUGIN_PLUGIN": "scripted"}
    start_daemon(env=env)
    full = {**cli_env, **env, "NETPLUGIN_USE_DAEMON": "always", "NP_TEST_ORIGIN": "cli"}

    def popen(*args: str) -> subprocess.Popen[str]:
        argv = [sys.executable, "-m", "netplugin", *args]
        return subprocess.Popen(argv, env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    slow = popen("setup", "default", "web-0", "infra0")
    try:
        wait_for(lambda: "setup" in " ".join(p.calls()), "the slow setup to start", WITHIN)
        gc = popen("gc")
        assert gc.stderr is not None
        first = gc.stderr.readline()
        still_waiting = gc.poll() is None and slow.poll() is None
        out, err = gc.communicate(timeout=60)
        assert "tore down" not in out  # the pod in setup is not collected
    finally:
        slow.communicate(timeout=60)
    assert first.startswith("gc: waiting for default/web-0 (infra infra0): an action on it is in progress"), first
    assert still_waiting  # the line came while gc waited: streamed, not with the answer
    assert gc.returncode == 0 and slow.returncode == 0, err
    assert p.env_of("setup")["NP_TEST_ORIGIN"] == "daemon"  # both ran in the daemon
    # A client that does not ask for progress gets the answer alone, as before.
    answer = exchange(full["NETPLUGIN_RUN_DIR"] + "/netplugin.sock", {"v": 1, "op": "gc"}, timeout=60)
    assert answer["ok"] and "progress" not in answer
