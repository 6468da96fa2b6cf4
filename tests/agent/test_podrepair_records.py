"""The pod repairer's view of the records: every teardown deletes a host veth (a loss the kernel
reports), so on a full node a pass must not parse every record again; it reads only the files
that changed since the last pass, and forgets the removed ones."""

from __future__ import annotations

import os
import threading
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from netplugin.agent.podrepair import PodRepairer
from netplugin.store.records import READY


def _record(path: str, state: str, hif: str = "") -> Any:
    """A record as the repairer reads one: its state, pod and chain's host interfaces."""
    member = SimpleNamespace(ran=True, host_interface=hif or os.path.basename(path))
    return SimpleNamespace(state=state, path=path, ref=SimpleNamespace(infra_id=path), chain=(member,))


def _repairer() -> PodRepairer:
    def no_manager() -> Any:
        raise AssertionError("not used here")

    return PodRepairer(no_manager, Counter(), threading.Lock())


def test_a_pass_reads_again_only_the_records_that_changed(tmp_path: Path) -> None:
    for i in range(5):
        (tmp_path / f"p{i}.json").write_text(str(i))
    reads: list[str] = []

    def load(path: str) -> Any:
        reads.append(os.path.basename(path))
        ready = path.endswith(("0.json", "1.json", "9.json"))
        return _record(path, READY if ready else "setup")

    repairer = _repairer()
    assert len(repairer._ready_records(str(tmp_path), load)) == 2
    assert sorted(reads) == [f"p{i}.json" for i in range(5)]
    reads.clear()
    assert len(repairer._ready_records(str(tmp_path), load)) == 2 and reads == []  # nothing changed: nothing read

    (tmp_path / "p1.json").write_text("rewritten, longer")
    (tmp_path / "p0.json").unlink()
    (tmp_path / "p9.json").write_text("9")
    (tmp_path / "p3.json.tmp.123").write_text("a temp file of an atomic write")
    ready = repairer._ready_records(str(tmp_path), load)
    assert sorted(reads) == ["p1.json", "p9.json"]
    assert sorted(os.path.basename(r.path) for r in ready) == ["p1.json", "p9.json"]


def test_a_missing_records_dir_is_no_pods(tmp_path: Path) -> None:
    assert _repairer()._ready_records(str(tmp_path / "absent"), lambda p: None) == []


@pytest.mark.parametrize("pods", [10, 300])
def test_a_pass_after_the_first_touches_only_what_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pods: int
) -> None:
    """What a pass reads (directory listings, stats, parsed records) and the pods it checks do not grow
    with the pods on the node: a teardown's loss costs the same with 10 pods as with 300."""
    for i in range(pods):
        (tmp_path / f"p{i}.json").write_text("x")
    reads: list[str] = []

    def load(path: str) -> Any:
        reads.append(os.path.basename(path))
        return _record(path, READY, hif=f"veth{os.path.basename(path)[1:-5]}")

    checked: list[str] = []

    def manager() -> Any:
        return SimpleNamespace(state=SimpleNamespace(dir=str(tmp_path), load=load))

    def check(manager: Any, rec: Any, hifs: list[str]) -> set[str]:
        checked.append(hifs[0])
        return set()

    repairer = _repairer()
    repairer.manager = manager
    monkeypatch.setattr(repairer, "_pod", check)
    repairer.run(set())
    assert len(reads) == pods  # the first pass reads every record once

    calls = {"scandir": 0, "lstat": 0}
    for name in calls:
        real = getattr(os, name)

        def counted(*a: Any, _real: Any = real, _name: str = name) -> Any:
            calls[_name] += 1
            return _real(*a)

        monkeypatch.setattr(os, name, counted)
    reads.clear()
    (tmp_path / "p0.json").unlink()  # a teardown: its record removed, its host veth deleted
    (tmp_path / f"p{pods}.json").write_text("x")  # a setup meanwhile
    repairer.run({"veth0", "veth1"})
    assert calls == {"scandir": 0, "lstat": 2}
    assert reads == [f"p{pods}.json"]
    assert checked == ["veth1"]  # veth0's pod is gone; only the ready pod naming veth1 is checked
    assert f"p{pods}.json" in {os.path.basename(r.path) for r in repairer._ready_records(str(tmp_path), load)}
