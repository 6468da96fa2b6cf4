"""CNI version rules as libcni applies them, and config errors as code 7 (table-driven, real shim processes).

libcni sends CHECK only to configs of cniVersion 0.4.0 or later, STATUS and GC only to 1.1.0 or
later; a shim asked for them under an older version answers code 1 (incompatible version) and
does nothing. A bad ``netplugin`` key is code 7 (invalid config) for every command, STATUS too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]
POD_ENV: dict[str, Any] = {}
DEFAULT_SOCKET = "/run/netplugin/netplugin.sock"
NO_POD: dict[str, Any] = {"container_id": None, "ifname": None, "args": None, "netns": ""}


def _prev() -> dict[str, Any]:
    return {"cniVersion": "0.4.0", "interfaces": [{"name": "eth0"}], "ips": [{"address": "10.201.5.7/24"}]}


# (command, cniVersion, extra config, CNI environment, expected code or 0)
VERSION_TABLE = [
    ("CHECK", "0.3.0", {"prevResult": _prev()}, POD_ENV, 1),
    ("CHECK", "0.3.1", {"prevResult": _prev()}, POD_ENV, 1),
    ("CHECK", "0.4.0", {"prevResult": _prev()}, POD_ENV, 0),
    ("CHECK", "1.0.0", {"prevResult": _prev()}, POD_ENV, 0),
    ("STATUS", "0.4.0", {}, NO_POD, 1),
    ("STATUS", "1.0.0", {}, NO_POD, 1),
    ("STATUS", "1.1.0", {}, NO_POD, 0),
    ("GC", "1.0.0", {"cni.dev/valid-attachments": []}, NO_POD, 1),
    ("GC", "1.1.0", {"cni.dev/valid-attachments": []}, NO_POD, 0),
    ("ADD", "0.3.0", {}, POD_ENV, 0),
    ("DEL", "0.3.1", {}, POD_ENV, 0),
    ("ADD", "1.1.0", {}, POD_ENV, 0),
]


@pytest.mark.parametrize(("command", "version", "extra", "env", "expected"), VERSION_TABLE)
def test_commands_need_the_config_version_libcni_needs(
    shim: Any, fake: Any, command: str, version: str, extra: dict[str, Any], env: dict[str, Any], expected: int
) -> None:
    conf = shim.with_conf(cniVersion=version, **extra)
    done = shim.run(command, stdin=json.dumps(conf), **env)
    if expected == 0:
        assert done.returncode == 0, done
        return
    err = done.error()
    assert err["code"] == expected, err
    assert err["cniVersion"] == version
    assert command in err["msg"] and "needs a config cniVersion" in err["details"]
    assert fake.calls() == []  # refused before anything ran


BAD_CONFIG_TABLE = [
    ("ADD", "1.1.0", {}, POD_ENV),
    ("DEL", "1.1.0", {}, POD_ENV),
    ("CHECK", "1.1.0", {"prevResult": _prev()}, POD_ENV),
    ("STATUS", "1.1.0", {}, NO_POD),
    ("GC", "1.1.0", {"cni.dev/valid-attachments": []}, NO_POD),
]


@pytest.mark.parametrize(("command", "version", "extra", "env"), BAD_CONFIG_TABLE)
@pytest.mark.parametrize(
    ("netplugin", "key"),
    [({"no_such_key": 1}, "netplugin.no_such_key"), ({"timeouts": {"setup": "soon"}}, "netplugin.timeouts")],
)
def test_a_bad_netplugin_key_is_code_7_naming_it(
    shim: Any,
    fake: Any,
    command: str,
    version: str,
    extra: dict[str, Any],
    env: dict[str, Any],
    netplugin: dict[str, Any],
    key: str,
) -> None:
    conf = shim.with_conf(cniVersion=version, netplugin=netplugin, **extra)
    err = shim.run(command, stdin=json.dumps(conf), **env).error()
    assert err["code"] == 7, err
    assert key in err["msg"], err
    assert fake.calls() == []


def test_the_shipped_conflist_offers_1_1_to_runtimes_that_read_it() -> None:
    conf = json.loads((REPO / "etc" / "cni" / "10-netplugin.conflist").read_text())
    # containerd 1.6 and podman 4 read no 1.1.0 results: they take cniVersion; newer libcni picks
    # the highest of cniVersions it supports, and then sends STATUS and GC.
    assert conf["cniVersion"] == "1.0.0"
    assert conf["cniVersions"] == ["1.0.0", "1.1.0"]


def test_the_entry_point_knows_the_same_versions_as_the_protocol() -> None:
    from netplugin.frontends.cni import router as fast
    from netplugin.frontends.cni import spec as protocol

    assert fast.LATEST == protocol.LATEST
    assert (fast.E_IO, fast.E_TRY_AGAIN) == (protocol.E_IO, protocol.E_TRY_AGAIN)


@pytest.mark.parametrize(
    ("conf", "env", "expected"),
    [
        ({}, {}, ("auto", DEFAULT_SOCKET)),
        ({"runDir": "/r"}, {"NETPLUGIN_RUN_DIR": "/e"}, ("auto", "/r/netplugin.sock")),
        ({"netplugin": {"run-dir": "/n"}}, {"NETPLUGIN_RUN_DIR": "/e"}, ("auto", "/n/netplugin.sock")),
        ({}, {"NETPLUGIN_RUN_DIR": "/e"}, ("auto", "/e/netplugin.sock")),
        ({"runDir": "/r"}, {"NETPLUGIN_SOCKET": "/s.sock"}, ("auto", "/s.sock")),
        ({"netplugin": {"socket": "/n.sock"}}, {"NETPLUGIN_SOCKET": "/s.sock"}, ("auto", "/n.sock")),
        ({"netplugin": {"use_daemon": "never"}}, {"NETPLUGIN_USE_DAEMON": "always"}, ("never", DEFAULT_SOCKET)),
        ({}, {"NETPLUGIN_USE_DAEMON": "always"}, ("always", DEFAULT_SOCKET)),
    ],
)
def test_the_daemon_is_found_as_the_config_would_say(
    conf: dict[str, Any], env: dict[str, str], expected: tuple[str, str]
) -> None:
    from netplugin.frontends.cni.router import daemon_target

    assert daemon_target(conf, env) == expected
