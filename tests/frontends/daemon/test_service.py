"""The daemon as a service: systemd notifications (reload, watchdog), journald priorities, metric names,
and the `netplugin health` probe. Real daemon processes; the test listens on NOTIFY_SOCKET as systemd would.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import netplugin
from netplugin.core.errors import InvalidArgument
from netplugin.core.logs import LineFormatter
from netplugin.frontends.daemon.metrics import SERIES
from netplugin.frontends.daemon.systemd import Watchdog, stderr_is_journal
from tests.support.waits import WITHIN, wait_for

POD = ("default", "web-0", "infra0")


def _notes_after(d: Any, count: int, within: float = 30) -> list[str]:
    """Wait until the daemon sent at least ``count`` notifications; returns all of them."""
    end = time.monotonic() + within
    while len(d.notes) < count and time.monotonic() < end:
        try:
            d.notify.settimeout(0.2)
            d.notes.append(d.notify.recv(4096).decode())
        except (TimeoutError, BlockingIOError):
            pass
    return list(d.notes)


# --- systemd ---------------------------------------------------------------------------------------


def test_sighup_says_reloading_then_ready(start_daemon: Any, plugin_dir: Any) -> None:
    plugin_dir.install("scripted")
    d = start_daemon(env={"NETPLUGIN_PLUGIN": "scripted"})
    ready = len(d.notes)
    d.signal(signal.SIGHUP)
    wait_for(lambda: d.health()["reloads"] == 1, "the reload to finish", WITHIN)
    notes = _notes_after(d, ready + 2)[ready:]
    assert notes[0].startswith("RELOADING=1\nMONOTONIC_USEC=")
    usec = int(re.search(r"MONOTONIC_USEC=(\d+)", notes[0]).group(1))  # type: ignore[union-attr]
    assert abs(usec / 1e6 - time.clock_gettime(time.CLOCK_MONOTONIC)) < 60  # systemd's clock, not the wall clock
    assert notes[1].startswith("READY=1")


def test_watchdog_pings_from_the_event_loop(start_daemon: Any, plugin_dir: Any) -> None:
    p = plugin_dir.install("scripted")
    d = start_daemon(env={"NETPLUGIN_PLUGIN": "scripted", "WATCHDOG_USEC": "400000"})
    notes = _notes_after(d, len(d.notes) + 3, within=10)
    assert notes.count("WATCHDOG=1") >= 3, notes
    assert "WATCHDOG_USEC" not in p.env_of("init")  # plugins are not the watched process


def test_watchdog_meant_for_another_pid_is_ignored(start_daemon: Any, plugin_dir: Any) -> None:
    plugin_dir.install("scripted")
    d = start_daemon(env={"NETPLUGIN_PLUGIN": "scripted", "WATCHDOG_USEC": "200000", "WATCHDOG_PID": "1"})
    time.sleep(1.0)  # five intervals: long enough for pings that must not come
    assert "WATCHDOG=1" not in _notes_after(d, 99, within=0.5)


def test_watchdog_settings() -> None:
    assert Watchdog({"WATCHDOG_USEC": "30000000"}).ping_every == 15.0
    assert Watchdog({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "42"}, pid=42).enabled
    assert not Watchdog({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "43"}, pid=42).enabled
    assert not Watchdog({"WATCHDOG_USEC": "0"}).enabled
    assert not Watchdog({}).enabled


def test_log_lines_carry_journal_priorities_when_stderr_is_the_journal(
    start_daemon: Any, plugin_dir: Any, tmp_path: Path
) -> None:
    plugin_dir.install("scripted")
    log = tmp_path / "daemon0.log"  # the fixture's log file for the first daemon: stdout and stderr
    log.write_bytes(b"")
    st = log.stat()
    d = start_daemon(env={"NETPLUGIN_PLUGIN": "scripted", "JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"})
    with pytest.raises(InvalidArgument):
        d.call("setup", namespace="bad_ns", pod="x", infra_id="y")  # the daemon logs it as a warning
    d.stop()
    lines = [line for line in d.output().splitlines() if line]
    assert lines and all(re.match(r"<[0-7]>", line) for line in lines), lines
    assert any(line.startswith("<6>serving on ") for line in lines), lines
    assert any(line.startswith("<4>setup ") for line in lines), lines


def test_plain_log_lines_on_a_terminal_or_file(start_daemon: Any, plugin_dir: Any) -> None:
    plugin_dir.install("scripted")
    d = start_daemon(env={"NETPLUGIN_PLUGIN": "scripted", "JOURNAL_STREAM": "1:1"})  # not our stderr
    d.stop()
    lines = [line for line in d.output().splitlines() if line]
    # Every line: an RFC 3339 time (UTC, milliseconds), then the level.
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR|CRITICAL) "
    assert lines and all(re.match(stamp, line) for line in lines), lines
    assert any(re.match(stamp + "serving on ", line) for line in lines), lines


def test_journal_formatter_and_detection(tmp_path: Path) -> None:
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "two\nlines", None, None)
    # No time and no level name for the journal (it stamps its own, and reads the priority).
    assert LineFormatter(journal=True).format(record) == "<3>two\n<3>lines"
    record.levelno = logging.DEBUG
    assert LineFormatter(journal=True).format(record).startswith("<7>")
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "two\nlines", None, None)
    record.fields = {"pod": "default/web"}  # as extra={"fields": ...} sets it
    assert json.loads(LineFormatter("json", journal=True).format(record).removeprefix("<3>")) == {
        "level": "error",
        "logger": "x",
        "msg": "two\nlines",
        "pod": "default/web",
    }
    f = tmp_path / "f"
    with open(f, "w") as out:
        st = os.fstat(out.fileno())
        assert stderr_is_journal({"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}, out.fileno())
        assert not stderr_is_journal({"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino + 1}"}, out.fileno())
        assert not stderr_is_journal({"JOURNAL_STREAM": "junk"}, out.fileno())


# --- metrics -------------------------------------------------------------------------------------------


def _metric_text(d: Any) -> str:
    text: str = d.metrics()
    return text


def test_metrics_names_build_info_and_invalid_op(start_daemon: Any, cli: Any, plugin_dir: Any) -> None:
    plugin_dir.install("scripted")
    env = {"NETPLUGIN_PLUGIN": "scripted"}
    d = start_daemon(env=env)
    assert cli("setup", *POD, env=env, mode="always").returncode == 0
    assert cli("teardown", *POD, env=env, mode="always").returncode == 0
    # A request that is not JSON: its op is unknown, so it is counted as op="invalid".
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(d.socket)
        s.sendall(b"not json\n")
        assert json.loads(s.makefile().readline())["ok"] is False
    text = _metric_text(d)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    totals = {s.labels["operation_type"]: s.value for s in families["kubelet_network_plugin_operations"].samples}
    assert totals == {"set_up_pod": 1.0, "tear_down_pod": 1.0, "get_pod_network_status": 0.0}
    assert families["kubelet_network_plugin_operations"].type == "counter"
    [build] = families["netplugin_build_info"].samples
    assert build.value == 1.0
    assert build.labels["version"] == netplugin.__version__
    assert re.search(r'netplugin_daemon_requests_total\{op="invalid",outcome="InvalidArgument"\} 1\.0', text)
    assert 'op="?"' not in text


def _exported(text: str) -> dict[str, tuple[str, str, set[str]]]:
    """name -> (type, help, label names) of each family in /metrics, as the TYPE lines name them."""
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    helps = dict(re.findall(r"^# HELP (\S+) (.*)$", text, re.M))
    labels: dict[str, set[str]] = {name: set() for name in types}
    for fam in text_string_to_metric_families(text):
        name = next(n for n in types if n == fam.name or n == f"{fam.name}_total")
        for sample in fam.samples:
            labels[name] |= set(sample.labels) - {"le"}
    return {name: (types[name], helps[name], labels[name]) for name in types}


def test_metrics_are_exactly_the_series_table(start_daemon: Any, cli: Any, plugin_dir: Any) -> None:
    """Every family a live daemon exports is a row of SERIES, with its type, help and labels, and back."""
    plugin_dir.install("scripted")
    env = {"NETPLUGIN_PLUGIN": "scripted"}
    d = start_daemon(env=env)
    assert cli("setup", *POD, env=env, mode="always").returncode == 0  # the per-member histogram has a child
    exported = {k: v for k, v in _exported(_metric_text(d)).items() if not k.startswith("process_")}
    table = {s.name: (s.kind, s.help, set(s.labels)) for s in SERIES if s.present == "always"}
    assert exported == table
    # The kubelet's own names for its exec plugin metrics; everything else is netplugin's.
    assert {s.name for s in SERIES if not s.name.startswith("netplugin_")} == {
        "kubelet_network_plugin_operations_duration_seconds",
        "kubelet_network_plugin_operations_total",
        "kubelet_network_plugin_operations_errors_total",
    }
    for s in SERIES:
        assert s.name.endswith("_total") == (s.kind == "counter"), s.name


def test_the_metrics_page_mirrors_the_series_table() -> None:
    repo = Path(__file__).parents[3]
    page = (repo / "docs" / "metrics.md").read_text()
    rows = re.findall(r"^\| `([a-z_]+)(?:\{([a-z_,]*)\})?` \| (counter|gauge|histogram) \| (.*) \|$", page, re.M)
    assert [(name, kind) for name, _, kind, _ in rows] == [(s.name, s.kind) for s in SERIES]
    for (_, labels, _, help_text), s in zip(rows, SERIES, strict=True):
        assert (tuple(labels.split(",")) if labels else ()) == tuple(s.labels), s.name
        assert help_text.startswith(s.help), s.name  # the page may add a note after the help
    for doc in (page, (repo / "README.md").read_text()):
        assert not re.search(r"(?<![a-z_])network_plugin_operations", doc)


def test_metrics_pass_promtool(start_daemon: Any, cli: Any, plugin_dir: Any) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (scripts/install-deps.sh --test installs it)")
    plugin_dir.install("scripted")
    env = {"NETPLUGIN_PLUGIN": "scripted"}
    d = start_daemon(env=env)
    assert cli("setup", *POD, env=env, mode="always").returncode == 0
    out = subprocess.run([promtool, "check", "metrics"], input=_metric_text(d), capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


# --- netplugin health: the liveness probe --------------------------------------------------------------


def test_health_answers_while_the_daemon_serves_and_fails_on_a_stale_socket(
    start_daemon: Any, cli: Any, plugin_dir: Any
) -> None:
    plugin_dir.install("scripted")
    d = start_daemon(env={"NETPLUGIN_PLUGIN": "scripted"})
    r = cli("health", "-o", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["pid"] == d.pid
    assert cli("health").stdout.startswith(f"serving: pid {d.pid}, plugin scripted")
    # Killed hard: the socket file stays, nobody listens. A `test -S` probe would still pass.
    d.kill()
    assert os.path.exists(d.socket)
    r = cli("health", "--wait", "2")
    assert r.returncode == 6, r.stderr
    assert d.socket in r.stderr


@pytest.mark.parametrize("members", [1, 2, 3])
def test_a_chain_through_the_daemon_has_per_member_metrics_that_pass_promtool(
    start_daemon: Any, cli: Any, plugin_dir: Any, members: int
) -> None:
    names = [f"m{i}" for i in range(1, members + 1)]
    for n in names:
        plugin_dir.install(n)
    env = {"NETPLUGIN_PLUGINS": ",".join(names)}
    d = start_daemon(env=env)
    init = json.loads(cli("-o", "json", "init", env=env, mode="always").stdout)
    assert init["plugin"] == ",".join(names) and init["ran"] is False  # the daemon's start ran them
    assert [m["plugin"] for m in init.get("members", [{"plugin": names[0]}])] == names
    assert cli("setup", *POD, env=env, mode="always").returncode == 0
    table = cli("pods", env=env, mode="always").stdout.splitlines()
    assert table[1].split()[5] == (names[0] if members == 1 else ",".join(f"{n}:ready" for n in names))
    assert cli("teardown", *POD, env=env, mode="always").returncode == 0
    text = _metric_text(d)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    counts = {
        (s.labels["plugin"], s.labels["action"], s.labels["outcome"]): s.value
        for s in families["netplugin_chain_member_duration_seconds"].samples
        if s.name.endswith("_count")
    }
    assert counts == {(n, a, "ok"): 1.0 for n in names for a in ("setup", "teardown")}
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is a test dependency (scripts/install-deps.sh --test installs it)")
    out = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
