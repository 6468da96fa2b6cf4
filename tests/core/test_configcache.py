"""The config file's parse cache: a hit only for the same bytes, never from a foreign file, never required."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from netplugin.core import configcache
from netplugin.core.config import Config, load_config, read_config_file

CONFIG = "plugin_dir: /opt/exec\nplugin: bridge\ntimeouts:\n  setup: 12\nenv:\n  A: 'x'\n"


@pytest.fixture
def node(tmp_path: Path) -> Callable[[str], tuple[Path, dict[str, str]]]:
    """A config file with ``text`` and the environment naming a run dir of the test's own."""
    run = tmp_path / "run"

    def make(text: str) -> tuple[Path, dict[str, str]]:
        path = tmp_path / "netplugin.yaml"
        path.write_text(text)
        return path, {"NETPLUGIN_RUN_DIR": str(run)}

    return make


def load(path: Path, env: dict[str, str]) -> Config:
    return load_config(str(path), environ=env, cache=True)


def test_the_second_load_of_the_same_bytes_comes_from_the_cache_without_yaml(
    node: Callable[..., tuple[Path, dict[str, str]]],
) -> None:
    path, env = node(CONFIG)
    first = load(path, env)
    cached = Path(configcache.cache_path(env["NETPLUGIN_RUN_DIR"], str(path)))
    assert cached.is_file() and cached.stat().st_mode & 0o777 == 0o600
    assert json.loads(cached.read_text())["text"] == CONFIG
    code = (
        "import sys; from netplugin.core.config import load_config; "
        f"c = load_config({str(path)!r}, environ={env!r}, cache=True); "
        "print(c.plugin, c.timeouts['setup'], 'yaml' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.split() == ["bridge", "12.0", "False"]
    assert first == load(path, env)


@pytest.mark.parametrize(
    "tamper",
    [
        pytest.param(lambda p: p.chmod(0o666), id="writable-by-others"),
        pytest.param(lambda p: os.chown(p, 65534, 65534), id="owned-by-another-user"),
        pytest.param(lambda p: p.write_text("{not json"), id="not-json"),
        pytest.param(lambda p: p.write_text(json.dumps({"path": "/else", "text": CONFIG, "doc": {}})), id="other-path"),
    ],
)
def test_a_foreign_or_broken_cache_is_a_miss(
    node: Callable[..., tuple[Path, dict[str, str]]], tamper: Callable[[Path], None]
) -> None:
    path, env = node(CONFIG)
    load(path, env)
    cached = Path(configcache.cache_path(env["NETPLUGIN_RUN_DIR"], str(path)))
    # a planted parse that would change the config, if it were believed
    cached.write_text(json.dumps({"path": str(path), "text": CONFIG, "doc": {"plugin": "planted"}}))
    tamper(cached)
    assert load(path, env).plugin == "bridge"


def test_an_edited_file_is_parsed_again_even_with_the_same_size_and_times(
    node: Callable[..., tuple[Path, dict[str, str]]],
) -> None:
    path, env = node(CONFIG)
    assert load(path, env).plugin == "bridge"
    st = path.stat()
    path.write_text(CONFIG.replace("bridge", "bridgX"))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert load(path, env).plugin == "bridgX"


@pytest.mark.parametrize(
    ("doc", "written"),
    [
        pytest.param({"a": [1, 2.5, True, None, "s"]}, True, id="json-types"),
        pytest.param({"a": float("nan")}, False, id="nan"),
        pytest.param({1: "int key"}, False, id="int-key"),
        pytest.param({"when": __import__("datetime").date(2024, 1, 1)}, False, id="yaml-date"),
        pytest.param({"b": b"bytes"}, False, id="binary"),
    ],
)
def test_only_plain_json_documents_are_cached(tmp_path: Path, doc: object, written: bool) -> None:
    data = b"whatever: 1\n"
    assert configcache.store(str(tmp_path / "run"), str(tmp_path / "c.yaml"), data, doc) is written
    got = configcache.lookup(str(tmp_path / "run"), str(tmp_path / "c.yaml"), data)
    assert (got == doc) if written else (got is configcache.MISS)


def test_a_run_dir_that_is_not_netplugins_own_gets_no_cache_and_the_command_works(
    node: Callable[..., tuple[Path, dict[str, str]]],
) -> None:
    path, env = node(CONFIG)
    run = Path(env["NETPLUGIN_RUN_DIR"])
    run.mkdir(mode=0o777)
    run.chmod(0o777)  # writable by anyone: never trusted with a cache
    assert load(path, env).plugin == "bridge"
    assert not (run / configcache.CACHE_DIR).exists()


def test_without_cache_nothing_is_written(node: Callable[..., tuple[Path, dict[str, str]]]) -> None:
    path, env = node(CONFIG)
    assert load_config(str(path), environ=env).plugin == "bridge"
    assert not Path(env["NETPLUGIN_RUN_DIR"]).exists()


def test_the_cli_reads_a_config_file_without_yaml_from_its_second_run(tmp_path: Path) -> None:
    """``netplugin setup`` with a config file, no daemon: the first run parses it, the next ones do not."""
    exec_dir = tmp_path / "exec"
    exec_dir.mkdir(mode=0o755)
    config = tmp_path / "netplugin.yaml"
    config.write_text(f"# a node's config\nplugin_dir: {exec_dir}\nstate_dir: {tmp_path / 'state'}\nhost: none\n")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "NETPLUGIN_CONFIG": str(config),
           "NETPLUGIN_RUN_DIR": str(tmp_path / "run"), "NETPLUGIN_USE_DAEMON": "never",
           "PYTHONPATH": os.pathsep.join(sys.path)}  # fmt: skip
    runs = []
    for i in range(2):
        argv = [sys.executable, "-X", "importtime", "-c", "from netplugin.frontends.cli.entry import main; main()",
                "setup", "default", f"p{i}", f"infra{i}"]  # fmt: skip
        runs.append(subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60))
    assert [r.returncode for r in runs] == [0, 0], runs
    imported = [{line.rsplit("|", 1)[1].strip() for line in r.stderr.splitlines() if "|" in line} for r in runs]
    assert "yaml" in imported[0] and "yaml" not in imported[1]


def test_a_file_naming_another_run_dir_is_not_cached_in_the_default_one(tmp_path: Path) -> None:
    """Without a run dir from flags or environment, the cache may only be in the run dir the file ends up using."""
    default, other = tmp_path / "default-run", tmp_path / "other-run"
    path = tmp_path / "netplugin.yaml"
    path.write_text(f"run_dir: {other}\nplugin: bridge\n")
    assert read_config_file(str(path), cache_in=str(default))["plugin"] == "bridge"
    assert not default.exists()  # nothing written where this node's run dir is not
    # a cache planted there (as by a call whose environment named that dir) is not believed either
    data = path.read_bytes()
    assert configcache.store(str(default), str(path), data, {"run_dir": str(other), "plugin": "planted"})
    assert read_config_file(str(path), cache_in=str(default))["plugin"] == "bridge"
    # pinned by the caller, the cache is the caller's run dir whatever the file says
    assert read_config_file(str(path), cache_in=str(default), cache_pinned=True)["plugin"] == "planted"
    # and a file naming the same run dir is cached there
    path.write_text(f"run_dir: {default}\nplugin: bridge\n")
    read_config_file(str(path), cache_in=str(default))
    assert configcache.lookup(str(default), str(path), path.read_bytes())["plugin"] == "bridge"
