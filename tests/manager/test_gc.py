"""netplugin gc: which records it repairs and how, its dry run, its locking, orphaned plugin processes.

Real plugin processes throughout; interrupted actions are made by really SIGKILLing a netplugin CLI
process while its plugin runs. "Network namespaces" are plain files under a tmp dir.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from netplugin.core.errors import PluginFailed
from netplugin.core.names import PodRef
from netplugin.hosts.base import NullHost
from netplugin.hosts.static import StaticHost
from netplugin.manager.gc import host_is_authoritative, run_gc
from netplugin.manager.manager import Manager
from netplugin.store.orphans import plugin_processes
from netplugin.store.records import READY, SETTING_UP, TEARING_DOWN, record_filename
from netplugin.store.state import StateStore
from tests.support.fakehost import DownHost, FakeHost
from tests.support.nettest import live_netns_file
from tests.support.procs import pid_alive
from tests.support.waits import WITHIN, wait_for

POD = PodRef("default", "web-0", "infra0")
ARGV = "default web-0 infra0"


@pytest.fixture
def cli_env_sc(cli_env: dict[str, str], netns_dir: Path, sc: Any, sc_env: dict[str, str]) -> dict[str, str]:
    return dict(cli_env, **sc_env, NETPLUGIN_NETNS_TEMPLATE=str(netns_dir / "{infra_id}"))


@pytest.fixture
def cli(run_cli: Any, cli_env_sc: dict[str, str]) -> Callable[..., Any]:
    def run(*args: str) -> Any:
        return run_cli(*args, env=cli_env_sc)

    return run


@pytest.fixture
def background(cli_env_sc: dict[str, str]) -> Any:
    """background(*args) -> a netplugin CLI process left running; all are killed at the end."""
    started: list[subprocess.Popen[bytes]] = []

    def start(*args: str) -> subprocess.Popen[bytes]:
        p = subprocess.Popen([sys.executable, "-m", "netplugin", *args], env=cli_env_sc,
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        started.append(p)
        return p

    yield start
    for p in started:
        if p.poll() is None:
            p.kill()
        p.communicate()


def netns(netns_dir: Path, ref: PodRef = POD) -> Path:
    p = netns_dir / ref.infra_id
    if not p.is_symlink():
        live_netns_file(p)
    return p


def teardowns(sc: Any) -> list[str]:
    return [c for c in sc.calls() if c.startswith("teardown")]


def record_bytes(np_dirs: dict[str, str], ref: PodRef = POD) -> bytes | None:
    p = Path(np_dirs["state_dir"]) / "pods" / record_filename(ref)
    return p.read_bytes() if p.exists() else None


# --- what gc repairs ------------------------------------------------------------------------------------


def _netns_gone(m: Manager, sc: Any, nd: Path) -> None:
    netns(nd).unlink()


def _netns_left_a_plain_file(m: Manager, sc: Any, nd: Path) -> None:
    netns(nd).unlink()
    netns_dir_file = nd / POD.infra_id
    netns_dir_file.write_text("")  # what an unmounted namespace's mount point leaves behind


def _netns_dangling_symlink(m: Manager, sc: Any, nd: Path) -> None:
    netns(nd).unlink()
    (nd / POD.infra_id).symlink_to(nd / "no-such-namespace")


def _netns_a_directory(m: Manager, sc: Any, nd: Path) -> None:
    netns(nd).unlink()
    (nd / POD.infra_id).mkdir()


def _setup_interrupted(m: Manager, sc: Any, nd: Path) -> None:
    sc.set("setup", exit=1)
    sc.set("teardown", exit=1)  # the rollback fails too: the record stays "setting-up"
    with pytest.raises(PluginFailed):
        m.setup(POD)
    sc.clear("setup")
    sc.clear("teardown")


def _teardown_interrupted(m: Manager, sc: Any, nd: Path) -> None:
    sc.set("teardown", exit=1)
    with pytest.raises(PluginFailed):
        m.teardown(POD)
    sc.clear("teardown")


def _healthy(m: Manager, sc: Any, nd: Path) -> None:
    pass


@pytest.mark.parametrize(
    ("break_it", "state_before", "reason"),
    [
        pytest.param(_netns_gone, READY, "its network namespace", id="netns-gone"),
        # not an nsfs file: gone, as opening it for setns would find (and `pods` shows it broken)
        pytest.param(_netns_left_a_plain_file, READY, "its network namespace", id="netns-plain-file"),
        pytest.param(_netns_dangling_symlink, READY, "its network namespace", id="netns-dangling-symlink"),
        pytest.param(_netns_a_directory, READY, "its network namespace", id="netns-directory"),
        pytest.param(_setup_interrupted, SETTING_UP, "its setup failed and so did its rollback", id="rollback-failed"),
        pytest.param(_teardown_interrupted, TEARING_DOWN, "its teardown was interrupted", id="teardown-interrupted"),
        pytest.param(_healthy, READY, None, id="healthy-is-kept"),
    ],
)
def test_gc_tears_down_what_is_broken_and_keeps_what_is_not(
    mgr: Any, sc: Any, netns_dir: Path, store: StateStore, np_dirs: dict[str, str], cli: Any,
    break_it: Callable[..., None], state_before: str, reason: str | None,
) -> None:
    netns(netns_dir)
    m = mgr()
    if break_it is not _setup_interrupted:
        m.setup(POD)
    break_it(m, sc, netns_dir)
    rec = store.get(POD)
    assert rec is not None and rec.state == state_before
    before, calls_before = record_bytes(np_dirs), len(sc.calls())

    dry = cli("gc", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert record_bytes(np_dirs) == before and len(sc.calls()) == calls_before, "a dry run changes nothing"
    if reason:
        assert f"would tear down default/web-0 (infra infra0): {reason}" in dry.stdout
    else:
        assert "nothing to do" in dry.stdout

    r = cli("-o", "json", "gc")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    if reason is None:
        assert report["actions"] == [] and store.get(POD) is not None and len(sc.calls()) == calls_before
        return
    [action] = report["actions"]
    assert action["action"] == "teardown" and action["outcome"] == "done" and reason in action["reason"]
    assert (action["namespace"], action["name"], action["infra_id"]) == ("default", "web-0", "infra0")
    assert sc.calls()[-1] == f"teardown {ARGV}"
    assert store.get(POD) is None
    again = cli("gc")
    assert "nothing to do (0 record(s) checked)" in again.stdout, "gc is idempotent"


def _manifest(pods_dir: Path, name: str, uid: str) -> None:
    doc = {"apiVersion": "v1", "kind": "Pod", "metadata": {"namespace": "default", "name": name, "uid": uid}}
    (pods_dir / f"{name}.json").write_text(json.dumps(doc))


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        pytest.param("delete", "the host says the pod no longer exists", id="pod-deleted"),
        pytest.param("recreate", "the pod was re-created (uid uid-1 is now uid-2)", id="pod-recreated"),
        pytest.param("keep", None, id="pod-still-there"),
    ],
)
def test_gc_asks_the_host_whether_pods_still_exist(mgr: Any, sc: Any, store: StateStore,
                                                   np_dirs: dict[str, str], change: str, reason: str | None) -> None:
    pods = Path(np_dirs["pods_dir"])
    _manifest(pods, "web-0", "uid-1")
    host = StaticHost(str(pods))
    m = mgr(host=host)
    m.setup(POD)
    rec = store.get(POD)
    assert rec is not None and rec.uid == "uid-1"
    if change == "delete":
        (pods / "web-0.json").unlink()
    elif change == "recreate":
        _manifest(pods, "web-0", "uid-2")
    report = run_gc(m)
    assert [a.reason for a in report.actions] == ([reason] if reason else [])
    assert (store.get(POD) is None) == (reason is not None)
    if reason:
        assert teardowns(sc) == [f"teardown {ARGV}"]
        # Neither the missing pod nor its successor is the old sandbox's pod: nothing on stdin.
        assert sc.stdin_of("teardown") == ""


def test_gc_hands_the_pod_object_to_the_teardown_while_it_is_the_same_pod(
    mgr: Any, sc: Any, store: StateStore, np_dirs: dict[str, str], netns_dir: Path
) -> None:
    pods = Path(np_dirs["pods_dir"])
    _manifest(pods, "web-0", "uid-1")
    m = mgr(host=StaticHost(str(pods)))
    netns(netns_dir)
    m.setup(POD)
    netns(netns_dir).unlink()
    run_gc(m)
    assert json.loads(sc.stdin_of("teardown"))["metadata"]["uid"] == "uid-1"
    assert store.get(POD) is None


def _static(d: Path) -> StaticHost:
    (d / "pods").mkdir(exist_ok=True)
    return StaticHost(str(d / "pods"))


@pytest.mark.parametrize(
    ("host", "authoritative", "knew_pod", "torn_down"),
    [
        pytest.param(lambda d: NullHost(), False, False, False, id="null-host"),
        pytest.param(lambda d: StaticHost(str(d / "missing")), False, False, False, id="static-host-without-dir"),
        pytest.param(_static, True, False, False, id="static-host-that-never-knew-the-pod"),
        pytest.param(_static, True, True, True, id="static-host-that-forgot-the-pod"),
        pytest.param(lambda d: FakeHost(), True, False, False, id="fake-host-that-never-knew-the-pod"),
        pytest.param(lambda d: FakeHost(), True, True, True, id="fake-host-that-forgot-the-pod"),
    ],
)
def test_only_hosts_that_knew_the_pod_can_declare_it_gone(
    mgr: Any, store: StateStore, tmp_path: Path, host: Callable[[Path], Any], authoritative: bool,
    knew_pod: bool, torn_down: bool,
) -> None:
    h = host(tmp_path)
    assert host_is_authoritative(h) is authoritative
    if knew_pod:
        if isinstance(h, StaticHost):
            _manifest(Path(h.directory), "web-0", "uid-1")
        else:
            h.add({"metadata": {"namespace": "default", "name": "web-0", "uid": "uid-1"}})
    m = mgr(host=h)
    m.setup(POD)
    rec = store.get(POD)
    assert rec is not None and rec.host_known is knew_pod
    if isinstance(h, StaticHost) and knew_pod:
        (Path(h.directory) / "web-0.json").unlink()
    elif isinstance(h, FakeHost):
        h.pods.clear()
    assert run_gc(m, check_host=False).actions == [], "--no-host-check keeps every pod with a live netns"
    report = run_gc(m)
    assert (store.get(POD) is None) is torn_down, report.text()


def test_a_host_that_cannot_answer_keeps_the_pod_and_says_so(mgr: Any, store: StateStore, sc: Any) -> None:
    m = mgr(host=FakeHost({("default", "web-0"): {"metadata": {"name": "web-0", "namespace": "default"}}}))
    m.setup(POD)
    m.host = DownHost()
    report = run_gc(m)
    assert report.actions == [] and store.get(POD) is not None
    assert report.notes == [f"host lookup of {POD} failed, kept: connection refused"]
    assert teardowns(sc) == []


# --- failures ---------------------------------------------------------------------------------------------


def test_a_failing_teardown_keeps_the_record_and_fails_gc(mgr: Any, sc: Any, store: StateStore,
                                                          netns_dir: Path, cli: Any) -> None:
    m = mgr()
    netns(netns_dir)
    m.setup(POD)
    netns(netns_dir).unlink()
    sc.set("teardown", exit=3, stderr="device busy")
    r = cli("gc")
    assert r.returncode == 1, r.stderr
    assert "FAILED to tear down default/web-0 (infra infra0)" in r.stdout and "device busy" in r.stdout
    assert "gc: 1 pod(s) could not be torn down" in r.stderr and "Traceback" not in r.stderr
    rec = store.get(POD)
    assert rec is not None and rec.state == TEARING_DOWN
    sc.clear("teardown")
    r = cli("gc")
    assert r.returncode == 0 and "its teardown was interrupted" in r.stdout
    assert store.get(POD) is None


def test_gc_uses_the_plugin_that_set_the_pod_up(plugin_dir: Any, mgr: Any, store: StateStore,
                                                netns_dir: Path) -> None:
    other = plugin_dir.install("other")
    m_sc = mgr()
    m_other = mgr(plugin="other")
    netns(netns_dir)
    m_other.setup(POD)
    netns(netns_dir).unlink()
    report = run_gc(m_sc)  # configured with "sc", but "other" owns the pod's resources
    assert [a.outcome for a in report.actions] == ["done"]
    assert other.calls()[-1] == f"teardown {ARGV}"
    assert store.get(POD) is None


def test_a_recorded_plugin_that_is_gone_is_a_failure_not_a_crash(plugin_dir: Any, mgr: Any, store: StateStore,
                                                                 netns_dir: Path) -> None:
    gone = plugin_dir.install("gone")
    netns(netns_dir)
    mgr(plugin="gone").setup(POD)
    (gone.exe).unlink()
    netns(netns_dir).unlink()
    report = run_gc(mgr())
    [action] = report.failed
    assert "network plugin 'gone'" in (action.error or "")
    assert store.get(POD) is not None


# --- interrupted processes ----------------------------------------------------------------------------------


def test_gc_after_a_killed_setup_stops_its_orphans_and_tears_down(
    sc: Any, background: Any, cli: Any, store: StateStore, netns_dir: Path, np_dirs: dict[str, str]
) -> None:
    netns(netns_dir)
    sc.set("setup", spawn=2, sleep=1)
    p = background("setup", *ARGV.split())
    wait_for(lambda: (sc.dir / "children.pids").exists()
             and len((sc.dir / "children.pids").read_text().split()) == 2, "the plugin's children", WITHIN)
    children = [int(x) for x in (sc.dir / "children.pids").read_text().split()]
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert all(pid_alive(c) for c in children), "the plugin outlives a killed netplugin"
    rec = store.get(POD)
    assert rec is not None and rec.state == SETTING_UP

    assert cli("pods").stdout.splitlines()[1].split()[3] == "setup-interrupted"
    r = cli("-o", "json", "gc")
    assert r.returncode == 0, r.stderr
    [action] = json.loads(r.stdout)["actions"]
    assert action["reason"] == "its setup was interrupted"
    assert set(children) <= set(action["pids"])
    assert not any(pid_alive(c) for c in children)
    assert plugin_processes(np_dirs["state_dir"]) == []
    assert sc.calls()[-1] == f"teardown {ARGV}"
    assert store.get(POD) is None
    sc.clear("setup")
    assert cli("setup", *ARGV.split()).returncode == 0, "the same pod sets up again"


def test_orphans_of_a_pod_without_a_record_are_stopped(sc: Any, background: Any, cli: Any,
                                                       np_dirs: dict[str, str]) -> None:
    sc.set("teardown", spawn=1, sleep=30)
    p = background("teardown", *ARGV.split())
    pids_file = sc.dir / "children.pids"  # created by the redirection before the pid is written: wait for it
    wait_for(lambda: pids_file.exists() and pids_file.read_text().strip() != "", "the plugin's child", WITHIN)
    child = int((sc.dir / "children.pids").read_text().split()[0])
    p.send_signal(signal.SIGKILL)
    p.wait()
    leader = [x for x in plugin_processes(np_dirs["state_dir"]) if x.call_leader]
    assert len(leader) == 1 and leader[0].action == "teardown"
    # With its 30 s limit the orphaned teardown could run on; a short limit shows gc enforcing it.
    r = cli("--timeout", "0.5", "gc")
    assert r.returncode == 0, r.stderr
    assert "stopped orphaned plugin process(es)" in r.stdout and "of default/web-0 (infra infra0)" in r.stdout
    assert not pid_alive(child) and not pid_alive(leader[0].pid)
    assert plugin_processes(np_dirs["state_dir"]) == []


def test_gc_lets_a_detached_daemon_of_a_plugin_live(plugin_dir: Any, make_manager: Any, background: Any,
                                                    np_dirs: dict[str, str], cli_env_sc: dict[str, str],
                                                    reaper: list[int]) -> None:
    script = """#!/usr/bin/env bash
ctl=$(dirname "$0")
if [ "$1" = setup ]; then
    setsid bash -c 'echo $$ > "'"$ctl"'/daemon.pid"; exec sleep 300' </dev/null >/dev/null 2>&1 &
    sleep 1
fi
exit 0
"""
    d = plugin_dir.install("dm", script=script)
    p = subprocess.Popen([sys.executable, "-m", "netplugin", "--plugin", "dm", "setup", *ARGV.split()],
                         env=cli_env_sc, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    wait_for(lambda: (d.dir / "daemon.pid").exists() and (d.dir / "daemon.pid").read_text().strip() != "",
             "the daemon", WITHIN)
    daemon = int((d.dir / "daemon.pid").read_text())
    reaper.append(daemon)
    p.kill()
    p.wait()
    report = run_gc(make_manager(plugin="dm"))
    assert [a.reason for a in report.actions] == ["its setup was interrupted"]
    assert pid_alive(daemon), "a process that detached into its own session is not the call's leftover"
    assert daemon not in [x.pid for x in plugin_processes(np_dirs["state_dir"])]  # never a call process


def test_gc_never_overlaps_an_action_on_the_same_pod(sc: Any, background: Any, mgr: Any, netns_dir: Path,
                                                     store: StateStore) -> None:
    ns = netns(netns_dir)
    sc.set("setup", block=1)
    sc.set("teardown", block=0)
    p = background("setup", *ARGV.split())
    wait_for(lambda: any(e.startswith("start") for e in sc.events()), "the setup to start", WITHIN)
    ns.unlink()  # the pod goes away while its setup still runs
    m = mgr()
    dry = run_gc(m, dry_run=True)
    assert [(a.kind, a.outcome) for a in dry.actions] == [("skip", "skipped")], "a dry run does not wait"
    report = run_gc(m)  # waits for the setup, then sees the netns is gone
    assert p.wait() == 0
    assert [a.reason for a in report.actions] == [f"its network namespace {ns} is gone"]
    events = [e.split()[0] for e in sc.events()]
    assert events == ["start", "end", "start", "end"], "setup and gc's teardown ran one after the other"
    assert store.get(POD) is None


def test_gc_report_text_lists_every_action(mgr: Any, netns_dir: Path, np_dirs: dict[str, str]) -> None:
    m = mgr()
    for i in range(3):
        ref = PodRef("default", f"p{i}", f"id{i}")
        netns(netns_dir, ref)
        m.setup(ref)
        netns(netns_dir, ref).unlink()
    (Path(np_dirs["state_dir"]) / "pods" / "junk.json").write_text("{")
    text = run_gc(m).text().splitlines()
    assert text[0].startswith("set aside corrupt record ")
    assert sorted(line.split()[2] for line in text[1:4]) == ["default/p0", "default/p1", "default/p2"]
    assert text[-1] == "gc: 3 record(s) checked; tore down 3; 0 failed"
