"""``netplugin serve`` and the CLI's use of it, with real daemon, CLI and plugin processes."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from netplugin.core.errors import DaemonUnavailable, InvalidArgument, PluginFailed
from netplugin.core.spares import CAP, SPARE_DIR
from tests.support.waits import WITHIN, wait_for

from .conftest import GATE

POD = ("default", "web-0", "infra0")
OPERATION_TYPES = ("set_up_pod", "tear_down_pod", "get_pod_network_status")


def origin(plugin: Any, action: str) -> str:
    """Who ran the plugin's last ``action``: "daemon" or "cli" (from the environment it got)."""
    return str(plugin.env_of(action)["NP_TEST_ORIGIN"])


def samples(text: str, name: str) -> dict[str, float]:
    """operation_type -> value of the sample ``name`` in Prometheus text."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                out[s.labels.get("operation_type", "")] = s.value
    return out


# --- the CLI goes through the daemon -----------------------------------------------------------------


def test_setup_status_teardown_go_through_the_daemon(
    start_daemon: Any, cli: Any, plugin_dir: Any, np_dirs: dict[str, str]
) -> None:
    p = plugin_dir.install("scripted")
    p.set("status", stdout='{"ip": "10.203.0.7"}')
    d = start_daemon(env={"NETPLUGIN_PLUGIN": "scripted"})
    assert p.calls() == ["init"]  # init ran once, at start
    # ... and the files the first pods need were made then, off their path (netplugin.core.spares)
    for sub in ("state_dir/pods", "run_dir/locks"):
        key, rest = sub.split("/")
        assert len(list((Path(np_dirs[key]) / rest / SPARE_DIR).iterdir())) == CAP, sub

    env = {"NETPLUGIN_PLUGIN": "scripted"}
    r = cli("-o", "json", "setup", *POD, env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["infra_id"] == "infra0"
    assert origin(p, "setup") == "daemon"
    assert "NOTIFY_SOCKET" not in p.env_of("setup")  # plugins must not speak to systemd for the daemon
    r = cli("status", *POD, env=env)
    assert (r.returncode, r.stdout) == (0, "10.203.0.7\n"), r.stderr
    assert origin(p, "status") == "daemon"
    r = cli("-o", "json", "teardown", *POD, env=env)
    assert r.returncode == 0, r.stderr
    assert origin(p, "teardown") == "daemon"
    r = cli("-o", "json", "init", env=env)
    assert json.loads(r.stdout) == {"plugin": "scripted", "ran": False}

    # The exact argv the kubelet used, and init still only once (setup may also ask status for the record).
    calls = [c for c in p.calls() if not c.startswith("status")]
    assert calls == ["init", "setup default web-0 infra0", "teardown default web-0 infra0"]
    counts = samples(d.metrics(), "kubelet_network_plugin_operations_duration_seconds_count")
    assert counts == {"set_up_pod": 1.0, "tear_down_pod": 1.0, "get_pod_network_status": 1.0}


def test_plugins_pods_gc_through_the_daemon_print_what_local_prints(
    start_daemon: Any, cli: Any, plugin_dir: Any
) -> None:
    plugin_dir.install("scripted")
    plugin_dir.install("broken", mode=0o644)
    env = {"NETPLUGIN_PLUGIN": "scripted"}
    d = start_daemon(env=env)
    assert cli("setup", *POD, env=env).returncode == 0
    for args in (
        ["plugins"],
        ["-o", "json", "plugins"],
        ["pods"],
        ["-o", "json", "pods"],
        ["gc", "--dry-run"],
        ["-o", "json", "gc", "--dry-run"],
    ):
        remote = cli(*args, env=env)
        local = cli(*args, env=env, mode="never")
        assert remote.returncode == local.returncode == 0, (args, remote.stderr, local.stderr)
        assert remote.stdout == local.stdout, args
        assert remote.stdout
    # -o wide too; its AGE may tick between the two calls.
    wide = [cli("-o", "wide", "pods", env=env, mode=mode) for mode in ("always", "never")]
    assert [w.returncode for w in wide] == [0, 0], [w.stderr for w in wide]
    remote_wide, local_wide = ([line.rsplit(None, 1)[0] for line in w.stdout.splitlines()] for w in wide)
    assert remote_wide == local_wide and remote_wide[0].split()[-2:] == ["HOST-VETH", "NETNS"], remote_wide
    # gc itself (it changes things, so once), through the daemon.
    r = cli("-o", "json", "gc", env=env, mode="always")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["checked"] == 1
    assert 'netplugin_daemon_requests_total{op="gc",outcome="ok"} 3.0' in d.metrics()  # 2 dry runs, 1 real


def test_thin_client_imports_nothing_heavy(start_daemon: Any, cli: Any) -> None:
    start_daemon()

    def imported(mode: str) -> set[str]:
        r = cli("-o", "json", "setup", *POD, mode=mode, env={"PYTHONPROFILEIMPORTTIME": "1"})
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["pod"] == "web-0"
        return {line.rsplit("|", 1)[1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")}

    thin = imported("auto")
    assert "netplugin.frontends.wire.client" in thin
    heavy = {
        "pyroute2",
        "lightkube",
        "prometheus_client",
        "psutil",
        "asyncio",
        "concurrent.futures",
        "netplugin.manager",
        "netplugin.core.plugin",
        "netplugin.core.execplugin.invoke",
        "netplugin.store.state",
        "netplugin.frontends.daemon",
    }
    assert thin & heavy == set()
    # The same command working alone does load the machinery (so the check above means something).
    assert "netplugin.manager" in imported("never")


# --- locking shared with direct CLI use ---------------------------------------------------------------


def test_same_pod_never_overlaps_across_daemon_and_cli_and_pods_run_in_parallel(
    start_daemon: Any, cli_popen: Any, plugin_dir: Any
) -> None:
    p = plugin_dir.install("gate", script=GATE)
    env_args = ("--plugin", "gate")
    start_daemon(env={"NETPLUGIN_PLUGIN": "gate"})

    def events() -> list[str]:
        result: list[str] = p.events()
        return result

    first = cli_popen(*env_args, "setup", "default", "a", "a1")  # through the daemon
    wait_for(lambda: "start a daemon" in events(), "the daemon's setup of pod a to start", WITHIN)
    same = cli_popen(*env_args, "setup", "default", "a", "a2", mode="never")  # same pod, no daemon
    other = cli_popen(*env_args, "setup", "default", "b", "b1")  # another pod, through the daemon
    # Pod b gets set up while pod a's setup is still in flight in the daemon.
    wait_for(lambda: "start b daemon" in events(), "pod b's setup to start while pod a's runs", WITHIN)
    assert "end a daemon" not in events()
    (p.dir / "go-b").touch()
    wait_for(lambda: "end b daemon" in events(), "pod b's setup to end", WITHIN)
    assert [e for e in events() if e.split()[1] == "a"] == ["start a daemon"]  # the CLI's waits for the lock
    (p.dir / "go-a").touch()
    for proc in (first, same, other):
        _out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    # Pod a: the daemon's action and the CLI's never interleave.
    a_events = [e for e in events() if e.split()[1] == "a"]
    assert a_events == ["start a daemon", "end a daemon", "start a cli", "end a cli"]


# --- errors: same exit codes and messages as working alone --------------------------------------------


def both(cli: Any, *args: str, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], ...]:
    remote = cli(*args, env=env, mode="always")
    local = cli(*args, env=env, mode="never")
    return remote, local


@pytest.mark.parametrize("output", ["text", "json"])
def test_plugin_failure_same_through_daemon(start_daemon: Any, cli: Any, plugin_dir: Any, output: str) -> None:
    p = plugin_dir.install("scripted")
    p.set("setup", exit=3, stderr="bridge cbr0 is gone")
    env = {"NETPLUGIN_PLUGIN": "scripted"}
    d = start_daemon(env=env)
    remote, local = both(cli, "-o", output, "setup", *POD, env=env)
    assert remote.returncode == local.returncode == 1
    assert remote.stderr == local.stderr
    assert "bridge cbr0 is gone" in remote.stderr
    if output == "json":
        err = json.loads(remote.stderr)
        assert (err["error"], err["exit_status"], err["rolled_back"]) == ("PluginFailed", 3, True)
    assert samples(d.metrics(), "kubelet_network_plugin_operations_errors_total")["set_up_pod"] == 1.0


def test_timeout_same_through_daemon(start_daemon: Any, cli: Any, plugin_dir: Any) -> None:
    p = plugin_dir.install("scripted")
    p.set("status", sleep=30)
    env = {"NETPLUGIN_PLUGIN": "scripted", "NETPLUGIN_TIMEOUT": "1", "NETPLUGIN_KILL_GRACE": "0.2"}
    d = start_daemon(env=env)
    remote, local = both(cli, "status", *POD, env=env)
    assert remote.returncode == local.returncode == 4
    assert remote.stderr == local.stderr
    assert "timed out after 1s" in remote.stderr
    errors = samples(d.metrics(), "kubelet_network_plugin_operations_errors_total")
    assert errors == {"set_up_pod": 0.0, "tear_down_pod": 0.0, "get_pod_network_status": 1.0}


def test_plugin_not_found_same_through_daemon(start_daemon: Any, cli: Any, plugin_dir: Any) -> None:
    plugin_dir.install("other")
    env = {"NETPLUGIN_PLUGIN": "missing"}
    d = start_daemon(env=env)  # a missing plugin does not stop the daemon: it may be installed later
    assert "missing" in d.health()["plugin_problem"]
    for args in (("setup", *POD), ("-o", "json", "init")):
        remote, local = both(cli, *args, env=env)
        assert remote.returncode == local.returncode == 3
        assert remote.stderr == local.stderr
        assert "network plugin 'missing' not found (available:" in remote.stderr


def test_failed_init_at_start_is_retried_by_the_next_operation(start_daemon: Any, cli: Any, plugin_dir: Any) -> None:
    p = plugin_dir.install("scripted")
    p.set("init", exit=1, stderr="no uplink yet")
    env = {"NETPLUGIN_PLUGIN": "scripted"}
    d = start_daemon(env=env)  # serves anyway: the CLI's first action retries, as it would alone
    assert "no uplink yet" in d.health()["plugin_problem"]
    remote, local = both(cli, "setup", *POD, env=env)
    assert remote.returncode == local.returncode == 1
    assert remote.stderr == local.stderr
    assert "init failed: exit status 1" in remote.stderr
    p.clear("init")
    r = cli("setup", *POD, env=env, mode="always")
    assert r.returncode == 0, r.stderr
    assert p.calls() == ["init"] * 4 + ["setup default web-0 infra0"]
    assert d.health()["plugin_problem"] is None


def test_bad_input_rejected_before_sending_and_by_the_daemon(start_daemon: Any, cli: Any) -> None:
    d = start_daemon()
    before = d.health()["requests"]
    remote, local = both(cli, "setup", "Bad_NS", "web-0", "infra0", env={})
    assert remote.returncode == local.returncode == 2
    assert remote.stderr == local.stderr
    assert "invalid namespace 'Bad_NS'" in remote.stderr
    assert d.health()["requests"] == before + 1  # only the health request itself: nothing was sent
    # The daemon validates too (a client of its own may send anything).
    with pytest.raises(InvalidArgument, match="invalid infra container id"):
        d.call("setup", namespace="default", pod="web-0", infra_id="-x")
    with pytest.raises(InvalidArgument, match="invalid op 'explode'"):
        d.call("explode")


def test_daemon_with_other_settings_is_not_used(start_daemon: Any, cli: Any, plugin_dir: Any) -> None:
    p = plugin_dir.install("scripted")
    plugin_dir.install("other")
    start_daemon(env={"NETPLUGIN_PLUGIN": "other"})
    env = {"NETPLUGIN_PLUGIN": "scripted"}
    r = cli("setup", *POD, env=env)  # auto: the daemon runs another plugin, so work alone
    assert r.returncode == 0, r.stderr
    assert origin(p, "setup") == "cli"
    r = cli("setup", *POD, env=env, mode="always")
    assert r.returncode == 6
    assert "runs with different settings (plugin)" in r.stderr


# --- daemon down --------------------------------------------------------------------------------------


def test_without_daemon_auto_works_alone_and_always_exits_6(cli: Any, plugin_dir: Any, np_dirs: Any) -> None:
    p = plugin_dir.install("scripted")
    env = {"NETPLUGIN_PLUGIN": "scripted"}
    r = cli("setup", *POD, env=env)
    assert r.returncode == 0, r.stderr
    assert origin(p, "setup") == "cli"
    r = cli("-o", "json", "setup", *POD, env=env, mode="always")
    assert r.returncode == 6
    err = json.loads(r.stderr)
    assert err["error"] == "DaemonUnavailable" and err["exit_code"] == 6
    # A socket file nobody listens on (a killed daemon's) is the same as none.
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(os.path.join(np_dirs["run_dir"], "netplugin.sock"))
    stale.close()
    r = cli("teardown", *POD, env=env)
    assert r.returncode == 0, r.stderr
    assert origin(p, "teardown") == "cli"
    r = cli("teardown", *POD, env=env, mode="always")
    assert r.returncode == 6
    assert "Connection refused" in r.stderr


# --- the socket ---------------------------------------------------------------------------------------


def test_socket_is_0600_root_and_replaces_a_stale_one(start_daemon: Any, np_dirs: Any) -> None:
    path = os.path.join(np_dirs["run_dir"], "netplugin.sock")
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(path)
    stale.close()
    stale_ino = os.lstat(path).st_ino
    d = start_daemon()
    st = os.lstat(path)
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert st.st_uid == os.geteuid()
    assert st.st_ino != stale_ino
    assert d.health()["pid"] == d.pid


def test_second_daemon_refuses_and_a_non_socket_is_never_replaced(start_daemon: Any, np_dirs: Any) -> None:
    first = start_daemon()
    second = start_daemon(ready=False)
    assert second.proc.wait(60) == 5
    assert "another netplugin daemon holds this lock" in second.output()
    assert first.health()["pid"] == first.pid  # untouched
    assert first.stop() == 0

    path = Path(np_dirs["run_dir"]) / "netplugin.sock"
    path.write_text("precious")
    third = start_daemon(ready=False)
    assert third.proc.wait(60) == 5
    assert "is not a socket" in third.output()
    assert path.read_text() == "precious"


# --- signals ------------------------------------------------------------------------------------------


def test_sigterm_waits_for_the_setup_in_flight_then_exits_0(
    start_daemon: Any, cli: Any, cli_popen: Any, plugin_dir: Any
) -> None:
    p = plugin_dir.install("gate", script=GATE)
    env = {"NETPLUGIN_PLUGIN": "gate"}
    d = start_daemon(env=env)
    setup = cli_popen("--plugin", "gate", "-o", "json", "setup", "default", "slow", "s1")
    wait_for(lambda: "start slow daemon" in p.events(), "the daemon's setup to start", WITHIN)
    d.signal(signal.SIGTERM)
    d.wait_note("STOPPING=1")
    # Draining: the socket is gone at once, so new callers work alone meanwhile...
    wait_for(lambda: not os.path.exists(d.socket), "the socket to be removed", WITHIN)
    r = cli("teardown", "default", "other", "o1", env=env)
    assert r.returncode == 0, r.stderr
    assert origin(p, "teardown") == "cli"
    # ...while the daemon still waits for the setup it had accepted.
    assert d.proc.poll() is None
    (p.dir / "go-slow").touch()
    out, err = setup.communicate(timeout=120)
    assert setup.returncode == 0, err
    assert json.loads(out)["pod"] == "slow"
    assert d.proc.wait(60) == 0
    assert "end slow daemon" in p.events()
    assert not os.path.exists(d.socket)


def test_sighup_rescans_the_plugins(start_daemon: Any, cli: Any, plugin_dir: Any) -> None:
    p = plugin_dir.install("scripted")
    env = {"NETPLUGIN_PLUGIN": "scripted"}
    d = start_daemon(env=env)
    assert p.calls() == ["init"]

    # A new version of the plugin: SIGHUP runs its init at once (no pod action needed).
    new = p.dir / "scripted.new"
    new.write_text(p.exe.read_text() + "# version 2\n")
    new.chmod(0o755)
    new.rename(p.exe)
    d.signal(signal.SIGHUP)
    wait_for(lambda: d.health()["reloads"] == 1, "the reload to finish", WITHIN)
    assert p.calls() == ["init", "init"]

    # The selected plugin became unsafe (world-writable): the reload is refused, and each call
    # still checks the plugin it runs.
    p.exe.chmod(0o757)
    d.signal(signal.SIGHUP)
    wait_for(lambda: d.health()["reloads"] == 2, "the second reload to finish", WITHIN)
    assert "world-writable" in d.health()["refused"]
    r = cli("setup", *POD, env=env, mode="always")
    assert r.returncode == 3
    assert "is invalid: unsafe permissions" in r.stderr

    # Fixed, and picked up by the next rescan.
    p.exe.chmod(0o755)
    d.signal(signal.SIGHUP)
    wait_for(lambda: d.health()["reloads"] == 3, "the third reload to finish", WITHIN)
    assert d.health()["plugin_problem"] is None and d.health()["refused"] is None
    r = cli("setup", *POD, env=env, mode="always")
    assert r.returncode == 0, r.stderr


# --- metrics ------------------------------------------------------------------------------------------


def test_metrics_histogram_errors_and_in_flight(start_daemon: Any, cli: Any, plugin_dir: Any) -> None:
    p = plugin_dir.install("scripted")
    env = {"NETPLUGIN_PLUGIN": "scripted"}
    d = start_daemon(env=env)
    text = d.metrics()
    # Present with zeros before any operation.
    zeros = dict.fromkeys(OPERATION_TYPES, 0.0)
    assert samples(text, "kubelet_network_plugin_operations_duration_seconds_count") == zeros
    assert samples(text, "netplugin_operations_in_flight") == zeros

    for action in ("setup", "status", "status", "teardown"):
        assert cli(action, *POD, env=env, mode="always").returncode == 0
    p.set("teardown", exit=1)
    assert cli("teardown", *POD, env=env, mode="always").returncode == 1

    text = d.metrics()
    assert samples(text, "kubelet_network_plugin_operations_duration_seconds_count") == {
        "set_up_pod": 1.0,
        "get_pod_network_status": 2.0,
        "tear_down_pod": 2.0,
    }
    assert samples(text, "kubelet_network_plugin_operations_errors_total") == {
        "set_up_pod": 0.0,
        "get_pod_network_status": 0.0,
        "tear_down_pod": 1.0,
    }
    # Every operation is counted, failed ones included (kubelet's kubelet_network_plugin_operations_total).
    assert samples(text, "kubelet_network_plugin_operations_total") == {
        "set_up_pod": 1.0,
        "get_pod_network_status": 2.0,
        "tear_down_pod": 2.0,
    }
    buckets = [
        s
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "kubelet_network_plugin_operations_duration_seconds_bucket"
    ]
    assert {s.labels["operation_type"] for s in buckets} == set(OPERATION_TYPES)
    assert re.search(r'netplugin_daemon_requests_total\{op="teardown",outcome="PluginFailed"\} 1\.0', text)


def test_metrics_can_be_disabled(start_daemon: Any) -> None:
    d = start_daemon("--metrics-address", "none")
    assert d.health()["metrics_address"] is None
    assert "metrics on none" in d.output()


# --- the client library --------------------------------------------------------------------------------


def test_one_connection_serves_many_requests_and_errors_come_back_as_themselves(
    start_daemon: Any, plugin_dir: Any
) -> None:
    from netplugin.frontends.wire.client import Connection

    p = plugin_dir.install("scripted")
    p.set("setup", exit=7, stderr="nope")
    d = start_daemon(env={"NETPLUGIN_PLUGIN": "scripted"})
    with Connection(d.socket) as conn:
        assert conn.call("health")["pid"] == d.pid
        with pytest.raises(PluginFailed) as info:
            conn.call("setup", namespace="default", pod="web-0", infra_id="infra0")
        assert info.value.exit_status == 7
        assert info.value.stderr_tail == "nope"
        assert conn.call("status", namespace="default", pod="web-0", infra_id="infra0") is None
    with pytest.raises(DaemonUnavailable):
        Connection(d.socket + ".absent")


def test_serve_help_lists_its_options() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "netplugin", "serve", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])},
    )
    assert r.returncode == 0
    assert "--socket" in r.stdout and "--metrics-address" in r.stdout
