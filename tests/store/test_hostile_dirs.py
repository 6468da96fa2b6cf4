"""Hostile node, class 2: root never writes where an unprivileged user chose, and locks clean up.

A throwaway local user (``tests/support/hostile.py``) owns or can write netplugin's state and run
dirs, plants symbolic links where netplugin expects its own directories and files, and runs
netplugin under umask 000; netplugin refuses (naming the directory and why) and touches
nothing. Lock files are removed by their last holder without ever letting two holders in.
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from netplugin.core.dirs import UnsafeDirectory, ensure_dir
from netplugin.core.errors import SystemFailure
from netplugin.core.fileio import atomic_write
from netplugin.core.names import PodRef
from netplugin.core.spares import SPARE_DIR, spares_for
from netplugin.store.locks import flocked, hold, release
from netplugin.store.state import StateStore
from tests.support.hostile import HostileUser, hostile_user

POD = PodRef("default", "web-0", "abc123")


@pytest.fixture
def user() -> Iterator[HostileUser]:
    yield from hostile_user()


@pytest.fixture
def node(user: HostileUser) -> Path:
    base = user.area / "node"
    base.mkdir(mode=0o755)
    base.chmod(0o755)
    return base


@pytest.fixture
def squat(user: HostileUser) -> Path:
    """A sticky world-writable dir (like /tmp) where netplugin's dirs are configured to be made:
    the user gets there first."""
    base = user.area / "sticky"
    base.mkdir()
    base.chmod(0o1777)
    return base


def _cli(base: Path, *args: str, umask: int | None = None, plugin_dir: Path | None = None) -> Any:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_")}
    exec_dir = plugin_dir or base / "exec"
    exec_dir.mkdir(exist_ok=True, mode=0o755)
    env.update(NETPLUGIN_PLUGIN_DIR=str(exec_dir), NETPLUGIN_STATE_DIR=str(base / "state"),
               NETPLUGIN_RUN_DIR=str(base / "run"), NETPLUGIN_USE_DAEMON="never", NETPLUGIN_HOST="none")
    # The child inherits the umask set here around the run, not by a preexec_fn: that would fork() the
    # pytest process, which holds grpc, whose fork handlers can abort the child before it execs.
    old = None if umask is None else os.umask(umask)
    try:
        return subprocess.run([sys.executable, "-m", "netplugin", *args], env=env, capture_output=True, text=True,
                              timeout=60)
    finally:
        if old is not None:
            os.umask(old)


def _tree(base: Path) -> dict[str, int]:
    return {str(p.relative_to(base)): stat.S_IMODE(p.lstat().st_mode) for p in sorted(base.rglob("*"))}


# --- modes under any umask --------------------------------------------------------------------------


def test_umask_000_still_gives_restrictive_dirs_and_files(node: Path, plugin_dir: Any) -> None:
    plugin_dir.install("p")
    r = _cli(node, "--plugin", "p", "setup", "default", "web-0", "abc123", umask=0, plugin_dir=plugin_dir.path)
    assert r.returncode == 0, r.stderr
    tree = _tree(node)
    assert tree["state"] == tree["state/pods"] == tree["run"] == tree["run/init"] == 0o755
    assert not any(mode & 0o022 for mode in tree.values()), tree
    assert tree["state/call.key"] == 0o600
    assert tree["state/pods/default_web-0_abc123.json"] == 0o644


# --- directories another user can write, or symlinks where our own dirs belong ------------------------


@pytest.mark.parametrize("which", ["state", "run"])
def test_a_dir_the_user_owns_is_refused_and_nothing_is_written(squat: Path, user: HostileUser, plugin_dir: Any,
                                                               which: str) -> None:
    plugin_dir.install("p")
    user.run(["mkdir", "-m", "755", str(squat / which)])
    r = _cli(squat, "--plugin", "p", "setup", "default", "web-0", "abc123", plugin_dir=plugin_dir.path)
    assert r.returncode == 5, r.stderr
    assert "refusing directory" in r.stderr and f"{squat / which} is owned by uid {user.uid}" in r.stderr
    assert list((squat / which).iterdir()) == []
    assert not plugin_dir.path.joinpath("p", "calls.log").exists()  # refused before the plugin ran


def test_a_world_writable_state_dir_is_refused(node: Path, plugin_dir: Any) -> None:
    plugin_dir.install("p")
    (node / "state").mkdir()
    (node / "state").chmod(0o777)
    r = _cli(node, "--plugin", "p", "setup", "default", "web-0", "abc123", plugin_dir=plugin_dir.path)
    assert r.returncode == 5
    assert f"{node / 'state'} is group- and world-writable (mode 0777)" in r.stderr
    assert not (plugin_dir.path / "p" / "calls.log").exists()  # refused before the plugin ran


def test_symlinked_pods_dir_is_refused_by_setup_listing_and_gc(node: Path, user: HostileUser,
                                                                plugin_dir: Any) -> None:
    plugin_dir.install("p")
    victim = user.home() / "victim"
    user.sh(f"mkdir {victim} && echo precious > {victim}/file.json")
    (node / "state").mkdir(mode=0o755)
    (node / "state" / "pods").symlink_to(victim)
    for args in (["--plugin", "p", "setup", "default", "web-0", "abc123"], ["pods"], ["gc"]):
        r = _cli(node, *args, plugin_dir=plugin_dir.path)
        assert r.returncode == 5, (args, r.stderr)
        assert "is a symbolic link" in r.stderr
    assert sorted(p.name for p in victim.iterdir()) == ["file.json"]  # gc moved nothing into corrupt/
    assert (victim / "file.json").read_text() == "precious\n"


def test_an_unsafe_ancestor_is_refused_but_a_sticky_one_is_not(user: HostileUser) -> None:
    sticky = user.area / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    assert ensure_dir(str(sticky / "state" / "pods"), base=str(sticky / "state")) is not None
    loose = user.area / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    with pytest.raises(UnsafeDirectory, match=f"{loose} is group- and world-writable"):
        ensure_dir(str(loose / "state"))
    assert not (loose / "state").exists()


def test_store_refuses_a_state_dir_another_user_owns(squat: Path, user: HostileUser) -> None:
    user.run(["mkdir", "-m", "755", str(squat / "state")])
    store = StateStore(str(squat / "state"))
    with pytest.raises(UnsafeDirectory):
        store.begin(POD, "p", "v1", "")
    with pytest.raises(UnsafeDirectory):
        store.scan()


# --- files: never through a link, never an existing file where a new one belongs --------------------------


def test_lock_file_planted_as_a_symlink_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("keep\n")
    (tmp_path / "locks").mkdir()
    (tmp_path / "locks" / "p.lock").symlink_to(target)
    with pytest.raises(SystemFailure, match="symbolic link"), flocked(str(tmp_path / "locks" / "p.lock")):
        pass
    assert target.read_text() == "keep\n"


def test_a_planted_temp_file_link_is_never_written_through(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("keep\n")
    dest = tmp_path / "rec.json"
    tmp = Path(f"{dest}.tmp.{os.getpid()}.{threading.get_ident()}")
    tmp.symlink_to(target)
    atomic_write(str(dest), b"{}\n", mode=0o644)
    assert target.read_text() == "keep\n"
    assert dest.read_bytes() == b"{}\n" and not dest.is_symlink()
    assert stat.S_IMODE(dest.stat().st_mode) == 0o644


def test_a_record_planted_as_a_symlink_is_set_aside_not_followed(node: Path, user: HostileUser) -> None:
    store = StateStore(str(node / "state"))
    store.begin(POD, "p", "v1", "")
    secret = user.home() / "elsewhere.json"
    secret.write_text("{}")
    path = Path(store.path_for(PodRef("default", "web-1", "x")))
    path.symlink_to(secret)
    scan = store.scan()
    assert [c.reason for c in scan.corrupt] == ["is a symbolic link, not a pod record"]
    moved = store.set_aside(scan.corrupt[0].path, scan.corrupt[0].reason)
    assert Path(moved).is_symlink() and secret.read_text() == "{}"


def test_daemon_lock_planted_as_a_symlink_is_refused(tmp_path: Path) -> None:
    from netplugin.frontends.daemon.listener import lock_daemon

    target = tmp_path / "etc-file"
    target.write_text("keep\n")
    (tmp_path / "np.sock.lock").symlink_to(target)
    with pytest.raises(SystemFailure, match="symbolic link"):
        lock_daemon(str(tmp_path / "np.sock.lock"))
    assert target.read_text() == "keep\n"


# --- lock files are removed, and removing them never lets two holders in -------------------------------


def test_lock_files_are_removed_after_actions(node: Path, plugin_dir: Any) -> None:
    plugin_dir.install("p")
    for action in ("setup", "status", "teardown"):
        r = _cli(node, "--plugin", "p", action, "default", "web-0", "abc123", plugin_dir=plugin_dir.path)
        assert r.returncode == 0, r.stderr
    # the pod's lock file is gone (its inode kept as a spare for the next pod's lock)
    assert [p.name for p in (node / "run" / "locks").iterdir()] == [SPARE_DIR]
    assert len(list((node / "run" / "locks" / SPARE_DIR).iterdir())) <= 1
    assert [p.name for p in (node / "run" / "init").iterdir()] == ["p.json"]  # the marker stays, its lock not


def test_removing_lock_files_keeps_mutual_exclusion(tmp_path: Path) -> None:
    # Many holders in threads and processes: an unlocked read-modify-write would lose updates.
    lock, counter = tmp_path / "locks" / "c.lock", tmp_path / "counter"
    (tmp_path / "locks").mkdir()
    counter.write_text("0")
    code = f"""
import sys
sys.path.insert(0, {os.environ.get('PYTHONPATH', '')!r})
from netplugin.store.locks import flocked
for _ in range(150):
    with flocked({str(lock)!r}):
        n = int(open({str(counter)!r}).read())
        open({str(counter)!r}, "w").write(str(n + 1))
"""
    procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(3)]

    def bump() -> None:
        for _ in range(150):
            with flocked(str(lock)):
                n = int(counter.read_text())
                counter.write_text(str(n + 1))

    threads = [threading.Thread(target=bump) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    assert int(counter.read_text()) == 5 * 150
    assert not lock.exists()


def test_a_shared_holder_leaves_the_file_to_the_last_one(tmp_path: Path) -> None:
    path = str(tmp_path / "s.lock")
    a = hold(path, shared=True)
    b = hold(path, shared=True)
    assert a is not None and b is not None
    release(a, path)
    assert os.path.exists(path)  # b still holds it
    assert hold(path, blocking=False) is None  # and it still excludes a writer
    release(b, path)
    assert not os.path.exists(path)


@pytest.mark.parametrize("recycled", [False, True], ids=["unlinked", "spare"])
def test_a_waiter_on_a_removed_lock_file_takes_the_new_one(tmp_path: Path, recycled: bool) -> None:
    path = str(tmp_path / "w.lock")
    spares = spares_for(str(tmp_path), str(tmp_path)) if recycled else None
    first = hold(path, spares=spares)
    assert first is not None
    stale = os.open(path, os.O_RDWR)  # a waiter that opened the file before it was removed
    release(first, path, spares=spares)
    second = hold(path, blocking=False, spares=spares)
    assert second is not None
    try:
        if recycled:
            # The removed file's inode was kept as a spare and made the new lock file: the stale
            # waiter then waits on the lock itself and cannot get in.
            assert os.fstat(stale).st_ino == os.stat(path).st_ino
            with pytest.raises(BlockingIOError):
                fcntl.flock(stale, fcntl.LOCK_EX | fcntl.LOCK_NB)
        else:
            fcntl.flock(stale, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the stale inode is free to lock ...
            now = os.stat(path)
            assert os.fstat(stale).st_ino != now.st_ino  # ... but no longer the lock: hold() re-checks this
    finally:
        os.close(stale)
        release(second, path, spares=spares)


def test_gc_listing_sees_no_busy_pod_after_its_lock_file_is_gone(node: Path, plugin_dir: Any) -> None:
    plugin_dir.install("p")
    r = _cli(node, "--plugin", "p", "setup", "default", "web-0", "abc123", plugin_dir=plugin_dir.path)
    assert r.returncode == 0, r.stderr
    r = _cli(node, "-o", "json", "pods", plugin_dir=plugin_dir.path)
    assert r.returncode == 0, r.stderr
    assert [p["condition"] for p in json.loads(r.stdout)["pods"]] == ["ready"]


def test_a_planted_init_marker_link_is_not_read_and_init_runs(node: Path, plugin_dir: Any) -> None:
    # A marker netplugin did not write (here a symbolic link to a forged one) never skips init.
    from netplugin.core.execplugin.exec_plugin import ExecPlugin
    from netplugin.core.procs import boot_id

    p = plugin_dir.install("p")
    exe = ExecPlugin("p", str(p.exe))
    marker = {"plugin": "p", "boot_id": boot_id(), "version": exe.version(), "version_key": list(exe.version_key()),
              "settings": {}}
    forged = node / "forged.json"
    forged.write_text(json.dumps(marker))  # would pass as this boot's marker of this version
    (node / "run" / "init").mkdir(parents=True, mode=0o755)
    (node / "run" / "init" / "p.json").symlink_to(forged)
    r = _cli(node, "--plugin", "p", "setup", "default", "web-0", "abc123", plugin_dir=plugin_dir.path)
    assert r.returncode == 0, r.stderr
    assert p.calls()[:2] == ["init", "setup default web-0 abc123"]
    assert not (node / "run" / "init" / "p.json").is_symlink()  # replaced by a real marker
    assert json.loads(forged.read_text()) == marker


@pytest.mark.parametrize("sub", ["run/locks", "run/init", "state/pods"])
def test_an_existing_symlinked_dir_of_our_own_is_refused(node: Path, user: HostileUser, plugin_dir: Any,
                                                         sub: str) -> None:
    # Not only when netplugin would create it: an existing link is refused before any use.
    plugin_dir.install("p")
    theirs = user.home() / "theirs"
    user.run(["mkdir", "-m", "755", str(theirs)])
    for d in ("state", "run"):
        (node / d).mkdir(mode=0o755, exist_ok=True)
    (node / sub).symlink_to(theirs)
    r = _cli(node, "--plugin", "p", "setup", "default", "web-0", "abc123", plugin_dir=plugin_dir.path)
    assert r.returncode == 5, r.stderr
    assert f"{node / sub} is a symbolic link" in r.stderr
    assert list(theirs.iterdir()) == []


def test_the_next_pods_lock_file_is_a_spare_of_an_earlier_one(tmp_path: Path) -> None:
    # Lock files are made from spare inodes (netplugin.core.spares): a node's steady churn of pods
    # allocates no inode for their locks.
    locks = tmp_path / "locks"
    spares = spares_for(str(locks), str(tmp_path))
    inodes = set()
    for i in range(5):
        path = str(locks / f"pod-{i}.lock")
        fd = hold(path, base=str(tmp_path), spares=spares)
        assert fd is not None
        inodes.add(os.fstat(fd).st_ino)
        assert stat.S_IMODE(os.fstat(fd).st_mode) == 0o600 and os.fstat(fd).st_size == 0
        release(fd, path, spares=spares)
        assert not os.path.exists(path)
    assert len(inodes) == 1
