"""Plugin chains: order, reverse rollback from each position, timeouts, rollback failures, the action
mask, state passed along, per-member progress in the pod record, and kills between members then gc.

Members are real exec plugins (the scriptable test plugin, one copy per member) that append to one
shared log, so the ORDER of calls across members is what the tests read.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from netplugin.core.config import load_config
from netplugin.core.errors import ChainInvalid, ConfigError, PluginFailed, PluginOutputError, PluginTimeout
from netplugin.core.names import PodRef
from netplugin.manager.gc import run_gc
from netplugin.manager.manager import Manager
from netplugin.store.records import READY, SETTING_UP, TEARING_DOWN
from netplugin.store.state import StateStore
from tests.support.nettest import live_netns_file
from tests.support.podveth import pod_veth
from tests.support.waits import WITHIN, wait_for

POD = PodRef("default", "web-0", "infra0")
ARGV = "default web-0 infra0"


@dataclass
class Chain:
    """n scriptable members m1..mn in one exec dir, and the shared log of their calls."""

    members: list[Any]
    log: Path
    make: Callable[..., Manager]

    @property
    def names(self) -> list[str]:
        return [m.name for m in self.members]

    def calls(self, *actions: str) -> list[str]:
        """'<member> <action>' per call, in order (only the given actions when named)."""
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        out = [" ".join(line.split()[:2]) for line in lines]
        return [c for c in out if not actions or c.split()[1] in actions]

    def member(self, i: int) -> Any:
        return self.members[i - 1]


@pytest.fixture
def chain(plugin_dir: Any, make_manager: Any, netns_dir: Path, tmp_path: Path) -> Callable[[int], Chain]:
    """chain(n) -> n members installed; chain.make(**config) builds a Manager running them."""

    def build(n: int) -> Chain:
        members = [plugin_dir.install(f"m{i}") for i in range(1, n + 1)]
        log = tmp_path / "chain.log"
        live_netns_file(netns_dir / POD.infra_id)

        def make(**kw: Any) -> Manager:
            kw.setdefault("plugins", [m.name for m in members])
            kw.setdefault("env", {"NETPLUGIN_TEST_LOG": str(log)})
            m: Manager = make_manager(netns_template=str(netns_dir / "{infra_id}"), **kw)
            return m

        return Chain(members, log, make)

    return build


def reversed_names(names: list[str], action: str) -> list[str]:
    return [f"{n} {action}" for n in reversed(names)]


# --- chains of 1, 2 and 3 keep every guarantee of one plugin -----------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3])
def test_setup_in_order_teardown_in_reverse_init_once_and_idempotent(chain: Any, store: StateStore, n: int) -> None:
    c = chain(n)
    m = c.make()
    m.setup(POD)
    assert c.calls() == [f"{x} init" for x in c.names] + [f"{x} setup" for x in c.names]
    rec = store.get(POD)
    assert rec is not None and rec.state == READY
    assert [(s.plugin, s.state) for s in rec.chain] == [(x, READY) for x in c.names]
    c.make().setup(POD)  # a second Manager, a second setup: no init again (one per boot and version)
    assert c.calls("init") == [f"{x} init" for x in c.names]
    c.log.unlink()
    m.teardown(POD)
    m.teardown(POD)  # idempotent: no record any more, every member still asked
    assert c.calls() == reversed_names(c.names, "teardown") * 2
    assert store.get(POD) is None


# --- failure at each position: rollback of k .. 1 in reverse, later members never run -----------------------


@pytest.mark.parametrize(("n", "k"), [(1, 1), (2, 1), (2, 2), (3, 1), (3, 2), (3, 3)])
def test_a_failed_member_rolls_back_itself_and_the_members_before_it(
    chain: Any, store: StateStore, n: int, k: int
) -> None:
    c = chain(n)
    c.member(k).set("setup", exit=3, stderr=f"member {k} broke")
    with pytest.raises(PluginFailed) as info:
        c.make().setup(POD)
    err = info.value
    assert err.plugin == f"m{k}" and f"member {k} broke" in err.message
    assert err.details["rolled_back"] is True
    ran = c.names[:k]
    assert c.calls("setup", "teardown") == [f"{x} setup" for x in ran] + reversed_names(ran, "teardown")
    if n > 1:
        assert (err.details["chain"], err.details["member"]) == (c.names, k)
    assert store.get(POD) is None


def test_a_timeout_in_the_middle_rolls_back_and_names_the_member(chain: Any, store: StateStore) -> None:
    c = chain(3)
    c.member(2).set("setup", sleep=30)
    with pytest.raises(PluginTimeout) as info:
        c.make(timeout=1.5).setup(POD)
    assert info.value.plugin == "m2" and "timed out" in info.value.message
    assert c.calls("setup", "teardown") == ["m1 setup", "m2 setup", "m2 teardown", "m1 teardown"]
    assert store.get(POD) is None


def test_the_time_limit_covers_the_whole_chain(chain: Any) -> None:
    c = chain(3)
    for i in (1, 2):
        c.member(i).set("setup", sleep=0.8)
    with pytest.raises(PluginTimeout) as info:
        c.make(timeout=1.2).setup(POD)
    assert info.value.plugin == "m2"  # m2 got what m1 left of the 1.2 s, not 1.2 s of its own
    assert "m3 setup" not in c.calls()


# --- rollback and teardown failures: every one reported, the record keeps what is owed ----------------------


def test_rollback_failures_are_all_reported_and_gc_finishes_them(chain: Any, store: StateStore) -> None:
    c = chain(3)
    c.member(3).set("setup", exit=1, stderr="m3 setup broke")
    c.member(2).set("teardown", exit=2, stderr="m2 teardown broke")
    m = c.make()
    with pytest.raises(PluginFailed) as info:
        m.setup(POD)
    err = info.value
    assert err.plugin == "m3" and "m3 setup broke" in err.message and "m2 teardown broke" in err.message
    assert "m2 teardown broke" in err.details["rollback_error"] and "rolled_back" not in err.details
    assert [f["plugin"] for f in err.details["chain_failures"]] == ["m2"]
    assert c.calls("teardown") == ["m3 teardown", "m2 teardown", "m1 teardown"]  # m1 despite m2
    rec = store.get(POD)
    assert rec is not None and rec.state == SETTING_UP
    assert [s.ran for s in rec.chain] == [False, True, False]  # only m2 still owes its teardown

    c.member(2).clear("teardown")
    c.log.unlink()
    report = run_gc(m)
    assert [a.outcome for a in report.actions] == ["done"]
    assert c.calls("teardown") == ["m2 teardown"]  # exactly the member that still ran
    assert store.get(POD) is None


def test_teardown_goes_on_past_failures_and_reports_each(chain: Any, store: StateStore) -> None:
    c = chain(3)
    m = c.make()
    m.setup(POD)
    c.member(3).set("teardown", exit=1, stderr="m3 says no")
    c.member(1).set("teardown", exit=1, stderr="m1 says no")
    with pytest.raises(PluginFailed) as info:
        m.teardown(POD)
    assert "m3 says no" in info.value.message and "m1 says no" in info.value.message
    assert c.calls("teardown") == ["m3 teardown", "m2 teardown", "m1 teardown"]
    rec = store.get(POD)
    assert rec is not None and rec.state == TEARING_DOWN
    assert [s.ran for s in rec.chain] == [True, False, True]
    for i in (1, 3):
        c.member(i).clear("teardown")
    m.teardown(POD)
    assert store.get(POD) is None


# --- the action mask ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mask", "setup_calls", "status_from"),
    [
        pytest.param(None, ["m1", "m2", "m3"], "m2", id="no-mask-all-actions"),
        pytest.param(["status"], ["m1", "m3"], "m2", id="status-only"),
        pytest.param(["setup", "teardown"], ["m1", "m2", "m3"], "m3", id="no-status"),
        pytest.param([], ["m1", "m3"], "m3", id="nothing"),
    ],
)
def test_the_action_mask_decides_which_actions_a_member_gets(
    chain: Any, mask: list[str] | None, setup_calls: list[str], status_from: str
) -> None:
    c = chain(3)
    if mask is not None:
        c.member(2).set("init", stdout=json.dumps({"actions": mask}))
    c.member(2).set("status", stdout='{"ip": "10.1.0.2"}')
    c.member(3).set("status", stdout='{"ip": "10.1.0.3"}')
    m = c.make()
    m.setup(POD)
    assert c.calls("setup") == [f"{x} setup" for x in setup_calls]
    status = c.make().status(POD)  # a new Manager reads the mask back from the init marker
    assert status is not None and status.ip == {"m2": "10.1.0.2", "m3": "10.1.0.3"}[status_from]
    m.teardown(POD)
    handles_teardown = mask is None or "teardown" in mask
    assert ("m2 teardown" in c.calls("teardown")) == handles_teardown


@pytest.mark.parametrize(
    ("stdout", "words"),
    [
        ('{"actions": ["setup"]}', "has setup but not teardown"),
        ('{"actions": ["setup", "teardown", "check"]}', "unknown action"),
        ('{"actions": "setup"}', '{"actions": [...]}'),
        ("ready!", "not JSON"),
    ],
)
def test_a_bad_mask_fails_init_naming_the_member(chain: Any, stdout: str, words: str) -> None:
    c = chain(2)
    c.member(2).set("init", stdout=stdout)
    with pytest.raises(PluginOutputError) as info:
        c.make().setup(POD)
    assert info.value.plugin == "m2" and words in info.value.message
    assert c.calls("setup") == []


# --- durability: only intents are synced ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "m2_mask", "setup_passes"),
    [
        pytest.param(1, None, 1, id="one-member-one-durable-write"),
        pytest.param(2, None, 2, id="two-members"),
        pytest.param(3, None, 3, id="three-members"),
        pytest.param(3, ["status"], 2, id="three-members-m2-skips-setup"),
    ],
)
def test_a_pod_action_syncs_only_its_intents(
    chain: Any, store: StateStore, monkeypatch: pytest.MonkeyPatch, n: int, m2_mask: list[str] | None, setup_passes: int
) -> None:
    """begin and each later member's start are durable (group commit); nothing else is synced."""
    import os

    from netplugin.store import commit

    c = chain(n)
    if m2_mask is not None:
        c.member(2).set("init", stdout=json.dumps({"actions": m2_mask}))
    m = c.make()
    m.init()  # init markers are not the pod action's writes
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    passes = commit._COMMIT.passes
    m.setup(POD)
    assert commit._COMMIT.passes - passes == setup_passes
    record, pods = store.path_for(POD), store.dir
    assert synced == [record, pods] * setup_passes  # the record and its directory, once per intent
    synced.clear()
    m.teardown(POD)
    assert store.get(POD) is None and synced == []  # teardown: progress and removal unsynced
    c.member(n).set("setup", exit=1)
    with pytest.raises(PluginFailed):
        m.setup(POD)
    assert store.get(POD) is None and len(synced) == 2 * setup_passes  # the rollback syncs nothing more


# --- state passed along --------------------------------------------------------------------------------------


@pytest.mark.kernel
def test_what_a_member_reports_reaches_later_members_and_their_teardown(chain: Any, store: StateStore) -> None:
    with pod_veth() as pv:
        _reports_reach_later_members(chain, pv)


def _reports_reach_later_members(chain: Any, pv: Any) -> None:
    c = chain(3)
    doc = {"kind": "PodNetworkStatus", "ip": "10.1.2.3", "hostInterface": pv.host}
    c.member(1).set("setup", stdout=json.dumps(doc))  # a veth into the pod's netns: passed on
    c.member(2).set("setup", stdout="no JSON here: progress text is not parsed\n")
    m = c.make()
    status = m.setup(POD, call=_want_status(netns=pv.netns))
    assert status is not None and (status.ip, status.host_interface) == ("10.1.2.3", pv.host)
    assert "m1 status" not in c.calls()  # setup reported it: no second exec
    for i, action in [(2, "setup"), (3, "setup"), (3, "teardown"), (2, "teardown")]:
        if action == "teardown" and i == 3:
            m.teardown(POD, call=_want_status(netns=pv.netns, want_status=False))
        env = c.member(i).env_of(action)
        assert (env["NETPLUGIN_CHAIN"], env["NETPLUGIN_CHAIN_INDEX"]) == ("m1,m2,m3", str(i))
        assert (env["NETPLUGIN_PREV_IPS"], env["NETPLUGIN_PREV_HOST_INTERFACE"]) == ("10.1.2.3", pv.host)
        prev = json.loads(env["NETPLUGIN_PREV_RESULT"])
        assert prev["ips"] == ["10.1.2.3"] and prev["netns"] == pv.netns
        assert [x["plugin"] for x in prev["members"]] == ["m1"]
    first = c.member(1).env_of("teardown")
    assert (first["NETPLUGIN_CHAIN_INDEX"], first["NETPLUGIN_PREV_IPS"]) == ("1", "")


def test_a_bad_setup_document_fails_that_member(chain: Any) -> None:
    c = chain(2)
    # the setup document (kind PodNetworkStatus) with a host interface no later member can use
    c.member(1).set("setup", stdout='{"kind": "PodNetworkStatus", "ip": "10.1.2.3", "hostInterface": "a/b"}')
    with pytest.raises(PluginOutputError) as info:
        c.make().setup(POD)
    assert info.value.plugin == "m1" and "hostInterface" in info.value.message
    assert c.calls("setup", "teardown") == ["m1 setup", "m1 teardown"]


def _want_status(**kw: Any) -> Any:
    from netplugin.manager.manager import CallOptions

    return CallOptions(**{"want_status": True, **kw})


# --- selection and config ------------------------------------------------------------------------------------


def test_an_invalid_member_invalidates_the_chain_naming_every_bad_one(chain: Any, plugin_dir: Any) -> None:
    c = chain(1)
    plugin_dir.install("loose", mode=0o777)
    with pytest.raises(ChainInvalid) as info:
        c.make(plugins=["m1", "missing", "loose", "netplugin.io/bridge"]).setup(POD)
    msg = info.value.message
    assert "'missing'" in msg and "not found" in msg and "'loose'" in msg and "writable" in msg
    assert "'m1'" not in msg.split("invalid:")[1] and "bridge'" not in msg.split("invalid:")[1]
    assert c.calls() == []


@pytest.mark.parametrize(
    ("file", "env", "flags", "chain_"),
    [
        ("plugins: [a, b]\n", {}, {}, ("a", "b")),
        ("plugin: a\n", {}, {}, ("a",)),
        ("plugins: [a, b]\n", {}, {"plugin": "c"}, ("c",)),
        ("plugin: a\n", {"NETPLUGIN_PLUGINS": "b, netplugin.io/bridge"}, {}, ("b", "netplugin.io/bridge")),
        ("", {}, {}, ()),
    ],
)
def test_plugins_and_plugin_name_the_chain_and_the_higher_source_wins(
    tmp_path: Path, file: str, env: dict[str, str], flags: dict[str, str], chain_: tuple[str, ...]
) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(file)
    assert load_config(str(f), environ=env, overrides=flags).chain == chain_


@pytest.mark.parametrize(
    ("file", "words"),
    [
        ("plugin: a\nplugins: [b]\n", "not both"),
        ("plugins: [a, a]\n", "member 2 'a': listed twice"),
        ("plugins: [a, -bad, 7]\n", "member 2 '-bad'"),
        ("plugins: {a: 1}\n", "must be a list"),
    ],
)
def test_a_bad_chain_in_the_config_names_the_key_and_members(tmp_path: Path, file: str, words: str) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(file)
    with pytest.raises(ConfigError) as info:
        load_config(str(f), environ={})
    assert "plugins" in info.value.message and words in info.value.message
    if "-bad" in file:
        assert "member 3 7" in info.value.message  # every bad member, not only the first


# --- crash safety: SIGKILL between members and inside one, then gc -----------------------------------------


def _spawn(cli_env: dict[str, str], c: Chain, netns_dir: Path) -> subprocess.Popen[bytes]:
    env = dict(cli_env, NETPLUGIN_PLUGINS=",".join(c.names), NETPLUGIN_NETNS_TEMPLATE=str(netns_dir / "{infra_id}"))
    Path(env["NETPLUGIN_CONFIG"]).write_text(f"env:\n  NETPLUGIN_TEST_LOG: {c.log}\n")
    return subprocess.Popen([sys.executable, "-m", "netplugin", "setup", *ARGV.split()], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.mark.parametrize(
    ("where", "ran"),
    [
        pytest.param("after-1", ["m1"], id="between-m1-and-m2"),
        pytest.param("after-2", ["m1", "m2"], id="between-m2-and-m3"),
        pytest.param("inside-2", ["m1", "m2"], id="inside-m2"),
        pytest.param("inside-3", ["m1", "m2", "m3"], id="inside-m3"),
    ],
)
def test_a_kill_between_or_inside_members_then_gc_tears_down_exactly_those_that_ran(
    chain: Any, cli_env: dict[str, str], netns_dir: Path, store: StateStore, where: str, ran: list[str]
) -> None:
    c = chain(3)
    kind, k = where.split("-")
    if kind == "after":
        c.member(int(k)).set("setup", stop_parent=1)  # the caller stops as member k exits
    else:
        c.member(int(k)).set("setup", block=30)
    p = _spawn(cli_env, c, netns_dir)
    try:
        if kind == "after":
            wait_for(lambda: psutil.Process(p.pid).status() == psutil.STATUS_STOPPED, "the stopped caller", WITHIN)
        else:
            wait_for(lambda: (c.member(int(k)).dir / "events.log").exists(), f"m{k} running", WITHIN)
        p.send_signal(signal.SIGKILL)
        p.wait()
    finally:
        if p.poll() is None:
            p.kill()
        p.communicate()
    rec = store.get(POD)
    assert rec is not None and rec.state == SETTING_UP
    for i in (1, 2, 3):
        c.member(i).clear("setup")
    c.log.unlink()
    report = run_gc(c.make(timeout=2))
    assert [a.reason for a in report.actions if a.kind == "teardown"] == ["its setup was interrupted"]
    assert c.calls("teardown") == reversed_names(ran, "teardown")
    assert "m3 setup" not in c.calls()
    assert store.get(POD) is None


# --- the listing shows the chain and each member's state ----------------------------------------------------


def test_netplugin_pods_shows_each_member_and_its_state(chain: Any, run_cli: Any, netns_dir: Path) -> None:
    c = chain(3)
    c.member(3).set("setup", exit=1)
    c.member(2).set("teardown", exit=1)
    env = {"NETPLUGIN_PLUGINS": "m1,m2,m3", "NETPLUGIN_NETNS_TEMPLATE": str(netns_dir / "{infra_id}")}
    assert run_cli("setup", *ARGV.split(), env=env).returncode != 0
    table = run_cli("pods", env=env).stdout.splitlines()
    assert table[1].split()[3] == "rollback-failed"  # the setup failed, and its rollback too
    assert table[1].split()[5] == "m1:torn-down,m2:ready,m3:torn-down"
    [pod] = json.loads(run_cli("-o", "json", "pods", env=env).stdout)["pods"]
    assert [(m["plugin"], m["state"]) for m in pod["chain"]] == [
        ("m1", "torn-down"), ("m2", "ready"), ("m3", "torn-down")]


def test_gc_needs_only_the_members_that_ran_to_be_installed(chain: Any, store: StateStore) -> None:
    c = chain(3)
    c.member(2).set("setup", exit=1)
    c.member(1).set("teardown", exit=1)  # the rollback cannot finish: m1 still owes its teardown
    m = c.make()
    with pytest.raises(PluginFailed):
        m.setup(POD)
    import shutil

    shutil.rmtree(c.member(3).dir)  # m3 never ran for the pod; it was uninstalled since
    c.member(1).clear("teardown")
    c.log.unlink()
    report = run_gc(m)
    assert [(a.outcome, a.error) for a in report.actions] == [("done", None)]
    assert c.calls("teardown") == ["m1 teardown"]
    assert store.get(POD) is None
