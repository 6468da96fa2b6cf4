"""netplugin-cni as a thin client of ``netplugin serve``: who runs the call, and what it imports.

A real daemon runs with a config file; the shim's network config points at the same file, so
both build the same settings and the shim forwards the call. Exec plugins see
``NP_TEST_ORIGIN``: ``daemon`` when the daemon ran them, ``shim`` when the shim process did.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from netplugin.frontends.wire.client import NotSent, exchange
from tests.frontends.fastpath import outside_allowed

REPO = Path(__file__).resolve().parents[3]

class World:
    """A daemon's config file, its process, and shim calls under the same settings."""

    def __init__(self, tmp: Path, np_dirs: dict[str, str], plugin_dir: Any) -> None:
        self.tmp = tmp
        self.run_dir = np_dirs["run_dir"]
        self.state_dir = np_dirs["state_dir"]
        self.socket = os.path.join(self.run_dir, "netplugin.sock")
        self.config = tmp / "daemon.yaml"
        self.config.write_text(
            "\n".join(
                [
                    "plugin: fake",
                    f"plugin_dir: {plugin_dir.path}",
                    f"state_dir: {self.state_dir}",
                    f"run_dir: {self.run_dir}",
                    "host: none",
                    "metrics_address: 127.0.0.1:0",
                    "env:",
                    "  NETPLUGIN_BRIDGE_SUBNET: 10.201.5.0/24",
                    "",
                ]
            )
        )
        self.netns = tmp / "netns-stand-in"
        self.netns.write_text("")
        self.base_env = {k: v for k, v in os.environ.items() if not k.startswith(("NETPLUGIN_", "CNI_"))}
        self.base_env.update(PYTHONPATH=str(REPO), NETPLUGIN_CONFIG=str(self.config))
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = tmp / "daemon.log"

    def conf(self, **changes: Any) -> dict[str, Any]:
        conf: dict[str, Any] = {
            "cniVersion": "1.1.0",
            "name": "nptest",
            "type": "netplugin-cni",
            "configFile": str(self.config),
            "runDir": self.run_dir,
            "logFile": str(self.tmp / "cni.log"),
        }
        conf.update(changes)
        return conf

    def start_daemon(self) -> None:
        env = {**self.base_env, "NP_TEST_ORIGIN": "daemon"}
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "netplugin", "serve"], env=env, stdout=out, stderr=subprocess.STDOUT
            )
        end = time.monotonic() + 60
        while True:
            try:
                if exchange(self.socket, {"v": 1, "op": "health"}, timeout=10)["ok"]:
                    return
            except NotSent:
                pass
            assert self.proc.poll() is None and time.monotonic() < end, self.log.read_text()
            time.sleep(0.05)

    def health(self) -> dict[str, Any]:
        result: dict[str, Any] = exchange(self.socket, {"v": 1, "op": "health"}, timeout=10)["result"]
        return result

    def stop_daemon(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(60)

    def shim(self, command: str, conf: dict[str, Any], argv: list[str] | None = None, **env: str) -> Any:
        full = {
            **self.base_env,
            "NP_TEST_ORIGIN": "shim",
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": "c0ffee0123456789",
            "CNI_IFNAME": "eth0",
            "CNI_NETNS": str(self.netns),
            "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=web;K8S_POD_NAME=web-0",
            "CNI_PATH": "/opt/cni/bin",
            **env,
        }
        done = subprocess.run(
            argv or [sys.executable, "-m", "netplugin.frontends.cni"],
            input=json.dumps(conf).encode(),
            env=full,
            capture_output=True,
            timeout=120,
        )
        return done

    def log_entries(self) -> list[dict[str, Any]]:
        path = self.tmp / "cni.log"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def world(tmp_path: Path, np_dirs: dict[str, str], plugin_dir: Any) -> Iterator[World]:
    w = World(tmp_path, np_dirs, plugin_dir)
    try:
        yield w
    finally:
        w.stop_daemon()


@pytest.fixture
def fake(plugin_dir: Any) -> Any:
    p = plugin_dir.install("fake")
    p.set("status", stdout='{"apiVersion":"v1beta1","kind":"PodNetworkStatus","ip":"10.201.5.7"}')
    return p


def test_add_and_del_run_in_the_daemon_when_it_has_the_same_settings(world: World, fake: Any) -> None:
    world.start_daemon()
    before = world.health()["requests"]
    done = world.shim("ADD", world.conf())
    assert done.returncode == 0, done
    result = json.loads(done.stdout)
    assert result["ips"] == [{"address": "10.201.5.7/24", "gateway": "10.201.5.1", "interface": 0}]
    # The daemon ran the plugin: its environment, plus the call's CNI_* and interface name.
    env = fake.env_of("setup")
    assert env["NP_TEST_ORIGIN"] == "daemon"
    assert env["CNI_CONTAINERID"] == "c0ffee0123456789" and env["NETPLUGIN_IFNAME"] == "eth0"
    assert env["NETPLUGIN_NETNS"] == str(world.netns)
    assert world.health()["requests"] > before
    records = list((Path(world.state_dir) / "pods").glob("*.json"))
    assert [json.loads(r.read_text())["infra_id"] for r in records] == ["c0ffee0123456789"]
    done = world.shim("DEL", world.conf())
    assert done.returncode == 0, done
    assert fake.env_of("teardown")["NP_TEST_ORIGIN"] == "daemon"
    assert list((Path(world.state_dir) / "pods").glob("*.json")) == []
    assert [(e["command"], e["via"], e["result"]) for e in world.log_entries()] == [
        ("ADD", "daemon", "ok"),
        ("DEL", "daemon", "ok"),
    ]
    # Init ran once, in the daemon, for the shim's calls and its own start alike.
    assert [c for c in fake.calls() if c == "init"] == ["init"]


def test_the_shim_works_alone_when_the_settings_differ_or_say_never(world: World, fake: Any) -> None:
    world.start_daemon()
    other = world.conf(env={"NETPLUGIN_BRIDGE_SUBNET": "10.201.6.0/24"})
    assert world.shim("ADD", other).returncode == 0
    assert fake.env_of("setup")["NP_TEST_ORIGIN"] == "shim"
    never = world.conf(netplugin={"use_daemon": "never"})
    assert world.shim("DEL", never).returncode == 0
    assert fake.env_of("teardown")["NP_TEST_ORIGIN"] == "shim"
    assert [e["via"] for e in world.log_entries()] == ["local", "local"]
    assert "different settings" in world.log.read_text() or "differ" in world.log.read_text()


def test_without_a_daemon_auto_works_alone_and_always_is_try_again(world: World, fake: Any) -> None:
    assert world.shim("ADD", world.conf()).returncode == 0
    assert fake.env_of("setup")["NP_TEST_ORIGIN"] == "shim"
    done = world.shim("DEL", world.conf(netplugin={"use_daemon": "always"}))
    assert done.returncode == 1
    err = json.loads(done.stdout)
    assert err["code"] == 11 and "use_daemon: always" in err["msg"], err


def test_errors_are_the_same_from_the_daemon_and_alone(world: World, fake: Any) -> None:
    fake.set("setup", exit=1, stderr="np: the moon is full")
    bad_key = world.conf(netplugin={"timeouts": {"setup": "soon"}})
    alone = [world.shim("ADD", world.conf()), world.shim("ADD", bad_key), world.shim("STATUS", bad_key)]
    world.start_daemon()
    served = [world.shim("ADD", world.conf()), world.shim("ADD", bad_key), world.shim("STATUS", bad_key)]
    for a, b in zip(alone, served, strict=True):
        assert (a.returncode, json.loads(a.stdout)) == (b.returncode, json.loads(b.stdout))
    assert json.loads(served[0].stdout)["code"] == 999 and "the moon is full" in json.loads(served[0].stdout)["msg"]
    assert json.loads(served[1].stdout)["code"] == 7 and "netplugin.timeouts" in json.loads(served[1].stdout)["msg"]
    assert json.loads(served[2].stdout)["code"] == 7  # a bad config is code 7 for STATUS too, not 50
    assert [e["via"] for e in world.log_entries()] == ["local"] * 3 + ["daemon"] * 3


def test_the_daemon_path_imports_only_the_standard_library(world: World, fake: Any) -> None:
    world.start_daemon()
    code = (
        "import os, sys\n"
        "from netplugin.frontends.cni.router import run_call\n"
        "code, doc, via = run_call(os.environ, sys.stdin.buffer.read())\n"
        "modules = sorted(sys.modules)\n"
        "import json\n"
        "print(json.dumps({'code': code, 'via': via, 'modules': modules}))\n"
    )
    # -S: no site hooks, as the installed entry script runs (PYTHONPATH still finds the checkout)
    done = world.shim("ADD", world.conf(), argv=[sys.executable, "-S", "-c", code])
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert (out["code"], out["via"]) == (0, "daemon")
    assert outside_allowed(out["modules"]) == []
    assert "netplugin.frontends.wire.protocol" in out["modules"]  # the check sees the fast path's own imports


def test_the_installed_entry_script_is_isolated_and_serves_calls(world: World, fake: Any, tmp_path: Path) -> None:
    dest = tmp_path / "bin"
    dest.mkdir()
    env = {**world.base_env}
    made = subprocess.run(
        [sys.executable, "-m", "netplugin", "install-shim", str(dest)], env=env, capture_output=True, text=True
    )
    assert made.returncode == 0, made.stderr
    script = dest / "netplugin-cni"
    assert made.stdout.strip() == str(script)
    text = script.read_text()
    assert text.startswith(f"#!{os.path.realpath(sys.executable)} -IS\n")
    assert os.stat(script).st_mode & 0o777 == 0o755
    world.start_daemon()
    # No PYTHONPATH: the script finds this checkout through its own explicit path.
    done = world.shim("ADD", world.conf(), argv=[str(script)], PYTHONPATH="/nonexistent")
    assert done.returncode == 0, done.stderr
    version = world.shim("VERSION", {"cniVersion": "1.0.0"}, argv=[str(script)])
    assert json.loads(version.stdout)["supportedVersions"][-1] == "1.1.0"
    world.stop_daemon()
    done = world.shim("DEL", world.conf(), argv=[str(script)])  # alone: yaml, click... found too
    assert done.returncode == 0, done.stderr
    assert [e["via"] for e in world.log_entries()] == ["daemon", "local"]


def test_install_shim_writes_the_cli_too_and_reports_what_it_cannot_do(world: World, tmp_path: Path) -> None:
    env = {**world.base_env}
    made = subprocess.run(
        [sys.executable, "-m", "netplugin", "install-shim", "--kind", "cli", str(tmp_path)],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    script = tmp_path / "netplugin"
    assert made.stdout.strip() == str(script)
    # The full CLI (click, yaml) is found through the script's explicit path, without site.
    done = subprocess.run([str(script), "--version"], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert (done.returncode, done.stdout.strip()) == (0, "netplugin 0.1.0"), done.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "netplugin", "install-shim", str(tmp_path / "no" / "such" / "dir")],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert bad.returncode == 5
    assert "cannot write the entry script" in bad.stderr and "Traceback" not in bad.stderr
