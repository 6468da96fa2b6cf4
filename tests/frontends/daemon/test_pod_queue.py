"""One stuck pod must not starve the daemon (issue 13, class 6).

A gate plugin holds pod ``stuck``'s setup until the test opens its gate; more requests for that
pod than the daemon has workers are queued behind it; then a request for another pod must be
answered while ``stuck`` is still held: an ordering assertion (the other pod's answer arrives
before the gate opens), not a timing threshold.
"""

from __future__ import annotations

import json
import select
import signal
import socket
from typing import Any

from netplugin.frontends.daemon.podqueue import MAX_WAITING_PER_POD
from netplugin.frontends.daemon.server import MAX_WORKERS
from tests.support.waits import WITHIN, wait_for

from .conftest import GATE

QUEUED = MAX_WORKERS + 6  # more than the worker pool: each used to hold a thread


def _send(path: str, pod: str, infra: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    line = {"v": 1, "op": "setup", "namespace": "default", "pod": pod, "infra_id": infra}
    s.sendall(json.dumps(line).encode() + b"\n")
    return s


def _answer(s: socket.socket, timeout: float = 120) -> dict[str, Any]:
    s.settimeout(timeout)
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = s.recv(65536)
        assert chunk, "the daemon closed the connection without answering"
        buf += chunk
    s.close()
    doc: dict[str, Any] = json.loads(buf)
    return doc


def test_requests_queued_on_a_stuck_pod_hold_no_worker(start_daemon: Any, plugin_dir: Any) -> None:
    p = plugin_dir.install("gate", script=GATE)
    d = start_daemon(env={"NETPLUGIN_PLUGIN": "gate"})
    (p.dir / "go-free").touch()
    first = _send(d.socket, "stuck", "s0")
    wait_for(lambda: "start stuck daemon" in p.events(), "the stuck pod's setup to start", WITHIN)
    queued = [_send(d.socket, "stuck", f"s{i}") for i in range(1, QUEUED)]
    # Every request is in the daemon: one runs, the rest wait (or were refused: the per-pod cap).
    expected_waiting = min(QUEUED - 1, MAX_WAITING_PER_POD)
    wait_for(lambda: d.health()["waiting"] == expected_waiting, f"{expected_waiting} queued requests", WITHIN)
    # The requests past the cap were answered at once (which ones depends on arrival order).
    n_refused = QUEUED - 1 - expected_waiting
    wait_for(lambda: len(select.select(queued, [], [], 0)[0]) == n_refused, f"{n_refused} refusals", WITHIN)
    refused = select.select(queued, [], [], 0)[0]
    for s in refused:
        doc = _answer(s)
        assert doc["ok"] is False and doc["error"]["error"] == "DaemonUnavailable", doc
        assert "requests are already waiting for pod default/stuck" in doc["error"]["message"]
    waiting = [s for s in queued if s not in refused]

    other = _send(d.socket, "free", "f1")
    doc = _answer(other)
    assert doc == {"ok": True, "result": {"ip": None}}, doc
    # ...answered while the stuck pod's first setup is still held at its gate.
    assert not (p.dir / "go-stuck").exists()
    assert [e for e in p.events() if " stuck " in f" {e} "] == ["start stuck daemon"]
    assert d.health()["waiting"] == expected_waiting

    (p.dir / "go-stuck").touch()
    for s in [first, *waiting]:
        doc = _answer(s)
        assert doc["ok"] is True, doc
    stuck = [e for e in p.events() if e.split()[1] == "stuck"]
    assert stuck == ["start stuck daemon", "end stuck daemon"] * (expected_waiting + 1)


def test_sigterm_answers_queued_requests_not_run_and_finishes_the_running_one(
    start_daemon: Any, plugin_dir: Any
) -> None:
    p = plugin_dir.install("gate", script=GATE)
    d = start_daemon(env={"NETPLUGIN_PLUGIN": "gate"})
    first = _send(d.socket, "stuck", "s0")
    wait_for(lambda: "start stuck daemon" in p.events(), "the stuck pod's setup to start", WITHIN)
    queued = [_send(d.socket, "stuck", f"s{i}") for i in range(1, 4)]
    wait_for(lambda: d.health()["waiting"] == 3, "3 queued requests", WITHIN)
    d.signal(signal.SIGTERM)
    d.wait_note("STOPPING=1")
    (p.dir / "go-stuck").touch()
    assert _answer(first)["ok"] is True
    for s in queued:
        doc = _answer(s)
        assert doc["ok"] is False and doc["error"]["error"] == "DaemonUnavailable", doc
        assert "shutting down" in doc["error"]["message"]
    assert d.proc.wait(60) == 0  # drained: exits by itself (a second SIGTERM would race the exit)
    assert [e for e in p.events() if e.split()[1] == "stuck"] == ["start stuck daemon", "end stuck daemon"]
