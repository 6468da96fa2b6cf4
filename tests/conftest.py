"""Shared fixtures: a plugin-dir factory, the scriptable test plugin, and CLI/library drivers."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPTABLE = Path(__file__).resolve().parent / "plugins" / "scriptable"
EXEC_PLUGINS = REPO / "exec_plugins"


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
    from netplugin.config import load_config
    from netplugin.host import NullHost
    from netplugin.manager import Manager

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
