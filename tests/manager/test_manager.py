"""netplugin.manager: init once, per-pod serialisation, rollback, host lookups, the call environment.

Concurrency is checked across real ``netplugin`` processes (and threads), by the ORDER of events a
plugin records, never by durations.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from netplugin.core.errors import (
    HostError,
    InvalidArgument,
    NetpluginError,
    PluginFailed,
    PluginNotFound,
    PluginOutputError,
    PluginTimeout,
)
from netplugin.core.execplugin.exec_plugin import ExecPlugin
from netplugin.core.names import PodRef
from netplugin.core.plugin import NOOP_NAME, PodNetworkStatus
from netplugin.core.procs import boot_id
from netplugin.hosts.base import NullHost
from netplugin.manager.manager import Manager
from netplugin.plugins import BUILTINS
from tests.support.fakehost import DownHost, FakeHost

POD = PodRef("default", "web-0", "abc123")
POD_ARGS = "default web-0 abc123"
POD_OBJ = {"apiVersion": "v1", "kind": "Pod", "metadata": {"namespace": "default", "name": "web-0"},
           "spec": {"nodeName": "n1"}}


def spawn_cli(cli_env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "netplugin", *args], env=cli_env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err


def marker_path(np_dirs: dict[str, str], name: str) -> Path:
    return Path(np_dirs["run_dir"]) / "init" / (name.replace("/", "~") + ".json")


# --- basic flow ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("action", ["setup", "teardown", "status"])
def test_init_runs_before_the_first_action_only(plugin_dir: Any, make_manager: Any, action: str) -> None:
    p = plugin_dir.install("p")
    getattr(make_manager(plugin="p"), action)(POD)
    getattr(make_manager(plugin="p"), action)(POD)  # a new manager (a new CLI process) finds the marker
    assert p.calls() == ["init", f"{action} {POD_ARGS}", f"{action} {POD_ARGS}"]


def test_marker_records_boot_and_version(plugin_dir: Any, make_manager: Any, np_dirs: dict[str, str]) -> None:
    plugin_dir.install("vendor.example/p")
    m = make_manager(plugin="vendor.example/p")
    assert m.init() is True
    marker = json.loads(marker_path(np_dirs, "vendor.example/p").read_text())
    assert marker["plugin"] == "vendor.example/p"
    assert marker["boot_id"] == boot_id() == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert marker["version"] == m.plugin.version()
    assert marker["pid"] == os.getpid()


def test_noop_plugin_is_the_default(make_manager: Any) -> None:
    m = make_manager()
    assert m.plugin.name == NOOP_NAME
    assert m.setup(POD) is None
    assert m.status(POD) is None
    m.teardown(POD)
    assert m.init() is False  # init ran (and was recorded) with the first action


def test_status_returns_the_plugins_answer(plugin_dir: Any, make_manager: Any) -> None:
    p = plugin_dir.install("p")
    p.set("status", stdout='{"ip":"10.203.1.2"}')
    assert make_manager(plugin="p").status(POD) == PodNetworkStatus("10.203.1.2")
    p.set("status", stdout='{"ip":"10.203.1.300"}')
    with pytest.raises(PluginOutputError, match=r"10\.203\.1\.300"):
        make_manager(plugin="p").status(POD)
    assert "teardown" not in " ".join(p.calls())  # a bad status is not a reason to tear down


def test_candidates_lists_builtins_then_the_exec_dir(plugin_dir: Any, make_manager: Any) -> None:
    plugin_dir.install("b")
    plugin_dir.install("a", mode=0o644)
    cands = make_manager().candidates()
    assert [c.name for c in cands] == [*sorted(BUILTINS), "a", "b"]
    assert [c.valid for c in cands][-2:] == [False, True]
    assert all(c.builtin for c in cands[: len(BUILTINS)])


def test_plugin_is_selected_once_and_rescan_selects_again(plugin_dir: Any, make_manager: Any) -> None:
    m = make_manager(plugin="late")
    with pytest.raises(PluginNotFound):
        m.plugin  # noqa: B018
    p = plugin_dir.install("late")
    assert m.rescan().name == "late"
    assert m.plugin is m.plugin
    assert isinstance(m.plugin, ExecPlugin) and m.plugin.path == str(p.exe)


# --- init once ----------------------------------------------------------------------------------------------


def test_init_once_across_processes(plugin_dir: Any, cli_env: dict[str, str]) -> None:
    p = plugin_dir.install("p")
    p.set("init", sleep=0.5)  # hold the init lock while the others arrive
    procs = [spawn_cli(cli_env, "--plugin", "p", "setup", "default", f"web-{i}", f"id{i}") for i in range(8)]
    finish(procs)
    calls = p.calls()
    assert calls.count("init") == 1
    assert calls[0] == "init"
    assert sorted(calls[1:]) == sorted(f"setup default web-{i} id{i}" for i in range(8))


def test_init_once_across_threads(plugin_dir: Any, make_manager: Any) -> None:
    p = plugin_dir.install("p")
    p.set("init", sleep=0.3)
    managers = [make_manager(plugin="p") for _ in range(8)]
    barrier = threading.Barrier(len(managers))
    ran: list[bool] = []

    def go(m: Manager) -> None:
        barrier.wait()
        ran.append(m.init())

    threads = [threading.Thread(target=go, args=(m,)) for m in managers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(ran) == [False] * 7 + [True]
    assert p.calls() == ["init"]


def test_init_runs_again_after_the_executable_changes(plugin_dir: Any, make_manager: Any) -> None:
    p = plugin_dir.install("p")
    m = make_manager(plugin="p")
    m.setup(POD)
    with open(p.exe, "a") as f:
        f.write("# version 2\n")
    m.setup(POD)
    make_manager(plugin="p").setup(POD)
    assert p.calls() == ["init", f"setup {POD_ARGS}", "init", f"setup {POD_ARGS}", f"setup {POD_ARGS}"]


def test_a_long_lived_manager_reads_no_marker_once_it_knows_init_ran(plugin_dir: Any, make_manager: Any,
                                                                     np_dirs: dict[str, str]) -> None:
    """The daemon's manager remembers init per settings and version: no marker read per action,
    but a new version (above) or a rescan (SIGHUP) checks again."""
    p = plugin_dir.install("p")
    m = make_manager(plugin="p")
    m.setup(POD)
    marker_path(np_dirs, "p").write_bytes(b"{torn")  # a new manager would run init again
    m.setup(POD)
    assert p.calls().count("init") == 1
    m.rescan()
    m.setup(POD)
    assert p.calls().count("init") == 2


def test_touching_the_executable_without_changing_it_does_not_rerun_init(plugin_dir: Any,
                                                                          make_manager: Any) -> None:
    p = plugin_dir.install("p")
    make_manager(plugin="p").init()
    st = p.exe.stat()
    os.utime(p.exe, ns=(st.st_atime_ns + 10**9, st.st_mtime_ns + 10**9))
    assert make_manager(plugin="p").init() is False
    assert p.calls() == ["init"]


@pytest.mark.parametrize(
    ("mutate", "reruns"),
    [
        pytest.param(lambda m: m, False, id="unchanged"),
        pytest.param(lambda m: {**m, "boot_id": "another-boot"}, True, id="other-boot"),
        pytest.param(lambda m: {**m, "version": "sha256:old", "version_key": None}, True, id="other-version"),
        pytest.param(lambda m: {**m, "version_key": [0, 0, 0, 0, 0]}, False, id="stale-key-same-content"),
        pytest.param(lambda m: [m], True, id="not-an-object"),
        pytest.param(lambda m: b"{torn", True, id="torn"),
        pytest.param(lambda m: b"", True, id="empty"),
        pytest.param(lambda m: None, True, id="removed"),
    ],
)
def test_init_marker(plugin_dir: Any, make_manager: Any, np_dirs: dict[str, str], mutate: Any,
                     reruns: bool) -> None:
    p = plugin_dir.install("p")
    make_manager(plugin="p").init()
    path = marker_path(np_dirs, "p")
    new = mutate(json.loads(path.read_text()))
    if new is None:
        path.unlink()
    else:
        path.write_bytes(new if isinstance(new, bytes) else json.dumps(new).encode())
    assert make_manager(plugin="p").init() is reruns
    assert p.calls().count("init") == (2 if reruns else 1)


def test_init_force(plugin_dir: Any, run_cli: Any) -> None:
    p = plugin_dir.install("p")
    ran = [json.loads(run_cli("--plugin", "p", "-o", "json", *args).stdout)
           for args in (["init"], ["init"], ["init", "--force"])]
    assert ran == [{"plugin": "p", "ran": True}, {"plugin": "p", "ran": False}, {"plugin": "p", "ran": True}]
    assert p.calls() == ["init", "init"]


@pytest.mark.parametrize("failure", [{"exit": 1}, {"exit": "signal:KILL"}, {"spawn": 1}])
def test_failed_init_is_retried_next_time(plugin_dir: Any, make_manager: Any, np_dirs: dict[str, str],
                                          failure: dict[str, Any]) -> None:
    p = plugin_dir.install("p")
    p.set("init", **failure)
    with pytest.raises(PluginFailed) as info:
        make_manager(plugin="p").setup(POD)
    assert info.value.action == "init"
    assert p.calls() == ["init"]  # setup did not run after a failed init
    assert not marker_path(np_dirs, "p").exists()
    p.clear("init")
    make_manager(plugin="p").setup(POD)
    assert p.calls() == ["init", "init", f"setup {POD_ARGS}"]


def test_init_timeout_is_retried_next_time(plugin_dir: Any, make_manager: Any) -> None:
    p = plugin_dir.install("p")
    p.set("init", sleep=300)
    with pytest.raises(PluginTimeout):
        make_manager(plugin="p", timeouts={"init": 0.5}).init()
    p.clear("init")
    assert make_manager(plugin="p").init() is True


# --- one action per pod at a time, pods in parallel ---------------------------------------------------------

RENDEZVOUS = """#!/usr/bin/env bash
# Records "start ACTION POD" and "end ACTION POD" in events.log around a rendezvous: waits (at most
# `patience` tenths of a second) until `want` actions have started. Actions that may run in parallel
# all start before any ends; serialised ones wait out their patience alone.
set -u
d=$(dirname "$0")
printf '%s\\n' "$*" >> "$d/calls.log"
[ "$1" = init ] && exit 0
printf 'start %s %s\\n' "$1" "$3" >> "$d/events.log"
want=$(cat "$d/want"); patience=$(cat "$d/patience")
for _ in $(seq "$patience"); do
    [ "$(grep -c '^start' "$d/events.log")" -ge "$want" ] && break
    sleep 0.1
done
printf 'end %s %s\\n' "$1" "$3" >> "$d/events.log"
"""


def rendezvous(plugin_dir: Any, want: int, patience_s: float) -> Any:
    p = plugin_dir.install("rdv", script=RENDEZVOUS)
    (p.dir / "want").write_text(str(want))
    (p.dir / "patience").write_text(str(int(patience_s * 10)))
    return p


def run_concurrently(how: str, jobs: list[tuple[str, PodRef]], cli_env: dict[str, str], make_manager: Any) -> None:
    if how == "processes":
        finish([spawn_cli(cli_env, "--plugin", "rdv", action, pod.namespace, pod.name, pod.infra_id)
                for action, pod in jobs])
        return
    m = make_manager(plugin="rdv")
    m.init()
    errors: list[BaseException] = []

    def go(action: str, pod: PodRef) -> None:
        try:
            getattr(m, action)(pod)
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=go, args=job) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


@pytest.mark.parametrize("how", ["processes", "threads"])
def test_actions_on_the_same_pod_never_overlap(plugin_dir: Any, cli_env: dict[str, str], make_manager: Any,
                                               how: str) -> None:
    p = rendezvous(plugin_dir, want=2, patience_s=3)
    jobs = [("setup", POD), ("teardown", POD), ("status", PodRef("default", "web-0", "other-infra-id"))]
    run_concurrently(how, jobs, cli_env, make_manager)
    events = p.events()
    assert len(events) == 6
    assert [e.split()[0] for e in events] == ["start", "end"] * 3, events
    for started, ended in zip(events[::2], events[1::2], strict=True):
        assert started.split()[1:] == ended.split()[1:]


@pytest.mark.parametrize("how", ["processes", "threads"])
def test_actions_on_different_pods_run_in_parallel(plugin_dir: Any, cli_env: dict[str, str], make_manager: Any,
                                                   how: str) -> None:
    p = rendezvous(plugin_dir, want=4, patience_s=20)
    jobs = [("setup", PodRef("default", f"web-{i}", f"id{i}")) for i in range(3)]
    jobs.append(("teardown", PodRef("other-ns", "web-0", "id9")))  # same name, other namespace: another pod
    run_concurrently(how, jobs, cli_env, make_manager)
    events = p.events()
    assert len(events) == 8
    assert [e.split()[0] for e in events[:4]] == ["start"] * 4, events


def test_pods_with_the_longest_names_get_distinct_lock_files(plugin_dir: Any, make_manager: Any,
                                                             np_dirs: dict[str, str]) -> None:
    from netplugin.store.locks import pod_lock_path

    label = "n" * 63
    a = PodRef(label, ".".join(["a" * 63] * 3 + ["a" * 61]), "id1")
    b = PodRef(label, ".".join(["a" * 63] * 3 + ["a" * 60 + "b"]), "id2")  # same first 200 characters
    paths = {pod_lock_path(np_dirs["run_dir"], pod) for pod in (a, b)}
    assert len(paths) == 2
    assert all(len(os.path.basename(path).encode()) <= 255 for path in paths)
    p = plugin_dir.install("p")
    m = make_manager(plugin="p")
    m.setup(a)
    m.setup(b)
    assert p.calls()[1:] == [f"setup {a.namespace} {a.name} id1", f"setup {b.namespace} {b.name} id2"]


# --- rollback -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("failure", "cls", "overrides"),
    [
        pytest.param({"exit": 1, "stderr": "no address left"}, PluginFailed, {}, id="exit-status"),
        pytest.param({"exit": "signal:TERM"}, PluginFailed, {}, id="signal"),
        pytest.param({"spawn": 1}, PluginFailed, {}, id="left-processes"),
        pytest.param({"sleep": 300}, PluginTimeout, {"timeouts": {"setup": 0.5}}, id="timeout"),
    ],
)
def test_failed_setup_is_rolled_back_with_a_teardown_of_the_same_pod(
    plugin_dir: Any, make_manager: Any, failure: dict[str, Any], cls: type[Exception], overrides: dict[str, Any]
) -> None:
    p = plugin_dir.install("p")
    p.set("setup", **failure)
    host = FakeHost({("default", "web-0"): POD_OBJ})
    with pytest.raises(cls) as info:
        make_manager(plugin="p", host=host, **overrides).setup(POD)
    assert p.calls() == ["init", f"setup {POD_ARGS}", f"teardown {POD_ARGS}"]
    assert info.value.details["rolled_back"] is True  # type: ignore[attr-defined]
    assert info.value.action == "setup"  # type: ignore[attr-defined]
    assert json.loads(p.stdin_of("teardown")) == POD_OBJ  # the rollback sees the same pod
    assert p.env_of("teardown")["NETPLUGIN_INFRA_ID"] == POD.infra_id


def test_no_rollback_when_disabled(plugin_dir: Any, make_manager: Any) -> None:
    p = plugin_dir.install("p")
    p.set("setup", exit=1)
    with pytest.raises(PluginFailed) as info:
        make_manager(plugin="p", rollback_on_failure=False).setup(POD)
    assert p.calls() == ["init", f"setup {POD_ARGS}"]
    assert "rolled_back" not in info.value.details


def test_rollback_failure_is_recorded_in_the_setup_error(plugin_dir: Any, make_manager: Any) -> None:
    p = plugin_dir.install("p")
    p.set("setup", exit=1, stderr="setup broke")
    p.set("teardown", exit=2, stderr="teardown broke too")
    with pytest.raises(PluginFailed) as info:
        make_manager(plugin="p").setup(POD)
    err = info.value
    assert err.action == "setup" and err.exit_status == 1 and "setup broke" in err.message
    assert "rolled_back" not in err.details
    assert "teardown failed: exit status 2" in err.details["rollback_error"]
    assert "teardown broke too" in err.details["rollback_error"]
    assert err.to_dict()["rollback_error"] == err.details["rollback_error"]


def test_successful_setup_is_not_rolled_back(plugin_dir: Any, make_manager: Any) -> None:
    p = plugin_dir.install("p")
    make_manager(plugin="p").setup(POD)
    assert p.calls() == ["init", f"setup {POD_ARGS}"]


# --- the host -----------------------------------------------------------------------------------------------


def test_pod_json_on_stdin_when_the_host_knows_the_pod(plugin_dir: Any, make_manager: Any) -> None:
    p = plugin_dir.install("p")
    host = FakeHost({("default", "web-0"): POD_OBJ})
    m = make_manager(plugin="p", host=host)
    m.setup(POD)
    m.status(PodRef("default", "unknown", "x1"))
    assert json.loads(p.stdin_of("setup")) == POD_OBJ
    assert p.stdin_of("status") == ""
    assert host.lookups == [("default", "web-0"), ("default", "unknown")]


def test_static_host_from_the_config(plugin_dir: Any, make_manager: Any, np_dirs: dict[str, str]) -> None:
    p = plugin_dir.install("p")
    Path(np_dirs["pods_dir"], "web.json").write_text(json.dumps(POD_OBJ))
    m = make_manager(plugin="p")
    Manager(m.config).setup(POD)  # host built from the config: StaticHost(pods_dir)
    assert json.loads(p.stdin_of("setup")) == POD_OBJ


def test_host_error_on_setup_is_an_error_and_runs_no_setup(plugin_dir: Any, make_manager: Any) -> None:
    p = plugin_dir.install("p")
    with pytest.raises(HostError) as info:
        make_manager(plugin="p", host=DownHost()).setup(POD)
    assert info.value.status == 503
    assert f"setup {POD_ARGS}" not in p.calls()
    assert f"teardown {POD_ARGS}" not in p.calls()


@pytest.mark.parametrize("action", ["teardown", "status"])
def test_host_error_on_teardown_and_status_is_tolerated(plugin_dir: Any, make_manager: Any, action: str) -> None:
    p = plugin_dir.install("p")
    host = DownHost()
    getattr(make_manager(plugin="p", host=host), action)(POD)
    assert host.lookups == 1
    assert p.calls()[-1] == f"{action} {POD_ARGS}"
    assert p.stdin_of(action) == ""


# --- the environment and limits of each call (fake runner at the invoker seam) ------------------------------


def test_call_environment_from_the_config(plugin_dir: Any, make_manager: Any, fake_runner: Any,
                                          np_dirs: dict[str, str]) -> None:
    plugin_dir.install("p")
    m = make_manager(plugin="p", runner=fake_runner, netns_template="/run/netns/np-{infra_id}",
                     env={"NETPLUGIN_BRIDGE_SUBNET": "10.203.4.0/24"}, inherit_env=False)
    parent = {"PATH": "/only/this", "SECRET": "x", "NETPLUGIN_PLUGIN_DIR": "/stale", "NETPLUGIN_ACTION": "init",
              "NETPLUGIN_NODE_POD_CIDRS": "10.9.9.0/24"}
    m = Manager(m.config, NullHost("node-a"), runner=fake_runner, environ=parent)
    m.setup(POD)
    assert fake_runner.actions() == ["init", "setup"]
    setup_env = fake_runner.last("setup").env
    token = setup_env.pop("NETPLUGIN_CALL_ID")  # opaque: proves the call is netplugin's (see core.execplugin.calls)
    assert token and token != fake_runner.last("init").env["NETPLUGIN_CALL_ID"]
    assert setup_env == {
        "PATH": "/only/this",
        "NETPLUGIN_BRIDGE_SUBNET": "10.203.4.0/24",
        "NETPLUGIN_STATE_DIR": np_dirs["state_dir"],
        "NETPLUGIN_ACTION": "setup",
        "NETPLUGIN_PLUGIN": "p",
        "NETPLUGIN_POD_NAMESPACE": "default",
        "NETPLUGIN_POD_NAME": "web-0",
        "NETPLUGIN_INFRA_ID": "abc123",
        "NETPLUGIN_NETNS": "/run/netns/np-abc123",
        # the node, always (a host that knows nothing more of it gives its name only)
        "NETPLUGIN_NODE_NAME": "node-a",
        "NETPLUGIN_NODE_POD_CIDRS": "",
        "NETPLUGIN_NODE_INTERNAL_IPS": "",
        # the chain, always (a chain of one: nothing before it to pass on)
        "NETPLUGIN_CHAIN": "p",
        "NETPLUGIN_CHAIN_INDEX": "1",
        "NETPLUGIN_PREV_IPS": "",
        "NETPLUGIN_PREV_HOST_INTERFACE": "",
        "NETPLUGIN_PREV_RESULT": '{"kind":"NetpluginPrevResult","netns":"/run/netns/np-abc123","ips":[],'
        '"hostInterface":null,"members":[]}',
    }
    init_env = fake_runner.last("init").env
    assert init_env["NETPLUGIN_ACTION"] == "init"
    assert init_env["NETPLUGIN_NODE_NAME"] == "node-a"
    assert "NETPLUGIN_NETNS" not in init_env and "NETPLUGIN_POD_NAME" not in init_env


@pytest.mark.parametrize("inherit", [True, False])
def test_real_plugin_environment_inherit(plugin_dir: Any, make_manager: Any, inherit: bool) -> None:
    p = plugin_dir.install("p")
    m = make_manager(plugin="p", inherit_env=inherit)
    parent = {"PATH": os.environ["PATH"], "FROM_PARENT": "1", "NETPLUGIN_TIMEOUT": "3"}
    Manager(m.config, NullHost(), environ=parent).setup(POD)
    env = p.env_of("setup")
    assert ("FROM_PARENT" in env) is inherit
    assert env["PATH"] == os.environ["PATH"]
    assert "NETPLUGIN_TIMEOUT" not in env


def test_limits_per_action(plugin_dir: Any, make_manager: Any, fake_runner: Any) -> None:
    plugin_dir.install("p")
    m = make_manager(plugin="p", runner=fake_runner, timeouts={"setup": 1.5, "status": 2.5}, max_output=8192,
                     kill_grace=0.25)
    m.setup(POD)
    m.status(POD)
    m.teardown(POD)
    got = {c.action: (c.timeout, c.max_output, c.kill_grace) for c in fake_runner.calls}
    assert got == {"init": (10.0, 8192, 0.25), "setup": (1.5, 8192, 0.25), "status": (2.5, 8192, 0.25),
                   "teardown": (30.0, 8192, 0.25)}


def test_timeout_override_applies_to_every_action(plugin_dir: Any, make_manager: Any, fake_runner: Any) -> None:
    plugin_dir.install("p")
    m = make_manager(plugin="p", runner=fake_runner, timeout=0.7)
    m.setup(POD)
    m.teardown(POD)
    assert {c.timeout for c in fake_runner.calls} == {0.7}


# --- nothing runs on bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a/b/c", "-bad", "UPPER/x", "x" * 64])
def test_bad_plugin_name_runs_nothing(plugin_dir: Any, make_manager: Any, name: str) -> None:
    p = plugin_dir.install("p")
    m = make_manager(plugin="p")
    with pytest.raises(InvalidArgument):
        m.select(name)
    assert p.calls() == []


def test_errors_are_netplugin_errors_with_details(plugin_dir: Any, make_manager: Any) -> None:
    p = plugin_dir.install("p")
    p.set("teardown", exit=4, stderr="busy")
    with pytest.raises(NetpluginError) as info:
        make_manager(plugin="p").teardown(POD)
    d = info.value.to_dict()
    assert d["error"] == "PluginFailed"
    assert (d["plugin"], d["action"], d["exit_status"], d["pod"]) == ("p", "teardown", 4, "default/web-0")
    assert d["stderr_tail"] == "busy"
