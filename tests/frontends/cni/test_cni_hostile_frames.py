"""Hostile node, round 3: every frame error of the compiled shim is a CNI error document, with its code.

The compiled shim forwards the call's ``CNI_*``/``NETPLUGIN_*`` variables and stdin to the real
daemon in a binary frame. What the frame cannot carry is the call's fault, not the daemon's:

* a name or value that is not UTF-8 (or an entry without ``=``): CNI code 4, on ADD and on the
  DEL after it, as an error document on stdout (it used to be exit 1 with stderr only);
* more than 128 variables or one over 32 KiB (also in ``test_native_shim_hostile``): code 5;
* a network config over 4 MiB on stdin: code 5, "too large" (it used to be "not JSON").

Code 11 ("try again") stays for a daemon that does not answer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from netplugin.frontends.wire.protocol import MAX_STDIN
from tests.frontends.cni.daemonworld import World

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")

BAD_ENV = [
    pytest.param({"CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=web;K8S_POD_NAME=w\udcffb"}, id="value-not-utf8"),
    pytest.param({"CNI_IFNAME": "\udcfe\udcff"}, id="ifname-not-utf8"),
    pytest.param({"CNI_X\udcff": "1"}, id="name-not-utf8"),
    pytest.param({"NETPLUGIN_EXTRA": "\udc80"}, id="netplugin-var-not-utf8"),
]


@pytest.mark.parametrize("env", BAD_ENV)
@pytest.mark.parametrize("shim", ["native", "cluster"])
def test_a_variable_that_is_not_utf8_is_cni_error_4_on_add_and_del(
    world: World, shims: dict[str, Any], plugin_dir: Any, shim: str, env: dict[str, str]
) -> None:
    plugin_dir.install("fake")
    world.start_daemon()
    for command in ("ADD", "DEL"):
        done = world.shim(command, world.conf(), argv=[str(shims[shim])], NETPLUGIN_SOCKET=world.socket, **env)
        assert done.returncode == 1, done
        err = json.loads(done.stdout)  # a CNI error document, not just stderr
        assert err["code"] == 4 and "not UTF-8" in err["msg"], err
        assert err["cniVersion"]
    assert world.health()["pid"]  # the daemon serves on


@pytest.mark.parametrize("size", [MAX_STDIN + 1, 5 << 20])
def test_a_huge_network_config_is_too_large_not_not_json(world: World, plugin_dir: Any, size: int) -> None:
    plugin_dir.install("fake")
    body = b'{"cniVersion": "1.1.0", "name": "n", "type": "netplugin-cni", "pad": "' + b"x" * size + b'"}'
    done = subprocess.run(
        [sys.executable, "-m", "netplugin.frontends.cni"],
        input=body,
        env={**world.base_env, "CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c0ffee", "CNI_IFNAME": "eth0",
             "CNI_NETNS": str(world.netns), "CNI_PATH": "/opt/cni/bin", "NETPLUGIN_USE_DAEMON": "never"},
        capture_output=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, done
    err = json.loads(done.stdout)
    assert err["code"] == 5 and "too large" in err["msg"] and "not JSON" not in err["msg"], err


# --- a plain edit of the plugin between ADD and DEL (the Python shim, no daemon) ----------------------------


def test_del_after_a_plain_edit_tears_down_the_plugin_the_pod_was_added_with(
    world: World, plugin_dir: Any
) -> None:
    old, new = plugin_dir.install("fake"), plugin_dir.install("other")
    env = {"NETPLUGIN_USE_DAEMON": "never"}
    assert world.shim("ADD", world.conf(), **env).returncode == 0
    world.config.write_text(world.config.read_text().replace("plugin: fake", "plugin: other"))
    done = world.shim("DEL", world.conf(), **env)
    assert done.returncode == 0, done.stderr
    assert [c.split()[0] for c in old.calls()][-1] == "teardown"  # fake's own teardown
    assert "teardown" not in [c.split()[0] for c in new.calls()]
