"""netplugin.core.defaults: the one socket-path rule and the one answer-timeout formula."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from netplugin.core import defaults
from netplugin.core.config import Config, load_config

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("socket", "run_dir", "expected"),
    [
        (None, None, "/run/netplugin/netplugin.sock"),
        ("", "", "/run/netplugin/netplugin.sock"),
        (None, "/r", "/r/netplugin.sock"),
        (None, "/r/", "/r/netplugin.sock"),
        (None, "/", "/netplugin.sock"),
        (None, "rel", "rel/netplugin.sock"),
        ("/s.sock", "/r", "/s.sock"),
    ],
)
def test_socket_path_joins_as_os_path_does(socket: str | None, run_dir: str | None, expected: str) -> None:
    assert defaults.socket_path(socket, run_dir) == expected
    if run_dir and not socket:
        assert expected == os.path.join(run_dir, "netplugin.sock")


def test_config_uses_the_same_rule(tmp_path: Path) -> None:
    cfg = load_config(None, environ={"NETPLUGIN_RUN_DIR": str(tmp_path)}, overrides={})
    assert cfg.socket_path == defaults.socket_path(None, str(tmp_path))
    assert Config().socket_path == defaults.DEFAULT_SOCKET
    assert Config().timeouts == defaults.DEFAULT_TIMEOUTS and Config().kill_grace == defaults.DEFAULT_KILL_GRACE


@pytest.mark.parametrize(
    ("op", "timeouts", "timeout", "grace", "expected"),
    [
        # init + 2 * (the action + a status + (2 * grace + 5)) + 5, with the defaults 10/30/30/10, grace 2
        ("setup", None, None, 2.0, 10 + 2 * (30 + 10 + 9) + 5),
        ("teardown", None, None, 2.0, 10 + 2 * (30 + 10 + 9) + 5),
        ("status", None, None, 2.0, 10 + 2 * (10 + 10 + 9) + 5),
        ("init", None, None, 2.0, 10 + 2 * (10 + 10 + 9) + 5),
        ("setup", {"setup": 100.0}, None, 2.0, 10 + 2 * (100 + 10 + 9) + 5),
        ("setup", {"setup": 100.0, "bogus": 1e9}, 1.0, 0.0, 1 + 2 * (1 + 1 + 5) + 5),
        ("setup", None, None, 10.0, 10 + 2 * (30 + 10 + 25) + 5),
        ("gc", None, None, 2.0, None),
        ("pods", {"setup": 1.0}, 1.0, 2.0, None),
        ("health", None, None, 2.0, 30.0),
        ("plugins", None, None, 2.0, 30.0),
    ],
)
def test_answer_timeout(
    op: str, timeouts: dict[str, float] | None, timeout: float | None, grace: float, expected: float | None
) -> None:
    assert defaults.answer_timeout(op, timeouts, timeout, grace) == expected


@pytest.mark.parametrize("op", ["init", "setup", "teardown", "status"])
def test_the_wait_outlasts_every_limit_the_action_may_hit(op: str) -> None:
    """A pod action may wait for init and for a lock holder's whole turn (its action, a status, each
    with its kill grace) before its own: the answer timeout is past all of them."""
    limits = {"init": 3.0, "setup": 7.0, "teardown": 5.0, "status": 2.0}
    grace = 1.5
    turn = limits[op] + limits["status"] + 2 * grace
    assert (timeout := defaults.answer_timeout(op, limits, None, grace)) is not None
    assert timeout > limits["init"] + grace + 2 * turn


def test_it_imports_nothing() -> None:
    code = (
        "import sys; before = set(sys.modules); "
        f"sys.path.insert(0, {str(REPO)!r}); import netplugin.core.defaults; "
        "print(sorted(set(sys.modules) - before - {'netplugin', 'netplugin.core', 'netplugin.core.defaults'}))"
    )
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stderr
