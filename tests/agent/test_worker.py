"""A keeper's thread survives any exception out of its loop: logged at ERROR with its traceback,
counted, and the loop run again after a backoff; its status and problem say so."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from netplugin.agent.worker import Worker


def test_a_loop_that_raises_is_logged_with_its_traceback_and_runs_again(caplog: pytest.LogCaptureFixture) -> None:
    ran = []
    again = threading.Event()

    def loop() -> None:
        ran.append(time.monotonic())
        if len(ran) == 1:
            raise FileNotFoundError(2, "No such file or directory", "/state/hostport/pod_000000000000")
        again.set()
        while not worker.stopping:
            worker.sleep(0.05)

    worker = Worker("netplugin-test", loop, lambda: 5.0)
    with caplog.at_level(logging.ERROR, logger="netplugin.agent"):
        worker.start()
        assert again.wait(10), "the loop did not run again"
        try:
            assert ran[1] - ran[0] >= 0.4  # after a backoff, not at once
            st = worker.status()
            assert st["alive"] and st["errors"] == 1 and "FileNotFoundError" in st["last_error"]
            assert worker.problem() is None
        finally:
            worker.stop()
    [record] = [r for r in caplog.records if r.name == "netplugin.agent"]
    assert record.levelno == logging.ERROR and record.exc_info is not None and "netplugin-test" in record.getMessage()


def test_a_pass_past_its_interval_is_a_problem() -> None:
    stuck = threading.Event()

    def loop() -> None:
        stuck.wait(10)  # a pass that does not end

    worker = Worker("netplugin-test", loop, lambda: 0.2)
    worker.start()
    try:
        time.sleep(0.5)
        assert "has not completed a pass in" in (worker.problem() or "")
    finally:
        stuck.set()
        worker.stop()
