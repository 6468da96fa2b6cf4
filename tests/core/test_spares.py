"""Spare inodes for pod records (netplugin.store.spares): records are rewritten and removed without
allocating or freeing inodes, and nothing a reader can see changes."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from netplugin.core.names import PodRef
from netplugin.core.spares import CAP, SPARE_DIR, NoSpare, Spares
from netplugin.store.records import READY, record_filename
from netplugin.store.state import StateStore


def _pod(i: int) -> PodRef:
    return PodRef("default", f"web-{i}", f"infra{i}")


def _inode(path: Path) -> int:
    return path.stat().st_ino


@pytest.fixture
def sets_up(mgr: Any, netns_dir: Path) -> Any:
    m = mgr()

    def run(ref: PodRef) -> None:
        (netns_dir / ref.infra_id).touch()
        m.setup(ref)

    run.manager = m  # type: ignore[attr-defined]
    return run


def test_a_pods_life_after_the_first_reuses_the_inodes_of_records_gone_before(
    sets_up: Any, np_dirs: dict[str, str]
) -> None:
    pods = Path(np_dirs["state_dir"]) / "pods"
    seen: set[int] = set()
    for i in range(6):
        ref = _pod(i)
        sets_up(ref)
        rec = pods / record_filename(ref)
        if i >= 2:
            # begin and complete each took a spare: the record is an inode an earlier record had
            assert _inode(rec) in seen, f"pod {i}: its record got a new inode"
        seen.add(_inode(rec))
        seen.update(_inode(p) for p in (pods / SPARE_DIR).iterdir())
        sets_up.manager.teardown(ref)
        assert not rec.exists()
    assert len(seen) <= 3, f"six pods' lives used {len(seen)} inodes"


def test_a_spare_that_is_also_a_live_record_is_never_written(
    sets_up: Any, np_dirs: dict[str, str], store: StateStore
) -> None:
    # What a crash between keeping the old inode and renaming over it leaves: a spare name that is
    # a second link to a live record.
    pods = Path(np_dirs["state_dir"]) / "pods"
    live = _pod(1)
    sets_up(live)
    rec = pods / record_filename(live)
    before = rec.read_bytes()
    spare = Spares(str(pods), np_dirs["state_dir"])
    spare_dir = pods / SPARE_DIR
    spare_dir.mkdir(mode=0o700, exist_ok=True)
    for p in spare_dir.iterdir():
        p.unlink()
    os.link(rec, spare_dir / "crashed")
    spare.replace(str(pods / "other.json"), b"{\"x\": 1}\n", mode=0o644)
    assert rec.read_bytes() == before, "the live record was overwritten through its second link"
    assert (pods / "other.json").read_bytes() == b'{"x": 1}\n'
    assert not (spare_dir / "crashed").exists(), "the shared name is dropped, not kept as a spare"
    got = store.get(live)
    assert got is not None and got.state == READY


def test_spares_are_capped(tmp_path: Path) -> None:
    d = tmp_path / "pods"
    d.mkdir(mode=0o755)
    spares = Spares(str(d), str(tmp_path))
    for i in range(CAP + 10):
        p = d / f"r{i}.json"
        p.write_bytes(b"{}")
        spares.remove(str(p))
        assert not p.exists()
    assert len(list((d / SPARE_DIR).iterdir())) == CAP
    with pytest.raises(FileNotFoundError):
        spares.remove(str(d / "absent.json"))


def test_a_new_process_adopts_the_spares_it_finds(tmp_path: Path) -> None:
    d = tmp_path / "pods"
    d.mkdir(mode=0o755)
    old = d / "old.json"
    old.write_bytes(b"old record, longer than the new one\n")
    ino = _inode(old)
    Spares(str(d), str(tmp_path)).remove(str(old))
    Spares(str(d), str(tmp_path)).replace(str(d / "new.json"), b"new\n", mode=0o644)
    new = d / "new.json"
    assert _inode(new) == ino and new.read_bytes() == b"new\n" and (new.stat().st_mode & 0o777) == 0o644


def test_the_scan_reads_a_corrupt_looking_record_once_more(np_dirs: dict[str, str], sets_up: Any) -> None:
    # A reader without the pod's lock may catch a spare being rewritten; the second read decides.
    ref = _pod(3)
    sets_up(ref)

    class Flaky(StateStore):
        reads = 0

        def load(self, path: str) -> Any:
            Flaky.reads += 1
            if Flaky.reads == 1:
                from netplugin.core.errors import StateError

                raise StateError(path, "torn")
            return super().load(path)

    scan = Flaky(np_dirs["state_dir"]).scan()
    assert [r.ref for r in scan.records] == [ref] and scan.corrupt == []
    assert Flaky.reads == 2


def test_create_never_replaces_and_keeps_its_spare(tmp_path: Path) -> None:
    d = tmp_path / "ips"
    d.mkdir(mode=0o755)
    spares = Spares(str(d), str(tmp_path))
    gone = d / "gone"
    gone.write_bytes(b"x")
    spares.remove(str(gone))
    taken = d / "10.0.0.2"
    taken.write_bytes(b"theirs\n")
    assert spares.create(str(taken), b"mine\n", mode=0o644) is False
    assert taken.read_bytes() == b"theirs\n"
    assert len(list((d / SPARE_DIR).iterdir())) == 1, "the spare went back"
    assert spares.create(str(d / "10.0.0.3"), b"mine\n", mode=0o644) is True
    assert (d / "10.0.0.3").read_bytes() == b"mine\n" and (d / "10.0.0.3").stat().st_nlink == 1
    assert sorted(p.name for p in d.iterdir() if p.name != SPARE_DIR) == ["10.0.0.2", "10.0.0.3"]
    with pytest.raises(NoSpare):
        spares.create(str(d / "10.0.0.4"), b"mine\n", mode=0o644)


def test_fill_makes_spares_ahead_and_writes_take_them(tmp_path: Path) -> None:
    d = tmp_path / "pods"
    d.mkdir(mode=0o755)
    spares = Spares(str(d), str(tmp_path))
    assert spares.fill(5) == 5 and spares.fill(5) == 0
    made = {p.stat().st_ino for p in (d / SPARE_DIR).iterdir()}
    assert len(made) == 5 and stat.S_IMODE((d / SPARE_DIR).stat().st_mode) == 0o700
    for i in range(5):
        spares.replace(str(d / f"r{i}.json"), b"{}\n", mode=0o644)
        assert (d / f"r{i}.json").stat().st_ino in made, "a write took a spare made ahead"
    assert list((d / SPARE_DIR).iterdir()) == []


def test_the_daemon_stocks_records_and_locks_at_start(np_dirs: dict[str, str], mgr: Any) -> None:
    m = mgr()
    m.stock()
    pods = Path(np_dirs["state_dir"]) / "pods" / SPARE_DIR
    locks = Path(np_dirs["run_dir"]) / "locks" / SPARE_DIR
    assert len(list(pods.iterdir())) == CAP and len(list(locks.iterdir())) == CAP
