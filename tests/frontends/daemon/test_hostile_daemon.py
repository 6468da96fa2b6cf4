"""Hostile node, class 1 in the daemon: it selects a plugin once, and re-checks it before every call.

No race: the daemon validated the plugin at start; afterwards the plugin's directory changes
hands (a packaging mistake) and an unprivileged user swaps the executable with ``mv``. The
next request must refuse it, and the user's file must never run. Then root repairs the dir
and puts the real plugin back: the daemon runs it again without a restart.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.hostile import HostileUser, hostile_user

POD = ("default", "web-0", "infra0")


@pytest.fixture
def user() -> Iterator[HostileUser]:
    yield from hostile_user()


def test_the_daemon_refuses_a_plugin_swapped_after_it_was_selected(start_daemon: Any, cli: Any,
                                                                   plugin_dir: Any, user: HostileUser) -> None:
    exec_dir = user.area / "exec"
    exec_dir.mkdir(mode=0o755)
    tmpl = plugin_dir.install("p")
    d = exec_dir / "p"
    d.mkdir(mode=0o755)
    shutil.copy(tmpl.exe, d / "p")
    (d / "p").chmod(0o755)
    env = {"NETPLUGIN_PLUGIN": "p", "NETPLUGIN_PLUGIN_DIR": str(exec_dir)}
    start_daemon(env=env)
    assert cli("setup", *POD, env=env, mode="always").returncode == 0

    pwned = user.home() / "pwned"
    os.chown(d, user.uid, user.gid)
    user.sh(f"printf '#!/bin/sh\\ntouch {pwned}\\n' > {d}/x && chmod 755 {d}/x && mv -f {d}/x {d}/p")
    r = cli("teardown", *POD, env=env, mode="always")
    assert r.returncode == 3, r.stderr
    assert f"{d} is owned by uid {user.uid}" in r.stderr
    assert not pwned.exists()

    os.chown(d, 0, 0)
    shutil.copy(tmpl.exe, d / "p.new")
    (d / "p.new").chmod(0o755)
    os.replace(d / "p.new", d / "p")
    os.chown(d / "p", 0, 0)
    assert cli("teardown", *POD, env=env, mode="always").returncode == 0
    assert not pwned.exists()
