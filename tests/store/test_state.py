"""Durable pod records (netplugin.store.state): what is on disk when, corrupt files, the `pods` command.

Real plugin processes (the scriptable test plugin, or small bash plugins that look at the state
dir while they run); "network namespaces" are plain files under a tmp dir via ``netns_template``.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from netplugin.core.errors import PluginFailed, StateError
from netplugin.core.names import MAX_INFRA_ID, PodRef
from netplugin.core.spares import SPARE_DIR
from netplugin.manager.manager import Manager
from netplugin.store.records import READY, SETTING_UP, TEARING_DOWN, PodRecord, parse_record, record_filename
from netplugin.store.state import StateStore
from tests.support.nettest import live_netns_file

POD = PodRef("default", "web-0", "infra0")

# A plugin that copies every record it can see into the control dir while it runs, so a test can
# tell what was on disk at that moment.
PEEK = """#!/usr/bin/env bash
ctl=$(dirname "$0")
printf '%s\\n' "$*" >> "$ctl/calls.log"
for f in "$NETPLUGIN_STATE_DIR"/pods/*.json; do
    [ -e "$f" ] && cat "$f" > "$ctl/$1.seen"
done
[ -f "$ctl/$1.exit" ] && exit "$(cat "$ctl/$1.exit")"
exit 0
"""


@pytest.fixture
def cli(run_cli: Any, netns_dir: Path, sc: Any, sc_env: dict[str, str]) -> Callable[..., Any]:
    def run(*args: str) -> Any:
        return run_cli(*args, env={**sc_env, "NETPLUGIN_NETNS_TEMPLATE": str(netns_dir / "{infra_id}")})

    return run


def make_netns(netns_dir: Path, ref: PodRef) -> str:
    p = netns_dir / ref.infra_id
    live_netns_file(p)
    return str(p)


def pods_dir(np_dirs: dict[str, str]) -> Path:
    return Path(np_dirs["state_dir"]) / "pods"


# --- the record's life -------------------------------------------------------------------------------


def test_setup_writes_a_ready_record_with_every_field(mgr: Any, store: StateStore, netns_dir: Path,
                                                      np_dirs: dict[str, str]) -> None:
    netns = make_netns(netns_dir, POD)
    m = mgr()
    m.setup(POD)
    path = pods_dir(np_dirs) / record_filename(POD)
    text = path.read_text()
    assert text.count("\n") > 10, "records are indented, human-readable JSON"
    doc = json.loads(text)
    assert doc["version"] == 1 and doc["kind"] == "NetpluginPodRecord"
    assert (doc["namespace"], doc["name"], doc["infra_id"]) == ("default", "web-0", "infra0")
    assert doc["plugin"] == "sc" and doc["plugin_version"] == m.plugin.version()
    assert doc["netns"] == netns and doc["netns_existed"] is True and doc["host_known"] is False
    assert doc["state"] == READY and doc["ip"] is None
    assert doc["ready_at"] is not None and doc["created"] <= doc["updated"]
    assert doc["owner"]["pid"] == os.getpid()
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert sorted(os.listdir(path.parent)) == sorted([path.name, SPARE_DIR]), "no temp files are left behind"
    rec = store.get(POD)
    assert rec is not None and rec.state == READY and rec.ref == POD


@pytest.mark.parametrize(
    ("action", "state_while_running"),
    [("setup", SETTING_UP), ("teardown", TEARING_DOWN)],
)
def test_record_is_on_disk_before_the_plugin_runs(plugin_dir: Any, make_manager: Any, action: str,
                                                  state_while_running: str) -> None:
    p = plugin_dir.install("peek", script=PEEK)
    m = make_manager(plugin="peek")
    m.setup(POD)
    if action == "teardown":
        m.teardown(POD)
    seen = json.loads((p.dir / f"{action}.seen").read_text())
    assert seen["state"] == state_while_running
    assert seen["infra_id"] == POD.infra_id


def test_status_records_the_ip_and_writes_only_when_it_changes(mgr: Any, sc: Any, store: StateStore) -> None:
    m = mgr()
    m.setup(POD)
    assert sc.calls() == ["init", "setup default web-0 infra0"], "no status exec on the setup path by default"
    sc.set("status", stdout=json.dumps({"ip": "10.9.8.7"}))
    assert m.status(POD) is not None
    rec = store.get(POD)
    assert rec is not None and rec.ip == "10.9.8.7"
    before = os.stat(rec.path)
    m.status(POD)
    after = os.stat(rec.path)
    assert (before.st_ino, before.st_mtime_ns) == (after.st_ino, after.st_mtime_ns), "same IP: no write"
    sc.set("status", stdout=json.dumps({"ip": "10.9.8.8"}))
    m.status(POD)
    rec = store.get(POD)
    assert rec is not None and rec.ip == "10.9.8.8"


def test_record_status_option_runs_status_right_after_setup(mgr: Any, sc: Any, store: StateStore) -> None:
    sc.set("status", stdout=json.dumps({"ip": "10.1.1.1"}))
    m = mgr()
    assert m.state is not None
    m.state.record_status = True
    result = m.setup(POD)
    assert result is not None and result.ip == "10.1.1.1"
    assert sc.calls() == ["init", "setup default web-0 infra0", "status default web-0 infra0"]
    rec = store.get(POD)
    assert rec is not None and rec.ip == "10.1.1.1"


def test_status_failure_after_setup_does_not_undo_it(mgr: Any, sc: Any, store: StateStore) -> None:
    sc.set("status", stdout="not json")
    m = mgr()
    assert m.state is not None
    m.state.record_status = True
    assert m.setup(POD) is None
    rec = store.get(POD)
    assert rec is not None and rec.state == READY and rec.ip is None


def test_teardown_removes_the_record_only_after_the_plugin_succeeded(mgr: Any, sc: Any, store: StateStore) -> None:
    m = mgr()
    m.setup(POD)
    sc.set("teardown", exit=1, stderr="cannot delete veth")
    with pytest.raises(PluginFailed, match="cannot delete veth"):
        m.teardown(POD)
    rec = store.get(POD)
    assert rec is not None and rec.state == TEARING_DOWN
    sc.clear("teardown")
    m.teardown(POD)
    assert store.get(POD) is None


@pytest.mark.parametrize("teardown_exit", [0, 1])
def test_teardown_without_a_record_still_calls_the_plugin(mgr: Any, sc: Any, store: StateStore,
                                                          teardown_exit: int) -> None:
    sc.set("teardown", exit=teardown_exit)
    m = mgr()
    if teardown_exit:
        with pytest.raises(PluginFailed):
            m.teardown(POD)
    else:
        m.teardown(POD)
    assert sc.calls()[-1] == "teardown default web-0 infra0"
    assert store.get(POD) is None, "a teardown never creates a record"


@pytest.mark.parametrize(
    ("setup_exit", "teardown_exit", "rollback", "expect_state"),
    [
        pytest.param(1, 0, True, None, id="rolled-back"),
        pytest.param(1, 1, True, SETTING_UP, id="rollback-failed"),
        pytest.param(1, 0, False, SETTING_UP, id="rollback-disabled"),
    ],
)
def test_failed_setup_leaves_no_record_unless_it_could_not_be_undone(
    mgr: Any, sc: Any, store: StateStore, setup_exit: int, teardown_exit: int, rollback: bool,
    expect_state: str | None,
) -> None:
    sc.set("setup", exit=setup_exit)
    sc.set("teardown", exit=teardown_exit)
    with pytest.raises(PluginFailed):
        mgr(rollback_on_failure=rollback).setup(POD)
    rec = store.get(POD)
    assert (rec.state if rec else None) == expect_state


def test_a_recreated_pod_has_a_record_per_infra_id(mgr: Any, store: StateStore) -> None:
    old, new = POD, PodRef(POD.namespace, POD.name, "infra1")
    m = mgr()
    m.setup(old)
    m.setup(new)
    assert sorted(r.ref.infra_id for r in store.scan().records) == ["infra0", "infra1"]
    m.teardown(old)
    assert [r.ref for r in store.scan().records] == [new]


def test_state_false_keeps_no_records(make_manager: Any, sc: Any, np_dirs: dict[str, str]) -> None:
    from netplugin.core.config import load_config

    cfg = load_config(np_dirs["config"], environ={}, overrides={
        "plugin_dir": str(sc.dir.parent), "state_dir": np_dirs["state_dir"], "run_dir": np_dirs["run_dir"],
        "plugin": "sc"})
    m = Manager(cfg, state=False)
    m.setup(POD)
    m.teardown(POD)
    assert m.state is None
    assert not pods_dir(np_dirs).exists()
    assert sc.calls() == ["init", "setup default web-0 infra0", "teardown default web-0 infra0"]


def test_setup_of_the_same_pod_again_keeps_its_creation_time(mgr: Any, store: StateStore) -> None:
    m = mgr()
    m.setup(POD)
    first = store.get(POD)
    m.setup(POD)
    again = store.get(POD)
    assert first is not None and again is not None
    assert again.created == first.created and again.state == READY


def test_parallel_setups_of_different_pods_all_get_records(mgr: Any, store: StateStore) -> None:
    m = mgr()
    refs = [PodRef("ns", f"pod-{i}", f"id{i}") for i in range(12)]
    errors: list[BaseException] = []

    def work(ref: PodRef) -> None:
        try:
            m.setup(ref)
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(r,)) for r in refs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    scan = store.scan()
    assert sorted(r.ref.name for r in scan.records) == sorted(r.name for r in refs)
    assert scan.corrupt == [] and scan.stale_temps == []


# --- file names ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ref",
    [
        POD,
        PodRef("a" * 63, "b" * 253, "c" * MAX_INFRA_ID),
        PodRef("ns", "x." + "y" * 200, "id_with.dots-and_underscores"),
    ],
    ids=["short", "longest", "long-name"],
)
def test_record_file_names_are_unique_short_and_round_trip(mgr: Any, store: StateStore, ref: PodRef) -> None:
    name = record_filename(ref)
    assert len(name) <= 200 and "/" not in name
    m = mgr()
    m.setup(ref)
    rec = store.get(ref)
    assert rec is not None and rec.ref == ref and os.path.basename(rec.path) == name
    other = PodRef(ref.namespace, ref.name, ref.infra_id[:-1] + ("x" if ref.infra_id[-1] != "x" else "y"))
    assert record_filename(other) != name


# --- corrupt files ------------------------------------------------------------------------------------


def _valid_doc(ref: PodRef = POD) -> dict[str, Any]:
    return {
        "version": 1, "kind": "NetpluginPodRecord", "namespace": ref.namespace, "name": ref.name,
        "infra_id": ref.infra_id, "uid": None, "plugin": "sc", "plugin_version": "sha256:00", "netns": "/x",
        "netns_existed": True, "host_known": False, "state": "ready", "ip": None, "created": "2024-01-01T00:00:00.000Z",
        "updated": "2024-01-01T00:00:00.000Z", "ready_at": None,
        "owner": {"pid": 1, "start": 1, "boot_id": "b"},
    }


def _with(**changes: Any) -> bytes:
    doc = _valid_doc()
    for k, v in changes.items():
        if v is KeyError:
            del doc[k]
        else:
            doc[k] = v
    return json.dumps(doc).encode()


CORRUPT: dict[str, tuple[bytes, str]] = {
    "truncated": (json.dumps(_valid_doc()).encode()[:70], "not valid JSON"),
    "empty": (b"", "empty file"),
    "binary": (b"\xff\xfe\x00garbage\x80", "not valid JSON"),
    "not-an-object": (b"[1, 2, 3]", "must be a JSON object"),
    "unknown-version": (_with(version=2), "unknown version 2"),
    "version-is-a-string": (_with(version="1"), "unknown version"),
    "wrong-kind": (_with(kind="Pod"), "kind must be"),
    "namespace-not-a-string": (_with(namespace=7), "field 'namespace' must be str"),
    "invalid-namespace": (_with(namespace="Bad_NS"), "invalid namespace"),
    "missing-plugin": (_with(plugin=KeyError), "missing field 'plugin'"),
    "bad-state": (_with(state="half-done"), "field 'state' must be one of"),
    "bad-ip": (_with(ip="10.0.0.300"), "not an IP address"),
    "bad-time": (_with(created="yesterday"), "not an ISO 8601 time"),
    "bool-pid": (_with(owner={"pid": True, "start": 1, "boot_id": "b"}), "owner: field 'pid' must be int"),
    "netns-existed-not-bool": (_with(netns_existed="yes"), "field 'netns_existed' must be bool"),
    "missing-host-known": (_with(host_known=KeyError), "missing field 'host_known'"),
    "deeply-nested": (b"[" * 20000 + b"]" * 20000, "not valid JSON"),
    "too-large": (b" " * 70000 + json.dumps(_valid_doc()).encode(), "larger than"),
}


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_corrupt_file_is_reported_and_set_aside_and_never_breaks_commands(
    case: str, cli: Any, mgr: Any, np_dirs: dict[str, str]
) -> None:
    data, reason = CORRUPT[case]
    good = PodRef("default", "good", "g1")
    mgr().setup(good)
    bad_path = pods_dir(np_dirs) / record_filename(POD)
    bad_path.write_bytes(data)

    with pytest.raises(StateError) as err:
        parse_record(data, str(bad_path))
    assert reason in err.value.reason and str(bad_path) in err.value.message

    r = cli("pods")
    assert r.returncode == 0, r.stderr
    assert "good" in r.stdout and "web-0" not in r.stdout
    assert str(bad_path) in r.stderr and reason in r.stderr and "Traceback" not in r.stderr

    r = cli("-o", "json", "pods")
    doc = json.loads(r.stdout)
    assert [p["name"] for p in doc["pods"]] == ["good"]
    assert doc["corrupt"][0]["path"] == str(bad_path) and reason in doc["corrupt"][0]["reason"]

    r = cli("gc")
    assert r.returncode == 0, r.stderr
    assert f"set aside corrupt record {bad_path}" in r.stdout
    assert not bad_path.exists()
    aside = sorted((pods_dir(np_dirs) / "corrupt").iterdir())
    assert len(aside) == 2 and aside[0].read_bytes() == data
    assert reason in aside[1].read_text() and aside[1].name.endswith(".reason")
    # `pods` also names the retired host veths of the whole netns, which this test shares with
    # whatever else runs on the machine: only the records' warnings are this test's
    left = [line for line in cli("pods").stderr.splitlines() if "not deleted by the kernel yet" not in line]
    assert left == [], "nothing left to warn about"


@pytest.mark.parametrize("kind", ["directory", "symlink", "fifo", "other-pods-content"])
def test_odd_files_in_the_records_dir_are_corrupt_not_fatal(kind: str, store: StateStore,
                                                            np_dirs: dict[str, str], tmp_path: Path) -> None:
    d = pods_dir(np_dirs)
    d.mkdir(parents=True, exist_ok=True)
    path = d / record_filename(POD)
    target = tmp_path / "target.json"
    target.write_bytes(json.dumps(_valid_doc()).encode())
    if kind == "directory":
        path.mkdir()
    elif kind == "symlink":
        path.symlink_to(target)
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        # a valid record of another pod under this pod's name: it would alias
        path.write_bytes(json.dumps(_valid_doc(PodRef("other", "pod", "x"))).encode())
    scan = store.scan()
    assert scan.records == [] and [c.path for c in scan.corrupt] == [str(path)]
    with pytest.raises(StateError):
        store.get(POD)
    store.set_aside(str(path), scan.corrupt[0].reason)
    assert not os.path.lexists(path) and store.scan().corrupt == []


@pytest.mark.parametrize("action", ["setup", "teardown"])
def test_a_corrupt_record_of_the_pod_itself_does_not_stop_its_actions(
    action: str, mgr: Any, sc: Any, store: StateStore, np_dirs: dict[str, str]
) -> None:
    d = pods_dir(np_dirs)
    d.mkdir(parents=True)
    (d / record_filename(POD)).write_bytes(b'{"version": 1, "kind": "Netplug')
    getattr(mgr(), action)(POD)
    assert sc.calls()[-1] == f"{action} default web-0 infra0"
    rec = store.get(POD)
    assert (rec.state if rec else None) == (READY if action == "setup" else None)
    assert len(list((d / "corrupt").glob("*.reason"))) == 1


def test_stale_temp_files_are_found_and_removed_live_ones_kept(store: StateStore, np_dirs: dict[str, str],
                                                               cli: Any) -> None:
    d = pods_dir(np_dirs)
    d.mkdir(parents=True)
    dead_pid = 2**22 + 17  # above pid_max's default range: no such process
    stale = d / f"{record_filename(POD)}.tmp.{dead_pid}.1"
    live = d / f"{record_filename(POD)}.tmp.{os.getpid()}.1"
    stale.write_bytes(b"{")
    live.write_bytes(b"{")
    assert store.scan().stale_temps == [str(stale)]
    r = cli("gc")
    assert r.returncode == 0 and f"removed {stale}" in r.stdout
    assert not stale.exists() and live.exists()


def test_parse_round_trips_a_record(mgr: Any, store: StateStore) -> None:
    mgr().setup(POD)
    rec = store.get(POD)
    assert rec is not None
    again: PodRecord = parse_record(rec.encode(), rec.path)
    assert again == rec and again.to_dict() == rec.to_dict()


# --- netplugin pods --------------------------------------------------------------------------------------


def test_pods_command_lists_records_as_a_table_and_as_json(cli: Any, sc: Any, netns_dir: Path,
                                                           sc_env: dict[str, str]) -> None:
    names = sc_env["NETPLUGIN_PLUGINS"].split(",")
    plugin = names[0] if len(names) == 1 else ",".join(f"{n}:ready" for n in names)  # a chain: each member
    assert cli("pods").stdout == "No pods\n"
    assert json.loads(cli("-o", "json", "pods").stdout) == {"pods": [], "corrupt": [], "deleting": []}
    sc.set("status", stdout=json.dumps({"ip": "10.0.0.5"}))
    for ref in (POD, PodRef("kube-system", "dns", "infra9")):
        make_netns(netns_dir, ref)
        assert cli("setup", ref.namespace, ref.name, ref.infra_id).returncode == 0
    assert cli("status", *("default", "web-0", "infra0")).stdout.strip() == "10.0.0.5"
    lines = cli("pods").stdout.splitlines()
    assert lines[0].split() == ["NAMESPACE", "NAME", "INFRA-ID", "STATE", "IP", "PLUGIN", "UPDATED"]
    rows = sorted(line.split()[:6] for line in lines[1:])
    assert rows == [["default", "web-0", "infra0", "ready", "10.0.0.5", plugin],
                    ["kube-system", "dns", "infra9", "ready", "-", plugin]]
    doc = json.loads(cli("-o", "json", "pods").stdout)
    by_name = {p["name"]: p for p in doc["pods"]}
    assert by_name["web-0"]["ip"] == "10.0.0.5" and by_name["web-0"]["condition"] == "ready"
    assert by_name["dns"]["namespace"] == "kube-system" and by_name["dns"]["path"].endswith(".json")


def test_pods_command_tells_a_failed_rollback(cli: Any, mgr: Any, sc: Any) -> None:
    sc.set("setup", exit=1)
    sc.set("teardown", exit=1)
    with pytest.raises(PluginFailed):
        mgr().setup(POD)
    row = cli("pods").stdout.splitlines()[1].split()
    assert row[:4] == ["default", "web-0", "infra0", "rollback-failed"]
