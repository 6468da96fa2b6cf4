"""netplugin.core.execplugin.invoke: real processes, real process trees, real signals."""

from __future__ import annotations

import errno
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from netplugin.core.execplugin._proctree import reap_adopted
from netplugin.core.execplugin.invoke import Completed, SpawnError, adopt_orphans, run, start
from netplugin.core.procs import proc_stat

ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
# Generous: a call that should finish on its own and instead hangs shows up as timed_out.
NO_HANG = 30.0

Script = Callable[[str], Path]


@pytest.fixture
def script(tmp_path: Path) -> Script:
    """script(body) -> path of an executable bash script in its own directory."""
    count = iter(range(1000))

    def make(body: str) -> Path:
        d = tmp_path / f"s{next(count)}"
        d.mkdir()
        p = d / "run"
        p.write_text("#!/usr/bin/env bash\n" + body)
        p.chmod(0o755)
        return p

    return make


# --- what goes in and out -----------------------------------------------------------------------------------


def test_stdout_and_stderr_are_captured_separately(script: Script) -> None:
    p = script("printf 'to-out'; printf 'to-err' >&2; printf ' more-out'; exit 0\n")
    done = run([str(p)], env=ENV, timeout=NO_HANG)
    assert done.stdout == b"to-out more-out"
    assert done.stderr == b"to-err"
    assert done.returncode == 0 and done.ok and not done.timed_out
    assert done.pid > 0


def test_argv_is_passed_exactly_without_a_shell(script: Script) -> None:
    p = script("printf '%s\\n' \"$@\"\n")
    args = ["a b", "$HOME", "; rm -rf /", "*", ""]
    done = run([str(p), *args], env=ENV, timeout=NO_HANG)
    assert done.stdout.decode().split("\n")[:-1] == args
    assert done.argv == [str(p), *args]


def test_environment_is_exactly_the_given_one() -> None:
    done = run(["/usr/bin/env"], env={"ONLY": "this"}, timeout=NO_HANG)
    assert done.stdout == b"ONLY=this\n"


def test_runs_in_root_directory(script: Script) -> None:
    done = run([str(script("pwd\n"))], env=ENV, timeout=NO_HANG)
    assert done.stdout == b"/\n"


def test_stdin_is_delivered(script: Script) -> None:
    data = os.urandom(512 * 1024)  # larger than a pipe buffer: written while output is read
    done = run([str(script("cat\n"))], env=ENV, stdin=data, timeout=NO_HANG)
    assert not done.timed_out
    assert done.stdout == data


@pytest.mark.parametrize("stdin", [None, b""], ids=["none", "empty"])
def test_no_stdin_is_an_immediate_eof(script: Script, stdin: bytes | None) -> None:
    # a plugin that reads stdin must not wait for input that never comes
    done = run([str(script("cat; echo eof\n"))], env=ENV, stdin=stdin, timeout=NO_HANG)
    assert not done.timed_out
    assert done.stdout == b"eof\n"


@pytest.mark.parametrize(
    "body",
    [
        pytest.param("exit 0\n", id="exits-at-once"),
        pytest.param("sleep 0.3; exit 0\n", id="exits-later"),
        pytest.param("head -c 10 >/dev/null; sleep 0.3; exit 0\n", id="reads-a-little"),
        pytest.param("exec 0<&-; sleep 0.3; exit 0\n", id="closes-stdin"),
    ],
)
def test_plugin_that_does_not_read_large_stdin_does_not_hang(script: Script, body: str) -> None:
    done = run([str(script(body))], env=ENV, stdin=b"x" * (1 << 20), timeout=NO_HANG)
    assert not done.timed_out
    assert done.returncode == 0


# --- exit status and signals --------------------------------------------------------------------------------


@pytest.mark.parametrize("code", [1, 3, 255])
def test_exit_status_is_reported(script: Script, code: int) -> None:
    done = run([str(script(f"exit {code}\n"))], env=ENV, timeout=NO_HANG)
    assert done.returncode == code
    assert done.signal is None
    assert not done.ok


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGSEGV, signal.SIGABRT])
def test_death_by_signal_is_a_negative_returncode(script: Script, sig: signal.Signals) -> None:
    done = run([str(script(f"kill -s {sig.name[3:]} $$\n"))], env=ENV, timeout=NO_HANG)
    assert done.returncode == -sig
    assert done.signal == sig
    assert not done.timed_out
    assert not done.ok


@pytest.mark.parametrize(
    ("fields", "ok", "sig"),
    [
        ({"returncode": 0}, True, None),
        ({"returncode": 2}, False, None),
        ({"returncode": -9}, False, 9),
        ({"returncode": 0, "leftover": 1}, False, None),
        ({"returncode": -15, "timed_out": True}, False, 15),
        ({"returncode": None}, False, None),
    ],
)
def test_completed_ok_and_signal(fields: dict[str, Any], ok: bool, sig: int | None) -> None:
    done = Completed(argv=["x"], **fields)
    assert done.ok is ok
    assert done.signal == sig


# --- cannot start -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "mode", "err"),
    [
        pytest.param(None, None, errno.ENOENT, id="missing"),
        pytest.param("#!/bin/sh\nexit 0\n", 0o644, errno.EACCES, id="not-executable"),
        pytest.param("no shebang, not a binary\n", 0o755, errno.ENOEXEC, id="exec-format"),
        pytest.param("#!/nonexistent/interpreter\n", 0o755, errno.ENOENT, id="bad-interpreter"),
    ],
)
def test_spawn_error(tmp_path: Path, content: str | None, mode: int | None, err: int) -> None:
    p = tmp_path / "plugin"
    if content is not None:
        p.write_text(content)
        assert mode is not None
        p.chmod(mode)
    with pytest.raises(SpawnError) as info:
        run([str(p), "init"], env=ENV, timeout=NO_HANG)
    assert info.value.errno == err
    assert info.value.path == str(p)
    assert str(p) in str(info.value)
    assert info.value.reason == os.strerror(err)


# --- time limits and process trees --------------------------------------------------------------------------


def _zombie_children() -> list[int]:
    """Our children (of any thread) that have exited and were not reaped."""
    out = []
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/children") as f:
            for pid in map(int, f.read().split()):
                with open(f"/proc/{pid}/stat", "rb") as st:
                    data = st.read()
                if data[data.rfind(b")") + 2 :][:1] == b"Z":
                    out.append(pid)
    return out


@pytest.fixture(params=["walk", "adopt"])
def finding(request: pytest.FixtureRequest) -> Any:
    """How a call's stragglers are found: by walking /proc (the CLI) or as a subreaper (the daemon)."""
    if request.param == "walk":
        yield request.param
        return
    before = set(_zombie_children())
    assert adopt_orphans()
    try:
        yield request.param
    finally:
        deadline = time.monotonic() + 5
        while _adopted_zombies() - before and time.monotonic() < deadline:
            reap_adopted()
            time.sleep(0.02)
        adopt_orphans(False)
    assert _adopted_zombies() <= before, "an adopted process was left a zombie"


def _adopted_zombies() -> set[int]:
    """Our zombie children outside our own session: what reap_adopted answers for. A child of our
    own session is its waiter's to reap (a subprocess another thread of this process runs)."""
    ours = str(os.getsid(0)).encode()
    return {pid for pid in _zombie_children() if (proc_stat(pid) or [b"", b"", b"", ours])[3] != ours}


def test_timeout_kills_the_tree_including_grandchildren_that_ignore_sigterm(
    plugin_dir: Any, procs: Any, finding: str
) -> None:
    p = plugin_dir.install("tree")
    p.set("setup", spawn=3, sleep=300)  # 3 background children with SIGTERM ignored, then a long sleep
    done = run([str(p.exe), "setup", "ns", "pod", "id"], env=ENV, timeout=1.0, kill_grace=0.5)
    assert done.timed_out
    assert not done.ok
    children = procs.read_pids(p.dir / "children.pids")
    assert len(children) == 3
    assert procs.still_alive(children) == []
    assert not procs.alive(done.pid)


def test_leader_that_ignores_sigterm_is_killed_after_the_grace(script: Script, procs: Any, finding: str) -> None:
    p = script("trap '' TERM\nsleep 300 &\necho $! > \"$(dirname \"$0\")/child\"\nsleep 300\n")
    done = run([str(p)], env=ENV, timeout=1.0, kill_grace=0.3)
    assert done.timed_out
    assert done.returncode == -signal.SIGKILL
    assert any("SIGKILL" in n for n in done.notes)
    assert procs.still_alive(procs.read_pids(p.parent / "child")) == []


SETSID_TREE = r"""
d=$(dirname "$0")
sid() { awk '{print $6}' "/proc/$1/stat"; }
wait_detached() { for _ in $(seq 200); do [ "$(sid "$1")" = "$1" ] && return; sleep 0.01; done; }
trap '' TERM                             # everything below ignores SIGTERM: only SIGKILL ends it
setsid sleep 300 &                       # a child in its own session
c=$!; wait_detached "$c"; echo "$c $(sid "$c")" >> "$d/children"
bash -c 'setsid sleep 300 & echo $! > "$1/grandchild"; sleep 300' _ "$d" &   # a grandchild in its own session
for _ in $(seq 200); do [ -s "$d/grandchild" ] && break; sleep 0.01; done
g=$(cat "$d/grandchild"); wait_detached "$g"; echo "$g $(sid "$g")" >> "$d/children"
echo ready >> "$d/children"
sleep 300
"""


def test_timeout_kills_children_that_called_setsid(script: Script, procs: Any, finding: str) -> None:
    p = script(SETSID_TREE)
    done = run([str(p)], env=ENV, timeout=4.0, kill_grace=0.5)
    assert done.timed_out
    lines = (p.parent / "children").read_text().split("\n")
    assert "ready" in lines
    pids = []
    for line in lines:
        if line and line != "ready":
            pid, sid = map(int, line.split())
            assert sid == pid  # it really left the plugin's session (and so its process group)
            pids.append(pid)
    assert len(pids) == 2
    assert procs.still_alive(pids) == []


def test_leftover_children_after_a_normal_exit_are_killed_and_counted(script: Script, procs: Any, finding: str) -> None:
    p = script(
        'd=$(dirname "$0")\n'
        'sleep 300 & echo $! >> "$d/pids"\n'
        "(trap '' TERM; exec sleep 300) & echo $! >> \"$d/pids\"\n"
        'echo done\nexit 0\n'
    )
    done = run([str(p)], env=ENV, timeout=NO_HANG, kill_grace=0.3)
    assert done.returncode == 0
    assert done.stdout == b"done\n"
    assert done.leftover == 2
    assert not done.timed_out
    assert not done.ok
    assert procs.still_alive(procs.read_pids(p.parent / "pids")) == []


def test_scriptable_spawn_leftovers_are_killed(plugin_dir: Any, procs: Any, finding: str) -> None:
    p = plugin_dir.install("spawner")
    p.set("teardown", spawn=2)
    done = run([str(p.exe), "teardown", "ns", "pod", "id"], env=ENV, timeout=NO_HANG, kill_grace=0.3)
    assert done.returncode == 0
    assert done.leftover >= 2
    assert procs.still_alive(procs.read_pids(p.dir / "children.pids")) == []


def test_no_leftover_when_children_were_waited_for(script: Script, finding: str) -> None:
    done = run([str(script("sleep 0.1 & sleep 0.1 & wait\n"))], env=ENV, timeout=NO_HANG)
    assert done.leftover == 0
    assert done.ok


def test_a_daemon_that_detached_with_setsid_survives_a_normal_exit(script: Script, procs: Any, finding: str) -> None:
    # The contract: a plugin that wants a daemon detaches it with setsid; only its own group is swept.
    p = script('setsid sleep 300 </dev/null >/dev/null 2>&1 &\necho $! > "$(dirname "$0")/daemon"\n'
               'for _ in $(seq 200); do [ "$(awk \'{print $6}\' /proc/$!/stat)" = "$!" ] && break; sleep 0.01; done\n')
    done = run([str(p)], env=ENV, timeout=NO_HANG)
    (daemon,) = procs.read_pids(p.parent / "daemon")
    try:
        assert done.ok
        assert done.leftover == 0
        assert procs.alive(daemon)
    finally:
        os.kill(daemon, signal.SIGKILL)


def test_what_left_the_group_or_the_environment_is_found_and_killed(script: Script, procs: Any, finding: str) -> None:
    # set -m: its own process group; env -i: no trace of the call in its environment; the leader
    # exits first, so both are orphans (adopted by this process when it is a subreaper).
    p = script('d=$(dirname "$0")\nset -m\nsleep 300 &\necho $! >> "$d/pids"\nset +m\n'
               'env -i /bin/sleep 301 </dev/null >/dev/null 2>&1 &\necho $! >> "$d/pids"\nexit 0\n')
    done = run([str(p)], env=ENV, timeout=NO_HANG, kill_grace=0.3)
    assert done.returncode == 0 and done.leftover == 2
    assert procs.still_alive(procs.read_pids(p.parent / "pids")) == []


def test_an_adopted_daemon_is_reaped_by_a_later_call_once_it_exits(script: Script, procs: Any) -> None:
    assert adopt_orphans()
    try:
        p = script('setsid sleep 0.3 </dev/null >/dev/null 2>&1 &\necho $! > "$(dirname "$0")/daemon"\n'
                   'for _ in $(seq 200); do\n'
                   '  [ "$(awk \'{print $6}\' /proc/$!/stat)" = "$!" ] && break; sleep 0.01\n'
                   'done\n')
        assert run([str(p)], env=ENV, timeout=NO_HANG).ok
        (daemon,) = procs.read_pids(p.parent / "daemon")
        with open(f"/proc/{daemon}/stat") as f:
            assert int(f.read().rsplit(")", 1)[1].split()[1]) == os.getpid()  # adopted: its parent is us
        deadline = time.monotonic() + 10
        while daemon not in _zombie_children() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert daemon in _zombie_children()  # it exited; nobody but us can reap it
        assert run(["/bin/true"], env=ENV, timeout=NO_HANG).ok
        assert daemon not in _zombie_children() and not os.path.exists(f"/proc/{daemon}")
    finally:
        adopt_orphans(False)


def test_a_leader_is_left_to_its_waiter_by_a_reap() -> None:
    # Started from this (the main) thread: an exited leader is a zombie among the adopted ones,
    # but registered, so only its Popen reaps it and sees its real status.
    assert adopt_orphans()
    try:
        bg = start(["sh", "-c", "exit 3"], env=ENV)
        deadline = time.monotonic() + 10
        while bg.proc.pid not in _zombie_children() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert reap_adopted() == 0
        assert bg.proc.wait() == 3
        bg.stop()
    finally:
        adopt_orphans(False)


def test_a_child_of_our_own_session_is_left_to_its_waiter() -> None:
    # What the caller runs itself (the daemon's nft, say) stays in its session: a reap never takes it.
    import subprocess

    assert adopt_orphans()
    try:
        child = subprocess.Popen(["sh", "-c", "exit 4"])
        deadline = time.monotonic() + 10
        while child.pid not in _zombie_children() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert child.pid in _zombie_children()
        assert reap_adopted() == 0
        assert child.wait() == 4
    finally:
        adopt_orphans(False)


# --- bounded output -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stream", "size", "truncated"),
    [
        ("stdout", 10000, True),
        ("stderr", 10000, True),
        ("stdout", 4096 - 8, False),
        ("stderr", 4096 - 8, False),
    ],
)
def test_output_is_bounded_stdout_keeps_head_stderr_keeps_tail(
    script: Script, stream: str, size: int, truncated: bool
) -> None:
    redirect = ">&2" if stream == "stderr" else ""
    p = script(f"{{ printf HEAD; head -c {size} /dev/zero | tr '\\0' x; printf TAIL; }} {redirect}\n")
    done = run([str(p)], env=ENV, timeout=NO_HANG, max_output=4096)
    data = getattr(done, stream)
    other = done.stderr if stream == "stdout" else done.stdout
    assert other == b""
    assert getattr(done, f"{stream}_truncated") is truncated
    if not truncated:
        assert data == b"HEAD" + b"x" * size + b"TAIL"
    elif stream == "stdout":
        assert len(data) == 4096
        assert data.startswith(b"HEADxxx") and b"TAIL" not in data
    else:
        assert len(data) == 4096
        assert data.endswith(b"xxxTAIL") and b"HEAD" not in data


def test_huge_output_does_not_block_the_plugin(script: Script) -> None:
    # 8 MiB through a 1 MiB bound: the pipe keeps draining, the plugin is not stuck on a full pipe
    done = run([str(script("head -c 8388608 /dev/zero; echo fine >&2\n"))], env=ENV, timeout=NO_HANG)
    assert not done.timed_out
    assert done.returncode == 0
    assert len(done.stdout) == 1 << 20 and done.stdout_truncated
    assert done.stderr == b"fine\n"


# --- background helpers -------------------------------------------------------------------------------------


def test_background_reads_lines_and_stop_kills_its_group(procs: Any) -> None:
    # both lines in one write: the second must not hide in a buffer filled by the first read_line
    with start(["bash", "-c", "sleep 300 & printf '%s\\nready\\n' $!; wait"], env=ENV) as bg:
        child = int(bg.read_line(NO_HANG))
        assert bg.read_line(NO_HANG) == b"ready\n"
        assert bg.read_line(0.05) == b""  # nothing more: read_line returns instead of blocking
        assert procs.alive(child)
    assert procs.still_alive([child]) == []
    assert bg.proc.returncode is not None


def test_background_spawn_error(tmp_path: Path) -> None:
    with pytest.raises(SpawnError) as info:
        start([str(tmp_path / "missing")])
    assert info.value.errno == errno.ENOENT
