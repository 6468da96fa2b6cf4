"""Hostile node, round 3: a plugin change must not orphan pods, a hung member must not strand others.

Attacks (each failed on the code before the fix):

* the config names another plugin or chain between a pod's setup and its teardown (a plain edit
  for the CLI, an edit and SIGHUP for the daemon): the teardown runs the chain recorded with the
  pod, member by member, never the configured one; a recorded member that is gone is reported and
  the record kept until it returns; ``netplugin pods`` and the daemon's health say so;
* a member hangs in teardown, in a rollback or in gc: it is killed at its own limit and reported,
  and the members before it still run with their own limit.

Members are the scriptable test plugin (one copy per member) logging to one shared file.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from netplugin.core.errors import PluginFailed, PluginTimeout
from netplugin.core.names import PodRef
from netplugin.manager.gc import run_gc
from netplugin.store.records import TEARING_DOWN
from netplugin.store.state import StateStore
from tests.support.nettest import live_netns_file

POD = PodRef("default", "web-0", "infra0")
ARGV = ("default", "web-0", "infra0")


class Node:
    """Members installed in the exec dir, one config file, and the members' shared call log."""

    def __init__(self, plugin_dir: Any, config: Path, netns_dir: Path, log: Path) -> None:
        self.plugin_dir, self.config, self.netns_dir, self.log = plugin_dir, config, netns_dir, log
        self.members: dict[str, Any] = {}
        live_netns_file(netns_dir / POD.infra_id)

    def install(self, *names: str) -> None:
        for n in names:
            self.members[n] = self.plugin_dir.install(n)

    def configure(self, chain: list[str], **extra: Any) -> None:
        """Write the config file: the chain, the netns template, the shared log (a plain edit)."""
        doc = {
            "plugins": chain,
            "netns_template": str(self.netns_dir / "{infra_id}"),
            "env": {"NETPLUGIN_TEST_LOG": str(self.log)},
            **extra,
        }
        self.config.write_text(json.dumps(doc))  # JSON is YAML

    def calls(self, action: str) -> list[str]:
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        return [" ".join(line.split()[:2]) for line in lines if line.split()[1:2] == [action]]

    def forget_calls(self) -> None:
        self.log.unlink(missing_ok=True)


@pytest.fixture
def node(plugin_dir: Any, np_dirs: dict[str, str], netns_dir: Path, tmp_path: Path) -> Node:
    return Node(plugin_dir, Path(np_dirs["config"]), netns_dir, tmp_path / "calls.log")


# --- 1. the recorded chain tears down, whatever the config says now ---------------------------------------


@pytest.mark.parametrize(
    ("before", "after"),
    [
        pytest.param(["a"], ["b"], id="a-then-b"),
        pytest.param(["a", "b"], ["b"], id="ab-then-b"),
        pytest.param(["a", "b"], ["c", "a"], id="ab-then-ca"),
        pytest.param(["a"], [], id="a-then-no-op"),
        pytest.param(["a", "b"], ["b", "a"], id="ab-then-ba"),
    ],
)
def test_a_plain_edit_between_setup_and_teardown_tears_down_the_recorded_chain(
    node: Node, run_cli: Any, store: StateStore, before: list[str], after: list[str]
) -> None:
    node.install("a", "b", "c")
    node.configure(before)
    assert run_cli("setup", *ARGV).returncode == 0
    node.configure(after)
    listing = json.loads(run_cli("-o", "json", "pods").stdout)
    assert [p["chain_differs"] for p in listing["pods"]] == [True]
    table = run_cli("pods").stdout
    assert f"(configured now: {','.join(after) or 'kubernetes.io/no-op'})" in table
    node.forget_calls()
    r = run_cli("teardown", *ARGV)
    assert r.returncode == 0, r.stderr
    assert node.calls("teardown") == [f"{n} teardown" for n in reversed(before)]
    assert store.get(POD) is None


def test_a_recorded_member_no_longer_installed_is_reported_and_the_record_kept_until_it_returns(
    node: Node, run_cli: Any, store: StateStore, tmp_path: Path
) -> None:
    node.install("a", "b")
    node.configure(["a", "b"])
    assert run_cli("setup", *ARGV).returncode == 0
    node.configure(["a"])
    away = tmp_path / "b-away"
    shutil.move(node.members["b"].dir, away)  # the admin removed b with the edit
    node.forget_calls()
    r = run_cli("teardown", *ARGV)
    assert r.returncode != 0
    assert "plugin 'b'" in r.stderr or "plugin b" in r.stderr, r.stderr
    assert "no longer usable" in r.stderr and "record is kept" in r.stderr
    assert node.calls("teardown") == ["a teardown"]  # the member before it still ran
    rec = store.get(POD)
    assert rec is not None and rec.state == TEARING_DOWN
    assert [(m.plugin, m.ran) for m in rec.chain] == [("a", False), ("b", True)]  # only b still owes
    shutil.move(away, node.members["b"].dir)  # b returns: a later teardown finishes
    node.forget_calls()
    r = run_cli("teardown", *ARGV)
    assert r.returncode == 0, r.stderr
    assert node.calls("teardown") == ["b teardown", "a teardown"]
    assert store.get(POD) is None


def test_gc_finishes_a_teardown_owed_by_a_member_that_returned(
    node: Node, run_cli: Any, make_manager: Any, store: StateStore, tmp_path: Path
) -> None:
    node.install("a", "b")
    node.configure(["a", "b"])
    assert run_cli("setup", *ARGV).returncode == 0
    node.configure(["c"])
    away = tmp_path / "a-away"
    shutil.move(node.members["a"].dir, away)
    assert run_cli("teardown", *ARGV).returncode != 0
    shutil.move(away, node.members["a"].dir)
    node.forget_calls()
    r = run_cli("gc")
    assert r.returncode == 0, r.stderr
    assert node.calls("teardown") == ["a teardown"]  # b finished in the first teardown
    assert store.get(POD) is None


# --- 3. a member hung in teardown or rollback does not strand the members before it ------------------------


@pytest.mark.parametrize("hung", ["b", "c"])
def test_a_hung_member_in_teardown_is_killed_and_the_members_before_it_still_run(
    node: Node, make_manager: Any, store: StateStore, hung: str
) -> None:
    node.install("a", "b", "c")
    mgr = _manager(make_manager, node, ["a", "b", "c"])
    mgr.setup(POD)
    node.members[hung].set("teardown", sleep=30)
    node.forget_calls()
    with pytest.raises(PluginTimeout) as info:
        mgr.teardown(POD)
    assert info.value.plugin == hung and "timed out" in info.value.message
    assert node.calls("teardown") == ["c teardown", "b teardown", "a teardown"]  # a ran, with its own limit
    rec = store.get(POD)
    assert rec is not None and [m.plugin for m in rec.chain if m.ran] == [hung]


def test_a_hung_member_in_rollback_does_not_strand_the_first_one(
    node: Node, make_manager: Any, store: StateStore
) -> None:
    node.install("a", "b", "c")
    mgr = _manager(make_manager, node, ["a", "b", "c"])
    node.members["c"].set("setup", exit=1, stderr="c broke")
    node.members["b"].set("teardown", sleep=30)
    with pytest.raises(PluginFailed) as info:
        mgr.setup(POD)
    assert "c broke" in str(info.value) and "timed out" in str(info.value)
    assert node.calls("teardown") == ["c teardown", "b teardown", "a teardown"]
    rec = store.get(POD)
    assert rec is not None and [m.plugin for m in rec.chain if m.ran] == ["b"]


def test_gc_gives_each_member_its_own_limit(node: Node, make_manager: Any, store: StateStore) -> None:
    node.install("a", "b")
    mgr = _manager(make_manager, node, ["a", "b"])
    mgr.setup(POD)
    node.members["b"].set("teardown", exit=1, stderr="b broke")
    node.members["a"].set("teardown", exit=1, stderr="a broke")
    with pytest.raises(PluginFailed):
        mgr.teardown(POD)  # both still owe their teardown
    node.members["a"].clear("teardown")
    node.members["b"].clear("teardown")
    node.members["b"].set("teardown", sleep=30)  # now b hangs
    node.forget_calls()
    report = run_gc(_manager(make_manager, node, ["a", "b"]))
    assert [a.outcome for a in report.actions if a.kind == "teardown"] == ["failed"]
    assert node.calls("teardown") == ["b teardown", "a teardown"]  # a ran (and succeeded)
    rec = store.get(POD)
    assert rec is not None and [m.plugin for m in rec.chain if m.ran] == ["b"]


def _manager(make_manager: Any, node: Node, chain: list[str]) -> Any:
    return make_manager(
        plugins=chain,
        timeout=1,
        netns_template=str(node.netns_dir / "{infra_id}"),
        env={"NETPLUGIN_TEST_LOG": str(node.log)},
    )
