"""A plugin's ``setsid`` daemon, started the obvious way, is left alone (issue 21, class 7).

The obvious plugin code is ``setsid mydaemon </dev/null >/dev/null 2>&1 &`` and ``exit 0``: the
background child calls setsid only after the plugin may have exited, so a sweep of the call's
session that runs at once kills it (and fails the setup for a "leftover"). The plugin here does
exactly that, with no waiting of any kind; 50 setups in a row, through the CLI and the daemon.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.procs import pid_alive
from tests.support.waits import wait_for

RUNS = 50

NAIVE = """#!/bin/bash
if [ "$1" = setup ]; then
    setsid sleep 300 </dev/null >/dev/null 2>&1 &
    echo $! >> "$(dirname "$0")/daemons"
fi
exit 0
"""

# A child that stays in the session is still the call's leftover: swept, and the setup fails.
STAYS = """#!/bin/bash
if [ "$1" = setup ]; then
    sleep 300 </dev/null >/dev/null 2>&1 &
    echo $! >> "$(dirname "$0")/daemons"
fi
exit 0
"""


@pytest.fixture
def daemons(plugin_dir: Any) -> Iterator[Any]:
    """Installs a plugin (by script) and kills whatever it recorded in ``daemons`` at the end."""
    installed: list[Any] = []

    def install(name: str, script: str) -> Any:
        p = plugin_dir.install(name, script=script)
        installed.append(p)
        return p

    yield install
    for p in installed:
        path = p.dir / "daemons"
        for line in path.read_text().split() if path.exists() else []:
            try:
                os.kill(int(line), signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.parametrize("via", ["cli", "daemon"])
def test_a_naive_setsid_daemon_survives_50_setups_in_a_row(cli: Any, start_daemon: Any, daemons: Any,
                                                           via: str) -> None:
    p = daemons("sd", NAIVE)
    env = {"NETPLUGIN_PLUGIN": "sd"}
    if via == "daemon":
        start_daemon(env=env)
    failed = []
    for i in range(RUNS):
        r = cli("setup", "default", f"web-{i}", f"infra{i}", mode="always" if via == "daemon" else "never", env=env)
        if r.returncode != 0:
            failed.append(r.stderr)
    pids = [int(x) for x in (p.dir / "daemons").read_text().split()]
    dead = [pid for pid in pids if not pid_alive(pid)]
    assert (failed, len(pids), dead) == ([], RUNS, []), f"{len(failed)} of {RUNS} setups failed: {failed[:2]}"


def test_a_child_that_stays_in_the_session_is_still_swept(cli: Any, daemons: Any) -> None:
    p = daemons("stay", STAYS)
    r = cli("setup", "default", "web-0", "infra0", mode="never", env={"NETPLUGIN_PLUGIN": "stay"})
    assert r.returncode == 1 and "left 1 process(es) running" in r.stderr, r
    (pid,) = [int(x) for x in (p.dir / "daemons").read_text().split()]
    assert not pid_alive(pid)


# The daemon is a subreaper (it finds a call's stragglers among its children, not in all of
# /proc): a plugin's detached daemon becomes its child once the call's leader is gone, and it
# must be reaped when it exits, or every such daemon would stay a zombie of netplugin's.
BRIEF = """#!/bin/bash
if [ "$1" = setup ]; then
    setsid sleep 0.5 </dev/null >/dev/null 2>&1 &
    echo $! >> "$(dirname "$0")/daemons"
fi
exit 0
"""


def _parent_and_state(pid: int) -> tuple[int, bytes] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), fields[0]


def test_the_daemon_adopts_a_detached_daemon_and_reaps_it_when_it_exits(cli: Any, start_daemon: Any,
                                                                         daemons: Any) -> None:
    p = daemons("brief", BRIEF)
    env = {"NETPLUGIN_PLUGIN": "brief"}
    d = start_daemon(env=env)
    r = cli("setup", "default", "web-0", "infra0", mode="always", env=env)
    assert r.returncode == 0, r.stderr
    (pid,) = [int(x) for x in (p.dir / "daemons").read_text().split()]
    seen = _parent_and_state(pid)
    assert seen is not None and seen[0] == d.proc.pid  # adopted by the daemon, not by init
    # Reaped when it exits (SIGCHLD), with no further call: never left a zombie of netplugin's.
    wait_for(lambda: _parent_and_state(pid) is None, "the detached daemon to exit and be reaped", within=30)


def test_through_the_daemon_a_child_that_stays_in_the_session_is_swept(cli: Any, start_daemon: Any,
                                                                       daemons: Any) -> None:
    p = daemons("stay", STAYS)
    env = {"NETPLUGIN_PLUGIN": "stay"}
    start_daemon(env=env)
    r = cli("setup", "default", "web-0", "infra0", mode="always", env=env)
    assert r.returncode == 1 and "left 1 process(es) running" in r.stderr, r
    (pid,) = [int(x) for x in (p.dir / "daemons").read_text().split()]
    assert not pid_alive(pid)
