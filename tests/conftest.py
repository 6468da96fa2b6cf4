"""Shared fixtures: a plugin-dir factory, the scriptable test plugin, CLI/library drivers, a fake runner at
the invoker seam, process-liveness checks; the kernel gate; and (plugin module ``tests.support.bridgenet``)
test bridge networks."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from netplugin.core.defaults import DEFAULT_KILL_GRACE, DEFAULT_MAX_OUTPUT
from netplugin.core.execplugin.invoke import Completed, SpawnError
from netplugin.manager.manager import Manager
from netplugin.store.state import StateStore
from tests.support.gopeers import MARK, uses_peers
from tests.support.nettest import kernel_gate
from tests.support.nodebridge import NodeBridge
from tests.support.procs import pid_alive, read_pids, still_alive

REPO = Path(__file__).resolve().parent.parent
SCRIPTABLE = Path(__file__).resolve().parent / "testplugins" / "scriptable"
EXEC_PLUGINS = REPO / "exec_plugins"

pytest_plugins = ["tests.support.bridgenet"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--peers",
        choices=("all", "without", "only"),
        default="all",
        help="run every test (all), those that need no Go-built peer (without), or only those that do "
        "(only): scripts/test.sh's two phases",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``peers`` each test that needs a peer (tests/support/gopeers.py decides, never a hand list), then
    keep the phase asked for by ``--peers``."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        defs = [d for ds in (info.name2fixturedefs.values() if info else ()) for d in ds]
        if uses_peers([f for f in (getattr(item, "function", None), *(d.func for d in defs)) if f is not None]):
            item.add_marker(MARK)
    phase = config.getoption("--peers")
    if phase == "all":
        return
    keep = [i for i in items if (i.get_closest_marker(MARK) is not None) == (phase == "only")]
    config.hook.pytest_deselected(items=[i for i in items if i not in keep])
    items[:] = keep


@pytest.fixture(autouse=True)
def _kernel_gate(request: pytest.FixtureRequest) -> None:
    """Tests marked ``kernel`` are skipped, with the reason, where the kernel features are missing."""
    kernel_gate(request)


#: netplugin's default paths on this machine: no test may create them (tests use their own dirs)
MACHINE_PATHS = ("/etc/netplugin", "/var/lib/netplugin", "/run/netplugin", "/etc/cni/net.d/10-netplugin.conflist")


@pytest.fixture(autouse=True)
def _machine_paths_untouched() -> Iterator[None]:
    """Fail the test that creates one of the machine's own netplugin paths (a leak into the machine)."""
    before = {p for p in MACHINE_PATHS if os.path.lexists(p)}
    yield
    created = [p for p in MACHINE_PATHS if p not in before and os.path.lexists(p)]
    assert not created, f"this test created the machine's own {', '.join(created)}: use the test's own dirs"


def is_root() -> bool:
    return os.geteuid() == 0


@dataclass
class InstalledPlugin:
    """One plugin installed into a test exec dir; its control files steer the scriptable plugin."""

    name: str
    dir: Path
    exe: Path

    def set(self, action: str, **files: str | int) -> None:
        """Steer the next calls of ``action``: set(... "setup", exit=1, stderr="boom")."""
        for kind, value in files.items():
            (self.dir / f"{action}.{kind}").write_text(str(value))

    def clear(self, action: str) -> None:
        for f in self.dir.glob(f"{action}.*"):
            f.unlink()

    def calls(self) -> list[str]:
        log = self.dir / "calls.log"
        return log.read_text().splitlines() if log.exists() else []

    def env_of(self, action: str) -> dict[str, str]:
        text = (self.dir / f"{action}.env").read_text()
        return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)

    def stdin_of(self, action: str) -> str:
        return (self.dir / f"{action}.stdin").read_text()

    def events(self) -> list[str]:
        log = self.dir / "events.log"
        return log.read_text().splitlines() if log.exists() else []


class PluginDir:
    """A fresh exec dir; ``install()`` builds ``name/name`` (or ``vendor~name/name``) with a chosen mode."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(mode=0o755, exist_ok=True)
        os.chmod(path, 0o755)

    def install(
        self, name: str, *, mode: int = 0o755, script: Path | str | None = None, dir_mode: int = 0o755
    ) -> InstalledPlugin:
        dirname = name.replace("/", "~")
        short = name.rsplit("/", 1)[-1]
        d = self.path / dirname
        d.mkdir(mode=dir_mode)
        os.chmod(d, dir_mode)
        exe = d / short
        if isinstance(script, str):
            exe.write_text(script)
        else:
            shutil.copyfile(script or SCRIPTABLE, exe)
        os.chmod(exe, mode)
        return InstalledPlugin(name, d, exe)


@pytest.fixture
def node_factory(tmp_path: Path) -> Iterator[Callable[[str], NodeBridge]]:
    """Node netns with a bridge plugin of the given kind (``tests/nodebridge``), all removed at the end."""
    made: list[NodeBridge] = []

    def make(kind: str) -> NodeBridge:
        made.append(NodeBridge(kind, tmp_path))
        return made[-1]

    yield make
    for n in made:
        n.close()


@pytest.fixture
def plugin_dir(tmp_path: Path) -> PluginDir:
    return PluginDir(tmp_path / "exec")


@pytest.fixture
def np_dirs(tmp_path: Path) -> dict[str, str]:
    """Private state/run/pods dirs and an empty config file, so no test sees the machine's own."""
    dirs = {name: tmp_path / name for name in ("state", "run", "pods")}
    for d in dirs.values():
        d.mkdir()
    cfg = tmp_path / "netplugin.yaml"
    cfg.write_text("# empty: defaults\n")
    return {
        "state_dir": str(dirs["state"]),
        "run_dir": str(dirs["run"]),
        "pods_dir": str(dirs["pods"]),
        "config": str(cfg),
    }


@pytest.fixture
def cli_env(np_dirs: dict[str, str], plugin_dir: PluginDir) -> dict[str, str]:
    """The environment for running the real ``netplugin`` CLI against the test dirs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_")}
    env.update(
        NETPLUGIN_PLUGIN_DIR=str(plugin_dir.path),
        NETPLUGIN_STATE_DIR=np_dirs["state_dir"],
        NETPLUGIN_RUN_DIR=np_dirs["run_dir"],
        NETPLUGIN_PODS_DIR=np_dirs["pods_dir"],
        NETPLUGIN_CONFIG=np_dirs["config"],
        NETPLUGIN_USE_DAEMON="never",
        PYTHONPATH=str(REPO),
    )
    return env


@pytest.fixture
def run_cli(cli_env: dict[str, str]) -> Any:
    """Run ``python -m netplugin ARGS`` as a real process; returns CompletedProcess (text)."""

    def run(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        full = dict(cli_env)
        full.update(env or {})
        return subprocess.run(
            [sys.executable, "-m", "netplugin", *args],
            env=full,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    return run


@pytest.fixture
def make_manager(np_dirs: dict[str, str], plugin_dir: PluginDir) -> Iterator[Any]:
    """Build a library Manager on the test dirs: make_manager(plugin="x", host=FakeHost(), **config)."""
    from netplugin.core.config import load_config
    from netplugin.hosts.base import NullHost
    from netplugin.manager.manager import Manager

    def make(
        plugin: str | None = None, host: Any = None, runner: Any = None, state: Any = None, **overrides: Any
    ) -> Manager:
        cfg = load_config(
            np_dirs["config"],
            environ={},
            overrides={
                "plugin_dir": str(plugin_dir.path),
                "state_dir": np_dirs["state_dir"],
                "run_dir": np_dirs["run_dir"],
                "pods_dir": np_dirs["pods_dir"],
                "plugin": plugin,
                **overrides,
            },
        )
        return Manager(cfg, host if host is not None else NullHost(), runner=runner, state=state)

    yield make

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
    """Stands in for :func:`netplugin.core.execplugin.invoke.run` (the ``Runner`` protocol); nothing is executed.

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
        max_output: int = DEFAULT_MAX_OUTPUT,
        kill_grace: float = DEFAULT_KILL_GRACE,
        exe_fd: int | None = None,
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


class Procs:
    """Process-liveness helpers for tests (a fixture, since conftest modules are not importable)."""

    alive = staticmethod(pid_alive)
    still_alive = staticmethod(still_alive)
    read_pids = staticmethod(read_pids)


@pytest.fixture
def procs() -> type[Procs]:
    return Procs


@pytest.fixture
def reaper() -> Iterator[list[int]]:
    """Pids a test wants dead at the end whatever happens (processes a test left on purpose)."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# --- shared by the state and gc tests: the scriptable plugin "sc" with netns paths in a temp dir ---


@pytest.fixture
def netns_dir(tmp_path: Path) -> Path:
    d = tmp_path / "netns"
    d.mkdir()
    return d


#: NETPLUGIN_TEST_CHAIN=N runs the guarantee suites (state, gc) with "sc" as the first member of a
#: chain of N: the other members are scriptable plugins that succeed at everything and say nothing.
CHAIN_LENGTH = int(os.environ.get("NETPLUGIN_TEST_CHAIN", "1"))


@pytest.fixture
def sc(plugin_dir: Any) -> Any:
    for i in range(2, CHAIN_LENGTH + 1):
        plugin_dir.install(f"pad{i}")
    return plugin_dir.install("sc")


def sc_chain() -> list[str]:
    """The chain the "sc" suites run: "sc", then the padding members."""
    return ["sc", *(f"pad{i}" for i in range(2, CHAIN_LENGTH + 1))]


@pytest.fixture
def sc_env() -> dict[str, str]:
    """The CLI environment variable that selects the "sc" chain."""
    return {"NETPLUGIN_PLUGINS": ",".join(sc_chain())}


@pytest.fixture
def mgr(make_manager: Any, netns_dir: Path, sc: Any) -> Callable[..., Manager]:
    """mgr(**config) -> a Manager using plugin "sc" (the chain's first member) with netns paths under netns_dir."""

    def make(**kw: Any) -> Manager:
        if "plugin" not in kw and "plugins" not in kw:
            kw["plugins"] = sc_chain()
        m: Manager = make_manager(netns_template=str(netns_dir / "{infra_id}"), **kw)
        return m

    return make


@pytest.fixture
def store(np_dirs: dict[str, str]) -> StateStore:
    return StateStore(np_dirs["state_dir"])
