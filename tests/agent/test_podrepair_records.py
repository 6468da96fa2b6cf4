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

from netplugin.agent.podrepair import PodRepairer
from netplugin.store.records import READY


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
        return SimpleNamespace(state=READY if path.endswith(("0.json", "1.json", "9.json")) else "setup", path=path)

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
