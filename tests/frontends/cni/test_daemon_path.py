"""netplugin-cni as a thin client of ``netplugin serve``: who runs the call, and what it imports.

A real daemon runs with a config file; the shim's network config points at the same file, so
both build the same settings and the shim forwards the call. Exec plugins see
``NP_TEST_ORIGIN``: ``daemon`` when the daemon ran them, ``shim`` when the shim process did.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.frontends.cni.daemonworld import World
from tests.frontends.fastpath import outside_allowed
from tests.support.waits import WITHIN, wait_for


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


def test_an_edit_on_disk_waits_for_the_daemon_to_take_it(world: World, fake: Any) -> None:
    """The daemon's settings are the node's: a typo appended to the file changes nothing for the
    calls it runs until a reload, which refuses it; the shim alone reads the file and says code 7."""
    world.start_daemon()
    world.config.write_text(world.config.read_text() + "plugn: x\n")
    done = world.shim("ADD", world.conf())
    assert done.returncode == 0, done
    assert fake.env_of("setup")["NP_TEST_ORIGIN"] == "daemon"
    assert world.proc is not None
    world.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: world.health()["reloads"] >= 1, "the reload", WITHIN, detail=world.log.read_text)
    assert "config on disk refused at " in world.health()["refused"] and "plugn" in world.health()["refused"]
    done = world.shim("DEL", world.conf())
    assert done.returncode == 0, done
    assert fake.env_of("teardown")["NP_TEST_ORIGIN"] == "daemon"
    assert [e["via"] for e in world.log_entries()] == ["daemon", "daemon"]
    world.stop_daemon()
    alone = world.shim("ADD", world.conf())
    err = json.loads(alone.stdout)
    assert alone.returncode == 1 and err["code"] == 7 and "plugn" in err["msg"], err


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
