"""The group commit: concurrent callers share fsync passes, and a failed sync reaches every caller it covered."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from netplugin.core.errors import SystemFailure
from netplugin.store.commit import GroupCommit


def _write(path: Path) -> str:
    path.write_bytes(os.urandom(4096))
    return str(path)


def test_concurrent_callers_share_passes(tmp_path: Path) -> None:
    commit = GroupCommit()
    callers = 24
    start = threading.Barrier(callers)
    errors: list[BaseException] = []

    def one(i: int) -> None:
        path = _write(tmp_path / f"rec{i}")
        start.wait()
        try:
            commit.sync([path])
        except BaseException as e:  # pragma: no cover - reported by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    # Every caller returned after a pass that covered it; far fewer passes than callers ran.
    assert 1 <= commit.passes <= callers // 2, commit.passes


def test_a_caller_alone_gets_its_own_pass_each_time(tmp_path: Path) -> None:
    commit = GroupCommit()
    for i in range(3):
        commit.sync([_write(tmp_path / f"r{i}")])
    assert commit.passes == 3


def test_a_sync_failure_is_raised_naming_the_path_and_the_next_pass_works(tmp_path: Path) -> None:
    commit = GroupCommit()
    gone = tmp_path / "gone"
    gone.mkdir()
    path = _write(gone / "rec")
    os.unlink(path)
    os.rmdir(gone)
    with pytest.raises(SystemFailure) as info:
        commit.sync([path])  # the file is gone (a rollback removed it): fine; its directory too: not
    assert str(gone) in info.value.message
    commit.sync([_write(tmp_path / "ok")])
    assert commit.passes == 2
