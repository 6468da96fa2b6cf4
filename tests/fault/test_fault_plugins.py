"""Plugins that misbehave: each gives a clear error, leaves no process behind and no partial state.

Every case is a real bash plugin run by the real ``netplugin`` CLI. Plugins write the pid of every
process they start to ``pids`` in their directory, so the test can check with psutil that none of
them survives (a zombie counts as dead: it only waits for its parent to reap it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import psutil
import pytest

POD = ("default", "web-0", "infra0")
BIG = 5 * 1024 * 1024

# Prologue of every case: the control dir, and a pids file the test reads.
HEAD = """#!/usr/bin/env bash
ctl=$(dirname "$0")
echo $$ >> "$ctl/pids"
[ "$1" = init ] && exit 0
"""

# A process tree below the plugin: a child with its own child, and a grandchild that escaped into
# its own session (it is neither in the plugin's process group nor its session). None ignores TERM.
TREE = """
bash -c 'echo $$ >> "$0/pids"; sleep 300 & echo $! >> "$0/pids"; wait' "$ctl" &
echo $! >> "$ctl/pids"
setsid bash -c 'echo $$ >> "$0/pids"; exec sleep 300' "$ctl" &
for _ in $(seq 100); do [ "$(wc -l < "$ctl/pids")" -ge 5 ] && break; sleep 0.01; done
"""


def only(action: str, body: str) -> str:
    """The body runs for ``action``; every other action succeeds quietly."""
    return HEAD + f'if [ "$1" = {action} ]; then\n{body}\nfi\nexit 0\n'


@dataclass(frozen=True)
class Case:
    script: str
    action: str
    exit_code: int
    message: str
    extra_args: tuple[str, ...] = ()


CASES = {
    "hang-past-the-timeout-with-grandchildren": Case(
        only("setup", TREE + "sleep 300"), "setup", 4, "network plugin 'bad' setup timed out after 1s",
        ("--timeout", "1")),
    "crash-by-signal": Case(only("setup", "kill -SEGV $$"), "setup", 1, "failed: killed by signal SIGSEGV"),
    "non-zero-exit-quotes-stderr": Case(
        only("setup", "echo 'bad: no free address in 10.0.0.0/30' >&2; exit 3"), "setup", 1,
        "failed: exit status 3; stderr: 'bad: no free address in 10.0.0.0/30'"),
    "garbage-status": Case(only("status", "echo '<html>502 Bad Gateway</html>'"), "status", 1,
                           "status for pod default/web-0: output is not JSON"),
    "status-of-the-wrong-shape": Case(only("status", 'echo \'{"ip": ["10.0.0.1"]}\''), "status", 1,
                                      "invalid 'ip' ['10.0.0.1']: must be a string"),
    "megabytes-of-status": Case(only("status", f"head -c {BIG} /dev/zero | tr '\\0' x"), "status", 1,
                                "output larger than 1048576 bytes"),
    "megabytes-of-stderr-then-failure": Case(
        only("setup", f"head -c {BIG} /dev/zero | tr '\\0' e >&2; echo THE-END >&2; exit 1"), "setup", 1,
        "failed: exit status 1"),
    "leaves-children-running": Case(
        only("setup", 'for _ in 1 2; do sleep 300 & echo $! >> "$ctl/pids"; done'), "setup", 1,
        "left 2 process(es) running after it exited (they were killed)"),
    "children-that-ignore-sigterm": Case(
        only("setup", '(trap "" TERM; sleep 300) & echo $! >> "$ctl/pids"'), "setup", 1,
        "left 1 process(es) running"),
}


def pids_of(plugin: Any) -> list[int]:
    f = plugin.dir / "pids"
    return [int(x) for x in f.read_text().split()] if f.exists() else []


def survivors(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def recorded(run_cli: Any) -> list[list[str]]:
    r = run_cli("-o", "json", "--plugin", "bad", "pods")
    assert r.returncode == 0, r.stderr
    return [[p["namespace"], p["name"], p["infra_id"], p["state"]] for p in json.loads(r.stdout)["pods"]]


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_misbehaving_plugin_gives_a_clear_error_and_leaves_nothing(case: str, plugin_dir: Any,
                                                                   run_cli: Any) -> None:
    c = CASES[case]
    bad = plugin_dir.install("bad", script=c.script)
    if c.action == "status":
        assert run_cli("--plugin", "bad", "setup", *POD).returncode == 0
    r = run_cli(*c.extra_args, "--plugin", "bad", c.action, *POD)
    assert r.returncode == c.exit_code, r.stderr
    assert c.message in r.stderr, r.stderr
    assert r.stderr.startswith("netplugin: error: ") and "Traceback" not in r.stderr
    assert len(r.stderr) < 8192, "the error quotes a bounded tail of the plugin's output"
    if case == "megabytes-of-stderr-then-failure":
        assert "THE-END" in r.stderr, "the tail of stderr is what is quoted"
    pids = pids_of(bad)
    assert pids, "the plugin ran"
    assert survivors(pids) == [], "no process of the plugin's tree survives"
    # No partial state: a failed setup was rolled back and its record removed; status changes nothing.
    expect = [] if c.action == "setup" else [[*POD, "ready"]]
    assert recorded(run_cli) == expect
    if c.action == "setup":
        assert run_cli("--plugin", "bad", "teardown", *POD).returncode == 0


def test_megabytes_of_setup_output_are_bounded_and_setup_succeeds(plugin_dir: Any, run_cli: Any) -> None:
    # setup's stdout is not parsed: a chatty plugin succeeds, and netplugin keeps at most 1 MiB of it.
    bad = plugin_dir.install("bad", script=only("setup", f"head -c {BIG} /dev/zero | tr '\\0' o"))
    r = run_cli("--plugin", "bad", "setup", *POD)
    assert r.returncode == 0, r.stderr
    assert survivors(pids_of(bad)) == []
    assert recorded(run_cli) == [[*POD, "ready"]]


TEARDOWN_FAULTS = {
    "hang": (only("teardown", TREE + "sleep 300"), 4),
    "crash": (only("teardown", "kill -KILL $$"), 1),
    "non-zero": (only("teardown", "echo 'device busy' >&2; exit 1"), 1),
    "leaves-children": (only("teardown", 'sleep 300 & echo $! >> "$ctl/pids"'), 1),
}


@pytest.mark.parametrize("fault", sorted(TEARDOWN_FAULTS))
def test_a_failed_teardown_keeps_the_record_for_gc_and_leaves_no_process(fault: str, plugin_dir: Any,
                                                                         run_cli: Any) -> None:
    script, code = TEARDOWN_FAULTS[fault]
    good = HEAD + "exit 0\n"
    bad = plugin_dir.install("bad", script=good)
    assert run_cli("--plugin", "bad", "setup", *POD).returncode == 0
    bad.exe.write_text(script)
    r = run_cli("--timeout", "1", "--plugin", "bad", "teardown", *POD)
    assert r.returncode == code, r.stderr
    assert "Traceback" not in r.stderr
    assert survivors(pids_of(bad)) == []
    # The teardown did not succeed, so the record stays (marked) until a teardown or gc succeeds.
    assert recorded(run_cli) == [[*POD, "tearing-down"]]
    bad.exe.write_text(good)
    r = run_cli("--plugin", "bad", "gc")
    assert r.returncode == 0 and "its teardown was interrupted" in r.stdout, r.stdout + r.stderr
    assert recorded(run_cli) == []


def test_a_plugin_that_cannot_be_executed_is_a_clear_error(plugin_dir: Any, run_cli: Any) -> None:
    plugin_dir.install("bad", script="#!/nonexistent/interpreter\n")
    r = run_cli("--plugin", "bad", "setup", *POD)
    assert r.returncode == 1 and "cannot execute" in r.stderr and "Traceback" not in r.stderr
    assert "network plugin 'bad' init failed" in r.stderr
    assert recorded(run_cli) == [], "init failed before setup began: nothing ran, nothing is recorded"
