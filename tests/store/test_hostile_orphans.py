"""Hostile node, class 3 (and 7's escapes): only processes netplugin started are its plugin processes.

A throwaway local user (``tests/support/hostile.py``) plants processes dressed up as plugin calls
(``NETPLUGIN_*`` variables, a forged ``NETPLUGIN_CALL_ID``, the call's argv, a session of
their own); root does the same with a copied environment. Neither is waited for nor signalled
by orphan settling before a new action or by gc. A plugin's own ``setsid`` daemon survives,
even when the call's leader is gone; processes that left the call's process group
(``set -m``) or environment (``env -i``) do not.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from netplugin.core.errors import PluginFailed
from netplugin.core.execplugin.calls import ENV as CALL_ENV
from netplugin.core.execplugin.calls import call_key, make_token, verify_token
from netplugin.core.names import PodRef
from netplugin.manager.gc import run_gc
from netplugin.store.orphans import plugin_processes
from tests.support.hostile import HostileUser, hostile_user
from tests.support.procs import pid_alive
from tests.support.waits import WITHIN, wait_for

POD = PodRef("default", "web-0", "infra0")
ARGV = ["default", "web-0", "infra0"]


@pytest.fixture
def user() -> Iterator[HostileUser]:
    yield from hostile_user()


def _dead_owner_record(state_dir: str) -> None:
    """A setting-up record whose owner is dead: the next action on the pod settles orphans first."""
    code = (f"from netplugin.store.state import StateStore; from netplugin.core.names import PodRef; "
            f"StateStore({state_dir!r}).begin(PodRef(*{ARGV!r}), 'sc', 'v1', '')")
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ))


def _dressed_env(state_dir: str, token: str) -> dict[str, str]:
    return {
        "PATH": "/usr/bin:/bin",
        "NETPLUGIN_STATE_DIR": state_dir,
        "NETPLUGIN_ACTION": "setup",
        "NETPLUGIN_PLUGIN": "sc",
        "NETPLUGIN_POD_NAMESPACE": POD.namespace,
        "NETPLUGIN_POD_NAME": POD.name,
        "NETPLUGIN_INFRA_ID": POD.infra_id,
        "NETPLUGIN_NETNS": "",
        CALL_ENV: token,
    }


# A session leader whose argv ends like a setup call's: what the old code took for a call leader.
LOOKALIKE = ["setsid", "/bin/sh", "-c", "sleep 300; :", "sc", "setup", *ARGV]


def _planted_pid(starter: subprocess.Popen[bytes], argv_tail: list[str]) -> int:
    found: list[int] = []

    def look() -> bool:
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")[:-1]
                if [a.decode() for a in argv[-len(argv_tail):]] == argv_tail and os.getsid(int(name)) == int(name):
                    found.append(int(name))
                    return True
            except (OSError, UnicodeDecodeError):
                continue
        return False

    wait_for(look, "the planted process", WITHIN)
    return found[0]


def test_a_users_planted_lookalike_never_stalls_a_setup_nor_is_signalled(np_dirs: dict[str, str], make_manager: Any,
                                                                          sc: Any, user: HostileUser) -> None:
    state_dir = np_dirs["state_dir"]
    call_key(state_dir)  # a key exists: netplugin has made calls on this node before
    _dead_owner_record(state_dir)
    planter = user.start(["env", "-i", *(f"{k}={v}" for k, v in _dressed_env(state_dir, "1.2.3").items()),
                          *LOOKALIKE])
    planted = _planted_pid(planter, ["setup", *ARGV])
    assert plugin_processes(state_dir, pod=POD) == []
    m = make_manager(plugin="sc", timeouts={"setup": 120})
    assert m.state.mark_teardown(POD) == []  # nothing waited for, nothing stopped
    m.setup(POD)
    assert pid_alive(planted)


def test_a_root_process_with_a_copied_environment_and_forged_token_is_ignored(
    np_dirs: dict[str, str], make_manager: Any, sc: Any, reaper: list[int]
) -> None:
    state_dir = np_dirs["state_dir"]
    key = call_key(state_dir)
    assert key is not None
    env = _dressed_env(state_dir, "")
    real = make_token(key, env)
    forged = real[:-1] + ("0" if real[-1] != "0" else "1")
    env[CALL_ENV] = forged
    assert verify_token(key, {**env, CALL_ENV: real}) and not verify_token(key, env)
    # the right token for another pod does not fit this one either
    other = dict(env, NETPLUGIN_POD_NAME="web-1")
    stolen = dict(env, **{CALL_ENV: make_token(key, other)})
    for e in (env, stolen):
        p = subprocess.Popen(LOOKALIKE, env=e, stdin=subprocess.DEVNULL)
        reaper.append(_planted_pid(p, ["setup", *ARGV]))
    _dead_owner_record(state_dir)
    assert plugin_processes(state_dir) == []
    report = run_gc(make_manager(plugin="sc"))
    assert not [a for a in report.actions if a.kind == "settle"]
    assert all(pid_alive(pid) for pid in reaper)


def test_gc_is_not_stalled_by_a_users_lookalike(np_dirs: dict[str, str], make_manager: Any, sc: Any,
                                                user: HostileUser) -> None:
    state_dir = np_dirs["state_dir"]
    call_key(state_dir)
    planter = user.start(["env", "-i", *(f"{k}={v}" for k, v in _dressed_env(state_dir, "9.9.9").items()),
                          *LOOKALIKE])
    planted = _planted_pid(planter, ["setup", *ARGV])
    report = run_gc(make_manager(plugin="sc", timeouts={"setup": 120}))
    assert [a for a in report.actions if a.kind == "settle"] == []
    assert pid_alive(planted)


# --- real orphans: the call's session, not its group or environment; never a setsid daemon ---------------


def _kill_cli_during_setup(cli_env: dict[str, str], sc: Any, script: str) -> subprocess.Popen[bytes]:
    sc.exe.write_text(script)
    env = dict(cli_env, NETPLUGIN_PLUGIN="sc")
    p = subprocess.Popen([sys.executable, "-m", "netplugin", "setup", *ARGV], env=env,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: (sc.dir / "ready").exists(), "the plugin to start its children", WITHIN)
    p.kill()
    p.wait()
    return p


def test_gc_spares_a_setsid_daemon_whose_call_leader_is_gone(cli_env: dict[str, str], sc: Any,
                                                             make_manager: Any, reaper: list[int]) -> None:
    script = """#!/bin/bash
d=$(dirname "$0")
[ "$1" = setup ] || exit 0
setsid sleep 300 </dev/null >/dev/null 2>&1 &
echo $! > "$d/daemon"
for _ in $(seq 200); do [ "$(awk '{print $6}' /proc/$!/stat)" = "$!" ] && break; sleep 0.01; done
touch "$d/ready"
sleep 0.5
"""
    _kill_cli_during_setup(cli_env, sc, script)
    daemon = int((sc.dir / "daemon").read_text())
    reaper.append(daemon)
    wait_for(lambda: not any(p.call_leader for p in plugin_processes(cli_env["NETPLUGIN_STATE_DIR"])),
              "the call's leader to exit", WITHIN)
    assert daemon not in [p.pid for p in plugin_processes(cli_env["NETPLUGIN_STATE_DIR"])]
    report = run_gc(make_manager(plugin="sc", timeouts={"setup": 120}))
    assert [a.reason for a in report.actions] == ["its setup was interrupted"]
    assert pid_alive(daemon)


def test_gc_kills_what_left_the_group_or_the_environment_once_the_leader_exits(
    cli_env: dict[str, str], sc: Any, make_manager: Any, reaper: list[int]
) -> None:
    script = """#!/bin/bash
d=$(dirname "$0")
[ "$1" = setup ] || exit 0
set -m
sleep 300 &
echo $! >> "$d/kids"
set +m
env -i /bin/sleep 301 &
echo $! >> "$d/kids"
touch "$d/ready"
sleep 1
"""
    _kill_cli_during_setup(cli_env, sc, script)
    kids = [int(x) for x in (sc.dir / "kids").read_text().split()]
    reaper.extend(kids)
    found = {p.pid for p in plugin_processes(cli_env["NETPLUGIN_STATE_DIR"], pod=POD)}
    assert set(kids) <= found  # the env -i one through the call's session
    report = run_gc(make_manager(plugin="sc", timeouts={"setup": 120}))
    assert "its setup was interrupted" in [a.reason for a in report.actions]
    assert not any(pid_alive(k) for k in kids)


def test_a_live_call_kills_what_left_its_group_or_environment(make_manager: Any, sc: Any,
                                                              reaper: list[int]) -> None:
    sc.exe.write_text("""#!/bin/bash
d=$(dirname "$0")
[ "$1" = setup ] || exit 0
set -m
sleep 300 &
echo $! >> "$d/kids"
set +m
env -i /bin/sleep 301 </dev/null >/dev/null 2>&1 &
echo $! >> "$d/kids"
exit 0
""")
    with pytest.raises(PluginFailed, match="left 2 process"):
        make_manager(plugin="sc").setup(POD)
    kids = [int(x) for x in (sc.dir / "kids").read_text().split()]
    reaper.extend(kids)
    wait_for(lambda: not any(pid_alive(k) for k in kids), "the leftovers to die", within=5)


def test_the_call_token_binds_the_calls_identity(tmp_path: Path) -> None:
    key = call_key(str(tmp_path))
    assert key is not None and (tmp_path / "call.key").stat().st_mode & 0o777 == 0o600
    env = _dressed_env(str(tmp_path), "")
    env[CALL_ENV] = make_token(key, env)
    assert verify_token(key, env)
    for k in ("NETPLUGIN_ACTION", "NETPLUGIN_POD_NAME", "NETPLUGIN_STATE_DIR"):
        assert not verify_token(key, dict(env, **{k: "x"})), k
    assert not verify_token(b"k" * 32, env)
