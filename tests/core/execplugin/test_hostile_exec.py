"""Hostile node, class 1: root never executes a plugin an unprivileged user could have chosen.

Each test makes a throwaway local user (``tests/support/hostile.py``) who attacks the exec dir the
way a user on the node could: owning a directory on the plugin's resolved path, planting
symbolic links, swapping files with ``mv`` or ``renameat2(RENAME_EXCHANGE)`` while root runs
setups, swapping the file after a long-lived Manager (the daemon's) selected it, and shebang
interpreters in places the user controls. The user's own file writes ``pwned`` if it ever runs.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from netplugin.core.config import load_config
from netplugin.core.discovery import open_executable, scan
from netplugin.core.errors import NetpluginError, PluginFailed, PluginInvalid
from netplugin.core.names import PodRef
from netplugin.hosts.base import NullHost
from netplugin.manager.manager import Manager
from tests.support.hostile import HostileUser, hostile_user

POD = PodRef("default", "web-0", "abc123")
GOOD = "#!/bin/sh\necho \"$0 $*\" >> \"$(dirname \"$0\")/calls.log\"\nexit 0\n"


@pytest.fixture
def user() -> Iterator[HostileUser]:
    yield from hostile_user()


class Layout:
    """A root-owned exec dir, state dir and run dir inside the user's reachable area."""

    def __init__(self, user: HostileUser) -> None:
        self.user = user
        self.base = user.area / "node"
        for d in ("exec", "state", "run"):
            (self.base / d).mkdir(parents=True, mode=0o755)
        self.base.chmod(0o755)
        self.exec = self.base / "exec"
        self.pwned = user.home() / "pwned"

    def install(self, name: str, script: str = GOOD, mode: int = 0o755) -> Path:
        d = self.exec / name
        d.mkdir(mode=0o755)
        exe = d / name
        exe.write_text(script)
        exe.chmod(mode)
        return exe

    def evil_script(self) -> str:
        return f"#!/bin/sh\ntouch {self.pwned}\nexit 0\n"

    def manager(self, plugin: str) -> Manager:
        cfg = load_config(None, environ={}, overrides={
            "plugin_dir": str(self.exec), "state_dir": str(self.base / "state"),
            "run_dir": str(self.base / "run"), "plugin": plugin, "host": "none",
        })
        return Manager(cfg, NullHost())


@pytest.fixture
def node(user: HostileUser) -> Layout:
    return Layout(user)


def _swap_as(user: HostileUser, exe: Path, script: str) -> None:
    """The user replaces ``exe`` with their own script by a plain rename."""
    tmp = exe.parent / "x"
    user.sh(f"printf '%s' '{script}' > {tmp} && chmod 755 {tmp} && mv -f {tmp} {exe}")
    assert exe.stat().st_uid == user.uid


def _problem(node: Layout, name: str) -> str:
    (cand,) = [c for c in scan(str(node.exec)) if c.name == name]
    assert cand.problem is not None, f"{name} was accepted"
    return cand.problem


# --- ownership of every component of the resolved path --------------------------------------------------


def test_root_owned_plugin_in_a_user_owned_plugin_dir_is_refused(node: Layout, user: HostileUser) -> None:
    exe = node.install("p")
    os.chown(exe.parent, user.uid, user.gid)
    assert f"{exe.parent} is owned by uid {user.uid}" in _problem(node, "p")
    # ... and the user could indeed have swapped it: nothing of theirs ever runs
    _swap_as(user, exe, node.evil_script())
    with pytest.raises(PluginInvalid, match=f"owned by uid {user.uid}"):
        node.manager("p").setup(POD)
    assert not node.pwned.exists()


def test_symlinked_plugin_whose_target_dir_the_user_owns_is_refused(node: Layout, user: HostileUser) -> None:
    real_dir = user.home() / "plugins"
    user.run(["mkdir", "-m", "755", str(real_dir)])
    target = real_dir / "p"
    target.write_text(GOOD)  # root-owned 0755 file: only its directory is the user's
    target.chmod(0o755)
    (node.exec / "p").mkdir(mode=0o755)
    (node.exec / "p" / "p").symlink_to(target)
    problem = _problem(node, "p")
    assert f"{real_dir} is owned by uid {user.uid}" in problem
    assert f"{user.home()} is owned by uid {user.uid}" in problem  # every problem at once


def test_symlink_owned_by_the_user_in_a_sticky_dir_is_refused(node: Layout, user: HostileUser) -> None:
    # A sticky world-writable dir above our own dirs is fine, but a link the user owns there is not.
    sticky = node.user.area / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    real = node.base / "real-p"
    real.write_text(GOOD)
    real.chmod(0o755)
    user.run(["ln", "-s", str(real), str(sticky / "p-link")])
    (node.exec / "p").mkdir(mode=0o755)
    (node.exec / "p" / "p").symlink_to(sticky / "p-link")
    assert f"{sticky / 'p-link'} is a symbolic link owned by uid {user.uid}" in _problem(node, "p")


def test_exec_dir_under_a_sticky_dir_is_fine_but_a_sticky_plugin_dir_is_not(node: Layout) -> None:
    sticky = node.user.area / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    exec_dir = sticky / "exec"
    exec_dir.mkdir(mode=0o755)
    (exec_dir / "ok").mkdir(mode=0o755)
    shutil.copy(node.install("tmpl"), exec_dir / "ok" / "ok")
    (exec_dir / "st").mkdir()
    (exec_dir / "st").chmod(0o1777)
    shutil.copy(node.install("tmpl2"), exec_dir / "st" / "st")
    found = {c.name: c for c in scan(str(exec_dir))}
    assert found["ok"].valid, found["ok"].problem
    assert found["st"].problem == f"unsafe permissions: {exec_dir / 'st'} is group- and world-writable (mode 1777)"


def test_every_problem_of_a_candidate_is_reported_at_once(node: Layout, user: HostileUser) -> None:
    exe = node.install("p", mode=0o777)
    os.chown(exe.parent, user.uid, user.gid)
    os.chmod(exe.parent, 0o775)
    problem = _problem(node, "p")
    assert f"{exe.parent} is owned by uid {user.uid}" in problem
    assert f"{exe} is group- and world-writable (mode 0777)" in problem


# --- the file that runs is the file that was checked --------------------------------------------------


EXCHANGE = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
a, b = (os.fsencode(x) for x in sys.argv[1:3])
RENAME_EXCHANGE, AT_FDCWD = 2, -100
while True:
    if libc.renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) != 0:
        os._exit(3)
"""


def test_exchange_race_during_a_loop_of_setups_never_runs_the_users_file(node: Layout, user: HostileUser) -> None:
    # The user owns the directory the plugin's symlink leads to and exchanges the real plugin
    # with their own file as fast as they can while root runs setups.
    d = user.home() / "race"
    user.run(["mkdir", "-m", "755", str(d)])
    good, evil = d / "plugin", d / "evil"
    good.write_text(GOOD)
    good.chmod(0o755)
    user.sh(f"printf '%s' '{node.evil_script()}' > {evil} && chmod 755 {evil}")
    (node.exec / "p").mkdir(mode=0o755)
    (node.exec / "p" / "p").symlink_to(good)
    racer = user.python(EXCHANGE, str(good), str(evil))
    try:
        m = node.manager("p")
        outcomes = set()
        for i in range(40):
            try:
                m.setup(PodRef("default", f"web-{i}", f"id{i}"))
                outcomes.add("ran")
            except NetpluginError as e:
                outcomes.add(type(e).__name__)
        assert racer.poll() is None, "the exchange loop must still be running"
    finally:
        racer.kill()
    assert outcomes == {"PluginInvalid"}
    assert not node.pwned.exists()


def test_a_long_lived_manager_rechecks_before_every_call(node: Layout, user: HostileUser) -> None:
    # The daemon selects once; later the plugin's dir changes hands and the user swaps the file
    # with a plain mv (no race): the next call refuses it instead of running it.
    exe = node.install("p")
    m = node.manager("p")
    m.setup(POD)
    assert f"{exe} setup default web-0 abc123" in (exe.parent / "calls.log").read_text()
    os.chown(exe.parent, user.uid, user.gid)
    _swap_as(user, exe, node.evil_script())
    with pytest.raises(PluginInvalid, match=f"owned by uid {user.uid}"):
        m.teardown(POD)
    assert not node.pwned.exists()


def test_a_binary_runs_from_the_descriptor_that_was_checked(node: Layout) -> None:
    # Swap the file between the check and the exec (here: root does it, in the runner seam): the
    # checked inode runs. /bin/true exits 0, /bin/false 1.
    from netplugin.core.execplugin import invoke

    exe = node.install("p")
    shutil.copy("/bin/true", exe)
    exe.chmod(0o755)
    swapped = []

    def swapping_runner(argv: Any, **kw: Any) -> Any:
        assert kw.get("exe_fd") is not None, "a binary is run by descriptor"
        tmp = exe.with_name("new")
        shutil.copy("/bin/false", tmp)
        tmp.chmod(0o755)
        os.replace(tmp, exe)
        swapped.append(True)
        return invoke.run(argv, **kw)

    from netplugin.core.execplugin.exec_plugin import ExecPlugin

    plugin = ExecPlugin("p", str(exe), exec_dir=str(node.exec))
    plugin._runner = swapping_runner
    plugin._validate = True
    plugin.init(_ctx(node))  # would fail with exit status 1 had the swapped-in /bin/false run
    assert swapped == [True]
    with pytest.raises(PluginFailed, match="exit status 1"):
        ExecPlugin("p", str(exe), exec_dir=str(node.exec)).init(_ctx(node))


def test_a_script_sees_its_own_path_as_0(node: Layout) -> None:
    exe = node.install("p")
    node.manager("p").setup(POD)
    assert (exe.parent / "calls.log").read_text() == f"{exe} init\n{exe} setup default web-0 abc123\n"


def _ctx(node: Layout) -> Any:
    from netplugin.core.plugin import CallContext

    return CallContext(env={"PATH": "/usr/bin:/bin"}, state_dir=str(node.base / "state"), timeout=10)


# --- shebang interpreters ------------------------------------------------------------------------------


def test_missing_interpreter_is_reported_as_the_interpreter_missing(node: Layout) -> None:
    exe = node.install("p", script="#!/nonexistent/bin/bash -e\nexit 0\n")
    with pytest.raises(PluginFailed) as info:
        node.manager("p").setup(POD)
    msg = info.value.message
    assert f"cannot execute {exe}: its interpreter /nonexistent/bin/bash (from the #! line of {exe})" in msg
    assert msg.endswith("does not exist") and "No such file" not in msg


def test_missing_interpreter_through_the_cli_names_it(node: Layout) -> None:
    node.install("p", script="#!/usr/bin/no-such-python3\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_")}
    env.update(NETPLUGIN_PLUGIN_DIR=str(node.exec), NETPLUGIN_STATE_DIR=str(node.base / "state"),
               NETPLUGIN_RUN_DIR=str(node.base / "run"), NETPLUGIN_USE_DAEMON="never", NETPLUGIN_HOST="none")
    r = subprocess.run([sys.executable, "-m", "netplugin", "--plugin", "p", "setup", "default", "web-0", "abc123"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    assert "its interpreter /usr/bin/no-such-python3" in r.stderr and "does not exist" in r.stderr


def test_interpreter_the_user_controls_is_refused(node: Layout, user: HostileUser) -> None:
    interp = user.home() / "sh"
    user.run(["cp", "/bin/sh", str(interp)])
    node.install("p", script=f"#!{interp}\nexit 0\n")
    assert f"unsafe interpreter {interp}" in _problem(node, "p")
    with pytest.raises(PluginInvalid, match="unsafe interpreter"):
        node.manager("p").setup(POD)


def test_open_executable_returns_the_checked_inode(node: Layout) -> None:
    exe = node.install("p")
    found = open_executable(str(exe), exec_dir=str(node.exec))
    assert not isinstance(found, str)
    with found:
        st = os.stat(f"/proc/self/fd/{found.fd}")
        assert (st.st_dev, st.st_ino) == (exe.stat().st_dev, exe.stat().st_ino)
        assert stat.S_ISREG(st.st_mode) and found.interpreter == "/bin/sh"
