"""A ready pod's repair across its chain (manager/repair.py): only members that declare it, in order,
each under its own setup limit, past failures; what each put back, by the contract's kinds."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from netplugin.core.names import PodRef
from netplugin.manager.manager import Manager
from netplugin.manager.repair import repair_kind, repair_pod

POD = PodRef("default", "web-0", "infra0")
DECLARES = '{"actions":["setup","teardown","repair"]}'


@dataclass
class Chain:
    manager: Manager
    log: Path  #: every member's calls, in order
    members: list[Any]


@pytest.fixture
def chain(plugin_dir: Any, make_manager: Any, netns_dir: Path, tmp_path: Path) -> Callable[..., Chain]:
    """chain([True, False, ...], **config): members m1..mn, each declaring repair or not, and a Manager."""

    def build(declares: list[bool], **kw: Any) -> Chain:
        members = [plugin_dir.install(f"m{i}") for i in range(1, len(declares) + 1)]
        for m, yes in zip(members, declares, strict=True):
            if yes:
                m.set("init", stdout=DECLARES)
        log = tmp_path / "chain.log"
        (netns_dir / POD.infra_id).touch()
        kw.setdefault("plugins", [m.name for m in members])
        kw.setdefault("env", {"NETPLUGIN_TEST_LOG": str(log)})
        return Chain(make_manager(netns_template=str(netns_dir / "{infra_id}"), **kw), log, members)

    return build


def _calls(log: Path, action: str) -> list[str]:
    return [line.split()[0] for line in log.read_text().splitlines() if line.split()[1] == action]


def test_only_members_that_declare_repair_are_called_in_order(chain: Any) -> None:
    c = chain([True, False, True])
    c.manager.setup(POD)
    c.members[2].set("repair", stdout="qdisc: tbf on veth1 re-applied\nput back something\n")
    done = repair_pod(c.manager, POD)
    assert done.ran and _calls(c.log, "repair") == ["m1", "m3"]
    assert done.unrepairable == ["m2"] and done.errors == []
    assert done.changes == [("m3", "qdisc: tbf on veth1 re-applied"), ("m3", "put back something")]
    assert [repair_kind(line) for _, line in done.changes] == ["qdisc", "other"]
    # what teardown gets: the recorded chain and this member's place in it
    text = (c.members[2].dir / "repair.env").read_text()
    env = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    got = (env["NETPLUGIN_ACTION"], env["NETPLUGIN_CHAIN"], env["NETPLUGIN_CHAIN_INDEX"])
    assert got == ("repair", "m1,m2,m3", "3")


@pytest.mark.parametrize(
    ("steer", "expect"),
    [
        ({"exit": 3, "stderr": "cannot fix it"}, "cannot fix it"),
        ({"sleep": 30}, "timed out"),  # the setup limit (1.5 s here), its own: m2 still runs after it
    ],
)
def test_a_failing_member_is_reported_and_the_next_still_runs(chain: Any, steer: dict[str, Any], expect: str) -> None:
    c = chain([True, True], timeouts={"setup": 1.5})
    c.manager.setup(POD)
    c.members[0].set("repair", **steer)
    c.members[1].set("repair", stdout="port: veth1 hairpin on\n")
    done = repair_pod(c.manager, POD)
    assert len(done.errors) == 1 and expect in done.errors[0], done.errors
    assert _calls(c.log, "repair") == ["m1", "m2"] and done.changes == [("m2", "port: veth1 hairpin on")]


def test_a_pod_that_is_not_ready_is_not_touched(chain: Any) -> None:
    c = chain([True])
    done = repair_pod(c.manager, POD)  # no record: never set up here
    assert not done.ran and done.changes == [] and not c.log.exists()


def test_an_empty_init_output_does_not_declare_repair(chain: Any) -> None:
    """Plugins written before repair are never called with an action they do not know."""
    c = chain([False])
    c.manager.setup(POD)
    assert repair_pod(c.manager, POD).unrepairable == ["m1"] and _calls(c.log, "repair") == []
