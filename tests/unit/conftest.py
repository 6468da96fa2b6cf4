"""Unit-test helpers: a fake runner at the invoker seam, and process-liveness checks."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from netplugin.invoke import Completed, SpawnError
from netplugin.manager import Manager
from netplugin.state import StateStore


@dataclass
class RunnerCall:
    """What the plugin layer asked the runner to do for one action."""

    argv: list[str]
    env: dict[str, str]
    stdin: bytes | None
    timeout: float
    max_output: int
    kill_grace: float

    @property
    def action(self) -> str:
        return self.argv[1]


@dataclass
class FakeRunner:
    """Stands in for :func:`netplugin.invoke.run` (the ``Runner`` protocol); nothing is executed.

    ``respond("status", stdout=b"...", returncode=0, ...)`` sets the Completed fields of every later
    call of that action; ``spawn_error("setup", errno)`` makes them fail to start.
    """

    calls: list[RunnerCall] = field(default_factory=list)
    responses: dict[str, dict[str, Any]] = field(default_factory=dict)
    spawn_errors: dict[str, int] = field(default_factory=dict)

    def respond(self, action: str, **completed: Any) -> None:
        self.responses[action] = completed

    def spawn_error(self, action: str, err: int) -> None:
        self.spawn_errors[action] = err

    def __call__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        stdin: bytes | None,
        timeout: float,
        max_output: int = 1 << 20,
        kill_grace: float = 2.0,
    ) -> Completed:
        call = RunnerCall(list(argv), dict(env), stdin, timeout, max_output, kill_grace)
        self.calls.append(call)
        if call.action in self.spawn_errors:
            import os

            e = self.spawn_errors[call.action]
            raise SpawnError(argv[0], OSError(e, os.strerror(e)))
        fields = {"returncode": 0, **self.responses.get(call.action, {})}
        return Completed(argv=list(argv), **fields)

    def actions(self) -> list[str]:
        return [c.action for c in self.calls]

    def last(self, action: str) -> RunnerCall:
        return [c for c in self.calls if c.action == action][-1]


@pytest.fixture
def fake_runner() -> FakeRunner:
    return FakeRunner()


def pid_alive(pid: int) -> bool:
    """True if ``pid`` runs (a zombie is dead: it only waits for its parent to reap it)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def still_alive(pids: Iterable[int], within: float = 5.0) -> list[int]:
    """The pids that are still alive after waiting up to ``within`` s for SIGKILL to be delivered."""
    pids = list(pids)
    end = time.monotonic() + within
    while True:
        alive = [p for p in pids if pid_alive(p)]
        if not alive or time.monotonic() > end:
            return alive
        time.sleep(0.02)


def read_pids(path: Any) -> list[int]:
    with open(path) as f:
        return [int(line) for line in f.read().split()]


class Procs:
    """Process-liveness helpers for tests (a fixture, since conftest modules are not importable)."""

    alive = staticmethod(pid_alive)
    still_alive = staticmethod(still_alive)
    read_pids = staticmethod(read_pids)


@pytest.fixture
def procs() -> type[Procs]:
    return Procs


# --- shared by the state and gc tests: the scriptable plugin "sc" with netns paths in a temp dir ---


@pytest.fixture
def netns_dir(tmp_path: Path) -> Path:
    d = tmp_path / "netns"
    d.mkdir()
    return d


@pytest.fixture
def sc(plugin_dir: Any) -> Any:
    return plugin_dir.install("sc")


@pytest.fixture
def mgr(make_manager: Any, netns_dir: Path, sc: Any) -> Callable[..., Manager]:
    """mgr(**config) -> a Manager using plugin "sc" with netns paths under netns_dir."""

    def make(**kw: Any) -> Manager:
        kw.setdefault("plugin", "sc")
        m: Manager = make_manager(netns_template=str(netns_dir / "{infra_id}"), **kw)
        return m

    return make


@pytest.fixture
def store(np_dirs: dict[str, str]) -> StateStore:
    return StateStore(np_dirs["state_dir"])
