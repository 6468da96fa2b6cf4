"""The pieces of the daemon protocol that need no process: errors on the wire, settings, config."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from netplugin.core import errors as E
from netplugin.core.config import load_config
from netplugin.frontends.cli.app import EXIT_CODES, exit_code_for
from netplugin.frontends.daemon.listener import bind_socket
from netplugin.frontends.daemon.server import error_classes
from netplugin.frontends.daemon.systemd import sd_notify
from netplugin.frontends.wire.fingerprint import fingerprint

ERRORS: list[E.NetpluginError] = [
    E.InvalidArgument("namespace", "Bad_NS", "must be a DNS-1123 label"),
    E.ConfigError("timeout", "must be positive", source="command line"),
    E.PluginNotFound("x", available=["a", "b"], problems=["c: broken"]),
    E.PluginInvalid("x", "not executable", path="/p/x/x"),
    E.PluginFailed(
        "network plugin 'x' setup failed: exit status 1", plugin="x", action="setup", exit_status=1, stderr_tail="boom"
    ),
    E.PluginTimeout(plugin="x", action="setup", timeout=1.5, stderr_tail="slow"),
    E.PluginOutputError("bad status", plugin="x", action="status", stdout_tail="{"),
    E.DiscoveryError("/exec", "Permission denied"),
    E.SystemFailure("cannot lock", "/run/x.lock", "No space left on device"),
    E.StateError("/var/lib/netplugin/pods/a.json", "truncated"),
    E.HostError("api down", status=503, url="https://127.0.0.1:6443/api"),
    E.DaemonUnavailable("/run/netplugin/netplugin.sock", "it is shutting down"),
]


@pytest.mark.parametrize("err", ERRORS, ids=lambda e: type(e).__name__)
def test_every_error_survives_the_wire_as_itself(err: E.NetpluginError) -> None:
    wire = json.loads(json.dumps({"error": err.to_dict(), "classes": error_classes(type(err))}))
    back = E.error_from_dict(wire["error"], wire["classes"])
    assert type(back) is type(err)
    assert (str(back), back.to_dict()) == (str(err), err.to_dict())
    assert exit_code_for(back) == exit_code_for(err)
    for attr in ("plugin", "action", "exit_status", "stderr_tail", "timeout", "field", "key", "path"):
        if hasattr(err, attr):
            assert getattr(back, attr) == getattr(err, attr), attr


def test_an_unknown_remote_class_keeps_its_exit_code_and_name() -> None:
    class GcIncomplete(E.PluginFailed):  # defined outside netplugin.core.errors, like gc's
        pass

    err = GcIncomplete("gc: 1 pod(s) could not be torn down", plugin="", action="teardown")
    back = E.error_from_dict(err.to_dict(), error_classes(GcIncomplete))
    assert isinstance(back, E.RemoteError)
    assert exit_code_for(back) == exit_code_for(err) == EXIT_CODES["PluginError"]
    assert back.to_dict() == err.to_dict()
    internal = E.error_from_dict({"error": "InternalError", "message": "KeyError: 'x'"}, ["InternalError"])
    assert exit_code_for(internal) == 70


def test_fingerprint_tells_what_changes_behaviour(tmp_path: Path) -> None:
    base = load_config(os.devnull, environ={}, overrides={"run_dir": str(tmp_path)})
    same = load_config(
        os.devnull,
        environ={},
        overrides={"run_dir": str(tmp_path), "use_daemon": "always", "metrics_address": "none", "socket": "/x.sock"},
    )
    assert fingerprint(base) == fingerprint(same)
    # --timeout changes what every action gets, so it differs even though `timeouts` did not.
    assert fingerprint(base) != fingerprint(
        load_config(os.devnull, environ={}, overrides={"run_dir": str(tmp_path), "timeout": "3"})
    )
    # No plugin and the no-op plugin named are the same thing.
    assert fingerprint(base) == fingerprint(
        load_config(os.devnull, environ={}, overrides={"run_dir": str(tmp_path), "plugin": "kubernetes.io/no-op"})
    )
    # A chain of one is the plugin; a longer chain, or another order, is not.
    def chain(**kw: object) -> object:
        return fingerprint(load_config(os.devnull, environ={}, overrides={"run_dir": str(tmp_path), **kw}))

    assert chain(plugin="bridge") == chain(plugins=["bridge"])
    assert chain(plugins=["bridge", "bandwidth"]) != chain(plugin="bridge")
    assert chain(plugins=["bridge", "bandwidth"]) != chain(plugins=["bandwidth", "bridge"])


@pytest.mark.parametrize("value", ["none", "off", "", "NONE"])
def test_metrics_can_be_turned_off_in_config(value: str) -> None:
    assert load_config(os.devnull, environ={"NETPLUGIN_METRICS_ADDRESS": value}).metrics_address == "none"


def test_bad_metrics_address_names_the_key() -> None:
    with pytest.raises(E.ConfigError, match=r"NETPLUGIN_METRICS_ADDRESS.*HOST:PORT"):
        load_config(os.devnull, environ={"NETPLUGIN_METRICS_ADDRESS": "localhost"})


def test_bind_socket_is_0600_from_birth_and_refuses_a_live_one(tmp_path: Path) -> None:
    path = str(tmp_path / "s.sock")
    old = os.umask(0)  # even under a permissive umask
    try:
        sock = bind_socket(path)
    finally:
        os.umask(old)
    try:
        assert os.stat(path).st_mode & 0o777 == 0o600
        with pytest.raises(E.SystemFailure, match="another process answers on it"):
            bind_socket(path)
    finally:
        sock.close()
    # Now nobody listens: the stale socket is replaced.
    bind_socket(path).close()


def test_sd_notify_sends_a_datagram(tmp_path: Path) -> None:
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind(path)
        assert sd_notify("READY=1", path)
        assert listener.recv(100) == b"READY=1"
    assert not sd_notify("READY=1", None)
