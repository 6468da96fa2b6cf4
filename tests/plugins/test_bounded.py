"""BoundedPlugin: an in-process plugin's answers pass through, and a stuck action times out."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from netplugin.core.errors import PluginTimeout
from netplugin.core.names import PodRef
from netplugin.core.plugin import CallContext, PodNetworkStatus
from netplugin.plugins import bounded
from netplugin.plugins.bounded import BoundedPlugin, run_bounded, stuck_calls
from tests.support.waits import wait_for

POD = PodRef("default", "web-0", "abc")
STATUS = PodNetworkStatus(ip="10.204.0.5")


class _Builtin:
    """An in-process plugin whose setup reports its status and whose init declares a mask."""

    name = "example.com/inproc"

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.gate = gate

    def version(self) -> str:
        return "1"

    def version_key(self) -> None:
        return None

    def _wait(self) -> None:
        if self.gate is not None:
            self.gate.wait(10)

    def init(self, ctx: CallContext) -> frozenset[str] | None:
        self._wait()
        return frozenset({"setup", "teardown"})

    def setup(self, pod: PodRef, ctx: CallContext) -> PodNetworkStatus | None:
        self._wait()
        return STATUS

    def teardown(self, pod: PodRef, ctx: CallContext) -> None:
        self._wait()

    def status(self, pod: PodRef, ctx: CallContext) -> PodNetworkStatus | None:
        self._wait()
        return STATUS


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (lambda p, c: p.init(c), frozenset({"setup", "teardown"})),
        (lambda p, c: p.setup(POD, c), STATUS),
        (lambda p, c: p.status(POD, c), STATUS),
        (lambda p, c: p.teardown(POD, c), None),
    ],
    ids=["init-mask", "setup-status", "status", "teardown"],
)
def test_answers_pass_through(call: Any, expected: object) -> None:
    # The manager uses setup's status (no second status call) and init's mask (chains): a wrapper
    # that dropped them would cost an exec and lose the chain's per-call state.
    assert call(BoundedPlugin(_Builtin()), CallContext(timeout=5)) == expected


@pytest.mark.parametrize("action", ["init", "setup", "teardown", "status"])
def test_a_stuck_action_times_out_and_is_listed(action: str) -> None:
    gate = threading.Event()
    plugin = BoundedPlugin(_Builtin(gate))
    ctx = CallContext(timeout=0.2)
    try:
        with pytest.raises(PluginTimeout) as info:
            if action == "init":
                plugin.init(ctx)
            else:
                getattr(plugin, action)(POD, ctx)
        assert info.value.action == action
        assert any(c.what.startswith(f"{_Builtin.name} {action}") for c in stuck_calls())
    finally:
        gate.set()


def _thread_of_call() -> threading.Thread:
    return run_bounded("example.com/inproc status", 5, threading.current_thread)


def test_calls_one_after_another_reuse_one_thread() -> None:
    # A thread per action cost its start and its warm state (the thread's root-netns netlink socket).
    first = _thread_of_call()
    assert first is not threading.current_thread()
    assert _thread_of_call() is first
    with pytest.raises(ZeroDivisionError):  # an exception reaches the caller; the thread stays
        run_bounded("example.com/inproc setup", 5, lambda: 1 // 0)
    assert _thread_of_call() is first


def test_a_stuck_calls_thread_is_not_reused_until_its_call_ends() -> None:
    gate = threading.Event()
    seen: list[threading.Thread] = []

    def stuck() -> None:
        seen.append(threading.current_thread())
        gate.wait(10)

    wait_for(lambda: not stuck_calls(), "the earlier tests' stuck calls to end", 10)
    try:
        with pytest.raises(TimeoutError):
            run_bounded("example.com/stuck teardown", 0.2, stuck)
        assert [c.what for c in stuck_calls()] == ["example.com/stuck teardown"]
        assert _thread_of_call() is not seen[0]  # still running the stuck call
    finally:
        gate.set()
    wait_for(lambda: not stuck_calls(), "the stuck call's end", 10)
    assert _thread_of_call() is seen[0]  # idle again once its call ended (the newest idle thread)


def test_an_idle_thread_retires(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bounded, "IDLE_SECONDS", 0.05)
    thread = _thread_of_call()
    thread.join(10)
    assert not thread.is_alive()
    assert _thread_of_call() is not thread
