"""The contract and core/execplugin: status parsing, the exec-plugin call (argv, env, stdin, errors), built-ins.

The call is checked twice: with a fake runner at the invoker seam (what ExecPlugin asks for) and
with the real scriptable plugin (what a plugin actually sees).
"""

from __future__ import annotations

import errno
import json
import os
import re
import signal
from typing import Any

import pytest

from netplugin.core.config import ENV_VARS, Config
from netplugin.core.errors import TAIL, InvalidArgument, PluginFailed, PluginOutputError, PluginTimeout
from netplugin.core.execplugin.environ import base_env, call_env
from netplugin.core.execplugin.exec_plugin import ExecPlugin
from netplugin.core.execplugin.status import parse_status
from netplugin.core.names import PodRef
from netplugin.core.plugin import NOOP_NAME, Action, CallContext, Plugin, PodNetworkStatus
from netplugin.plugins import BUILTINS, NoopPlugin, register_builtin

POD = PodRef("default", "web-0", "abc123")
POD_OBJ = {"apiVersion": "v1", "kind": "Pod", "metadata": {"namespace": "default", "name": "web-0"}}
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def ctx(**kw: Any) -> CallContext:
    base: dict[str, Any] = {"netns": "/var/run/netns/abc123", "timeout": 7.5, "env": {"BASE": "1"},
                            "state_dir": "/var/lib/np", "kill_grace": 0.25, "max_output": 8192}
    base.update(kw)
    return CallContext(**base)


# --- parse_status -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stdout", "ip"),
    [
        pytest.param(b"", None, id="empty"),
        pytest.param(b"  \n\t\n", None, id="whitespace"),
        pytest.param(b'{"apiVersion":"v1beta1","kind":"PodNetworkStatus","ip":"10.1.2.3"}', "10.1.2.3", id="full"),
        pytest.param(b'{"ip":"10.1.2.3"}\n', "10.1.2.3", id="ip-only"),
        pytest.param(b'\n  {"ip": "192.168.0.1"}  \n\n', "192.168.0.1", id="surrounding-whitespace"),
        pytest.param(b'{"ip":"FE80::0001"}', "fe80::1", id="ipv6-normalized"),
        pytest.param(b'{"ip":"2001:DB8:0:0:0:0:0:1"}', "2001:db8::1", id="ipv6-compressed"),
        pytest.param(b'{"kind":"","apiVersion":"","ip":"10.0.0.1"}', "10.0.0.1", id="empty-kind-and-version"),
        pytest.param(b'{"ip":"10.0.0.1","interfaces":[{"name":"eth0"}],"x":null}', "10.0.0.1", id="extra-keys"),
    ],
)
def test_parse_status_accepts(stdout: bytes, ip: str | None) -> None:
    got = parse_status(stdout, plugin="p")
    assert (got.ip if got else None) == ip


@pytest.mark.parametrize(
    ("stdout", "words"),
    [
        pytest.param(b"10.1.2.3", "not JSON", id="bare-ip"),
        pytest.param(b"garbage {", "not JSON", id="garbage"),
        pytest.param(b'{"ip": "10.1.2.3"', "not JSON", id="truncated-json"),
        pytest.param(b"\xff\xfe", "not JSON", id="not-utf8"),
        pytest.param(b'["10.1.2.3"]', "got list", id="array"),
        pytest.param(b'"10.1.2.3"', "got str", id="string"),
        pytest.param(b"null", "got NoneType", id="null"),
        pytest.param(b"42", "got int", id="number"),
        pytest.param(b'{"kind":"Pod","ip":"10.1.2.3"}', "invalid 'kind' 'Pod'", id="wrong-kind"),
        pytest.param(b'{"apiVersion":"v1","ip":"10.1.2.3"}', "unknown 'apiVersion' 'v1'", id="wrong-version"),
        pytest.param(b'{"kind":"PodNetworkStatus"}', "no 'ip'", id="missing-ip"),
        pytest.param(b'{"ip":168430083}', "invalid 'ip' 168430083: must be a string", id="ip-number"),
        pytest.param(b'{"ip":null}', "invalid 'ip' None: must be a string", id="ip-null"),
        pytest.param(b'{"ip":["10.1.2.3"]}', "invalid 'ip' ['10.1.2.3']", id="ip-list"),
        pytest.param(b'{"ip":"10.1.2.300"}', "invalid 'ip' '10.1.2.300'", id="ip-octet-range"),
        pytest.param(b'{"ip":"10.1.2.3/24"}', "invalid 'ip' '10.1.2.3/24'", id="ip-with-prefix"),
        pytest.param(b'{"ip":"not-an-ip"}', "invalid 'ip' 'not-an-ip'", id="ip-word"),
        pytest.param(b'{"ip":""}', "invalid 'ip' ''", id="ip-empty"),
        pytest.param(b'{"ip":" 10.1.2.3"}', "invalid 'ip' ' 10.1.2.3'", id="ip-padded"),
    ],
)
def test_parse_status_rejects_naming_the_offending_value(stdout: bytes, words: str) -> None:
    with pytest.raises(PluginOutputError) as info:
        parse_status(stdout, plugin="vendor.example/p", pod="default/web-0")
    err = info.value
    assert words in err.message
    assert err.message.startswith("network plugin 'vendor.example/p' status for pod default/web-0: ")
    assert err.plugin == "vendor.example/p"
    assert err.action == "status"
    assert err.stdout_tail  # the output is quoted for the operator


def test_parse_status_deeply_nested_json_is_an_output_error() -> None:
    with pytest.raises(PluginOutputError):
        parse_status(b"[" * 100000 + b"]" * 100000, plugin="p")


def test_pod_network_status_to_dict() -> None:
    assert PodNetworkStatus("10.1.2.3").to_dict() == {
        "apiVersion": "v1beta1", "kind": "PodNetworkStatus", "ip": "10.1.2.3",
    }


# --- the call: argv, env, stdin, limits (fake runner at the invoker seam) -----------------------------------


@pytest.mark.parametrize(
    ("action", "argv_tail"),
    [
        (Action.INIT, ["init"]),
        (Action.SETUP, ["setup", "default", "web-0", "abc123"]),
        (Action.TEARDOWN, ["teardown", "default", "web-0", "abc123"]),
        (Action.STATUS, ["status", "default", "web-0", "abc123"]),
    ],
)
def test_argv_env_and_limits_per_action(fake_runner: Any, action: Action, argv_tail: list[str]) -> None:
    p = ExecPlugin("vendor.example/p", "/x/vendor.example~p/p", runner=fake_runner)
    c = ctx()
    if action is Action.INIT:
        p.init(c)
    else:
        getattr(p, action.value)(POD, c)
    (call,) = fake_runner.calls
    assert call.argv == ["/x/vendor.example~p/p", *argv_tail]
    assert (call.timeout, call.max_output, call.kill_grace) == (7.5, 8192, 0.25)
    assert call.env["NETPLUGIN_ACTION"] == action.value
    assert call.env["NETPLUGIN_PLUGIN"] == "vendor.example/p"
    assert call.env["BASE"] == "1"
    pod_vars = {
        "NETPLUGIN_POD_NAMESPACE": "default",
        "NETPLUGIN_POD_NAME": "web-0",
        "NETPLUGIN_INFRA_ID": "abc123",
        "NETPLUGIN_NETNS": "/var/run/netns/abc123",
    }
    if action is Action.INIT:
        assert not set(pod_vars) & set(call.env)
    else:
        assert {k: call.env[k] for k in pod_vars} == pod_vars


@pytest.mark.parametrize(
    ("pod", "stdin"),
    [(POD_OBJ, json.dumps(POD_OBJ, separators=(",", ":")).encode()), (None, None)],
    ids=["host-knows-pod", "unknown-pod"],
)
def test_stdin_is_the_pod_json_or_nothing(fake_runner: Any, pod: dict[str, Any] | None, stdin: bytes | None) -> None:
    p = ExecPlugin("p", "/x/p/p", runner=fake_runner)
    p.setup(POD, ctx(pod=pod))
    assert fake_runner.last("setup").stdin == stdin


def test_call_env_overrides_stale_per_call_variables() -> None:
    stale = {"NETPLUGIN_ACTION": "init", "NETPLUGIN_PLUGIN": "old", "NETPLUGIN_POD_NAME": "old-pod", "KEEP": "1"}
    env = call_env(ctx(env=stale), "p", Action.TEARDOWN, POD)
    assert env["NETPLUGIN_ACTION"] == "teardown"
    assert env["NETPLUGIN_PLUGIN"] == "p"
    assert env["NETPLUGIN_POD_NAME"] == "web-0"
    assert env["KEEP"] == "1"


# --- the base environment -----------------------------------------------------------------------------------


PARENT = {
    "PATH": "/parent/bin:/usr/bin:/bin",
    "HOME": "/root",
    "FROM_PARENT": "yes",
    "LANG": "C.UTF-8",
    "LC_ALL": "C",
    "TZ": "UTC",
    "NETPLUGIN_BRIDGE_SUBNET": "10.200.9.0/24",  # a plugin setting: passes
}


@pytest.mark.parametrize(
    ("inherit", "present", "absent"),
    [
        (True, ["FROM_PARENT", "HOME", "PATH", "LANG", "LC_ALL", "TZ", "NETPLUGIN_BRIDGE_SUBNET"], []),
        (False, ["PATH", "LANG", "LC_ALL", "TZ"], ["FROM_PARENT", "HOME", "NETPLUGIN_BRIDGE_SUBNET"]),
    ],
    ids=["inherit", "no-inherit"],
)
def test_base_env_inherit(inherit: bool, present: list[str], absent: list[str]) -> None:
    env = base_env(Config(inherit_env=inherit, state_dir="/s"), PARENT)
    for k in present:
        assert env[k] == PARENT[k]
    for k in absent:
        assert k not in env
    assert env["NETPLUGIN_STATE_DIR"] == "/s"


@pytest.mark.parametrize("inherit", [True, False])
def test_path_is_always_present(inherit: bool) -> None:
    # a plugin without PATH would get bash's built-in default, which includes "."
    env = base_env(Config(inherit_env=inherit), {"HOME": "/root"})
    assert env["PATH"] == DEFAULT_PATH


@pytest.mark.parametrize("inherit", [True, False])
def test_config_env_map_is_added_and_wins(inherit: bool) -> None:
    cfg = Config(inherit_env=inherit, env={"NETPLUGIN_BRIDGE_SUBNET": "10.200.7.0/24", "EXTRA": "1"})
    env = base_env(cfg, PARENT)
    assert env["NETPLUGIN_BRIDGE_SUBNET"] == "10.200.7.0/24"
    assert env["EXTRA"] == "1"


@pytest.mark.parametrize(
    "var",
    [*sorted(set(ENV_VARS) - {"NETPLUGIN_STATE_DIR"}),
     "NETPLUGIN_CONFIG", "NETPLUGIN_OUTPUT", "NETPLUGIN_VERBOSE", "NETPLUGIN_ACTION", "NETPLUGIN_PLUGIN",
     "NETPLUGIN_POD_NAMESPACE", "NETPLUGIN_POD_NAME", "NETPLUGIN_INFRA_ID", "NETPLUGIN_NETNS"],
)
def test_netplugin_own_variables_of_the_parent_are_not_leaked(var: str) -> None:
    env = base_env(Config(inherit_env=True, state_dir="/mine"), {**PARENT, var: "stale"})
    assert var not in env
    assert env["NETPLUGIN_BRIDGE_SUBNET"] == PARENT["NETPLUGIN_BRIDGE_SUBNET"]


def test_state_dir_variable_is_netplugins_not_the_parents() -> None:
    env = base_env(Config(state_dir="/mine"), {**PARENT, "NETPLUGIN_STATE_DIR": "/stale"})
    assert env["NETPLUGIN_STATE_DIR"] == "/mine"


# --- errors from the outcome (fake runner) ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completed", "cls", "words", "exit_status", "sig"),
    [
        pytest.param({"returncode": 3, "stderr": b"no route to host\n"}, PluginFailed,
                     "network plugin 'p' setup failed: exit status 3; stderr: 'no route to host'", 3, None,
                     id="exit-status"),
        pytest.param({"returncode": -signal.SIGKILL}, PluginFailed, "setup failed: killed by signal SIGKILL",
                     None, signal.SIGKILL, id="signal"),
        pytest.param({"returncode": -100}, PluginFailed, "setup failed: killed by signal 100", None, 100,
                     id="unnamed-signal"),
        pytest.param({"returncode": -15, "timed_out": True, "stderr": b"slow"}, PluginTimeout,
                     "network plugin 'p' setup timed out after 7.5s (process tree killed); stderr: 'slow'",
                     None, None, id="timeout"),
        pytest.param({"returncode": 0, "leftover": 2}, PluginFailed,
                     "network plugin 'p' setup left 2 process(es) running after it exited", 0, None,
                     id="leftover"),
    ],
)
def test_failures_carry_plugin_action_status_and_stderr(
    fake_runner: Any, completed: dict[str, Any], cls: type[Exception], words: str, exit_status: int | None,
    sig: int | None,
) -> None:
    fake_runner.respond("setup", **completed)
    p = ExecPlugin("p", "/x/p/p", runner=fake_runner)
    with pytest.raises(cls) as info:
        p.setup(POD, ctx())
    err = info.value
    assert type(err) is cls
    assert words in err.message
    assert (err.plugin, err.action) == ("p", "setup")  # type: ignore[attr-defined]
    assert err.exit_status == exit_status  # type: ignore[attr-defined]
    assert err.signal == sig  # type: ignore[attr-defined]
    assert err.details["pod"] == "default/web-0"  # type: ignore[attr-defined]
    if completed.get("stderr"):
        assert err.stderr_tail == completed["stderr"].decode().strip()  # type: ignore[attr-defined]
    if cls is PluginTimeout:
        assert err.timeout == 7.5  # type: ignore[attr-defined]


def test_stderr_tail_is_bounded_and_keeps_the_end(fake_runner: Any) -> None:
    fake_runner.respond("teardown", returncode=1, stderr=b"noise " * 5000 + b"the real reason")
    with pytest.raises(PluginFailed) as info:
        ExecPlugin("p", "/x/p/p", runner=fake_runner).teardown(POD, ctx())
    assert info.value.stderr_tail.endswith("the real reason")
    assert len(info.value.stderr_tail) <= TAIL


@pytest.mark.parametrize("err", [errno.ENOENT, errno.EACCES, errno.ENOEXEC])
def test_spawn_error_is_a_plugin_failure_naming_the_path(fake_runner: Any, err: int) -> None:
    fake_runner.spawn_error("init", err)
    with pytest.raises(PluginFailed) as info:
        ExecPlugin("p", "/x/p/p", runner=fake_runner).init(ctx())
    assert info.value.details["path"] == "/x/p/p"
    assert os.strerror(err) in info.value.message
    assert info.value.action == "init"


def test_status_output_over_the_bound_is_an_output_error(fake_runner: Any) -> None:
    fake_runner.respond("status", stdout=b'{"ip":"10.1.2.3"}', stdout_truncated=True)
    with pytest.raises(PluginOutputError) as info:
        ExecPlugin("p", "/x/p/p", runner=fake_runner).status(POD, ctx())
    assert "larger than 8192 bytes" in info.value.message


@pytest.mark.parametrize(("stdout", "ip"), [(b"", None), (b'{"ip":"10.9.8.7"}', "10.9.8.7")])
def test_status_result(fake_runner: Any, stdout: bytes, ip: str | None) -> None:
    fake_runner.respond("status", stdout=stdout, stderr=b"chatter on stderr")
    got = ExecPlugin("p", "/x/p/p", runner=fake_runner).status(POD, ctx())
    assert (got.ip if got else None) == ip


def test_a_failed_status_is_not_parsed(fake_runner: Any) -> None:
    fake_runner.respond("status", returncode=1, stdout=b"not json")
    with pytest.raises(PluginFailed) as info:
        ExecPlugin("p", "/x/p/p", runner=fake_runner).status(POD, ctx())
    assert not isinstance(info.value, PluginOutputError)
    assert info.value.stdout_tail == "not json"


# --- the real call: what a plugin sees ----------------------------------------------------------------------


def real_ctx(**kw: Any) -> CallContext:
    env = base_env(Config(state_dir="/tmp/np-state"), {"PATH": os.environ.get("PATH", DEFAULT_PATH)})
    return ctx(**{"env": env, "timeout": 30.0, "kill_grace": 0.3, **kw})


def test_real_plugin_sees_exact_argv_env_and_stdin(plugin_dir: Any) -> None:
    p = plugin_dir.install("vendor.example/real")
    plugin = ExecPlugin("vendor.example/real", str(p.exe))
    plugin.setup(POD, real_ctx(pod=POD_OBJ))
    plugin.teardown(POD, real_ctx())
    assert p.calls() == ["setup default web-0 abc123", "teardown default web-0 abc123"]
    env = p.env_of("setup")
    assert env["NETPLUGIN_ACTION"] == "setup"
    assert env["NETPLUGIN_PLUGIN"] == "vendor.example/real"
    assert env["NETPLUGIN_POD_NAMESPACE"] == "default"
    assert env["NETPLUGIN_POD_NAME"] == "web-0"
    assert env["NETPLUGIN_INFRA_ID"] == "abc123"
    assert env["NETPLUGIN_NETNS"] == "/var/run/netns/abc123"
    assert env["NETPLUGIN_STATE_DIR"] == "/tmp/np-state"
    assert json.loads(p.stdin_of("setup")) == POD_OBJ
    assert p.stdin_of("teardown") == ""


def test_real_plugin_stderr_never_breaks_status(plugin_dir: Any) -> None:
    p = plugin_dir.install("chatty")
    p.set("status", stdout='{"kind":"PodNetworkStatus","apiVersion":"v1beta1","ip":"10.203.0.5"}\n',
          stderr='warning: {"ip": "not an ip"} <- not JSON on stdout\n')
    got = ExecPlugin("chatty", str(p.exe)).status(POD, real_ctx())
    assert got == PodNetworkStatus("10.203.0.5")


def test_real_plugin_failure_quotes_stderr(plugin_dir: Any) -> None:
    p = plugin_dir.install("failing")
    p.set("setup", exit=3, stderr="cannot create veth: File exists\n")
    with pytest.raises(PluginFailed) as info:
        ExecPlugin("failing", str(p.exe)).setup(POD, real_ctx())
    err = info.value
    assert err.exit_status == 3
    assert err.stderr_tail == "cannot create veth: File exists"
    assert "network plugin 'failing' setup failed: exit status 3" in err.message
    assert "cannot create veth: File exists" in err.message


def test_real_plugin_killed_by_signal(plugin_dir: Any) -> None:
    p = plugin_dir.install("crashing")
    p.set("teardown", exit="signal:SEGV")
    with pytest.raises(PluginFailed) as info:
        ExecPlugin("crashing", str(p.exe)).teardown(POD, real_ctx())
    assert info.value.signal == signal.SIGSEGV
    assert info.value.exit_status is None
    assert "killed by signal SIGSEGV" in info.value.message


def test_real_plugin_timeout_names_plugin_action_and_limit(plugin_dir: Any) -> None:
    p = plugin_dir.install("slow")
    p.set("status", sleep=300)
    with pytest.raises(PluginTimeout) as info:
        ExecPlugin("slow", str(p.exe)).status(POD, real_ctx(timeout=0.5))
    assert info.value.message.startswith("network plugin 'slow' status timed out after 0.5s")
    assert (info.value.plugin, info.value.action, info.value.timeout) == ("slow", "status", 0.5)


def test_real_plugin_leaving_processes_fails(plugin_dir: Any, procs: Any) -> None:
    p = plugin_dir.install("leaky")
    p.set("setup", spawn=2)
    with pytest.raises(PluginFailed) as info:
        ExecPlugin("leaky", str(p.exe)).setup(POD, real_ctx())
    assert re.search(r"left \d+ process\(es\) running", info.value.message)
    assert info.value.exit_status == 0
    assert procs.still_alive(procs.read_pids(p.dir / "children.pids")) == []


def test_real_plugin_removed_after_selection_is_a_plugin_failure(plugin_dir: Any) -> None:
    p = plugin_dir.install("gone")
    p.exe.unlink()
    with pytest.raises(PluginFailed) as info:
        ExecPlugin("gone", str(p.exe)).init(real_ctx())
    assert "No such file or directory" in info.value.message


# --- version ------------------------------------------------------------------------------------------------


def test_version_is_the_content_hash_and_follows_changes(plugin_dir: Any) -> None:
    import hashlib

    p = plugin_dir.install("versioned")
    plugin = ExecPlugin("versioned", str(p.exe))
    v1 = plugin.version()
    assert v1 == "sha256:" + hashlib.sha256(p.exe.read_bytes()).hexdigest()
    os.utime(p.exe)  # touched, same content
    assert plugin.version() == v1
    with open(p.exe, "a") as f:
        f.write("# changed\n")
    v2 = plugin.version()
    assert v2 != v1
    assert v2 == "sha256:" + hashlib.sha256(p.exe.read_bytes()).hexdigest()


# --- built-ins ----------------------------------------------------------------------------------------------


def test_noop_plugin_does_nothing() -> None:
    noop = BUILTINS[NOOP_NAME](Config())
    assert isinstance(noop, NoopPlugin)
    assert noop.name == NOOP_NAME
    assert noop.init(ctx()) is None
    assert noop.setup(POD, ctx()) is None
    assert noop.teardown(POD, ctx()) is None
    assert noop.status(POD, ctx()) is None
    assert noop.version() == NoopPlugin().version()


@pytest.mark.parametrize("obj", [NoopPlugin(), ExecPlugin("p", "/x/p/p")], ids=["noop", "exec"])
def test_plugins_satisfy_the_protocol(obj: object) -> None:
    assert isinstance(obj, Plugin)


def test_register_builtin(monkeypatch: pytest.MonkeyPatch) -> None:
    name = "test.example/inproc"
    monkeypatch.delitem(BUILTINS, name, raising=False)  # restores the registry afterwards
    register_builtin(name, lambda config: NoopPlugin())
    assert name in BUILTINS
    with pytest.raises(ValueError, match="already registered"):
        register_builtin(name, lambda config: NoopPlugin())
    with pytest.raises(ValueError, match="already registered"):
        register_builtin(NOOP_NAME, lambda config: NoopPlugin())


@pytest.mark.parametrize("name", ["", "-bad", "a/b/c", "UPPER/x"])
def test_register_builtin_refuses_bad_names(name: str) -> None:
    with pytest.raises(InvalidArgument):
        register_builtin(name, lambda config: NoopPlugin())
    assert name not in BUILTINS


# --- dual stack: the 'ips' list (issue 11) --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stdout", "ip", "ips"),
    [
        pytest.param(b'{"ip":"10.1.2.3","ips":["10.1.2.3","FD00::3"]}', "10.1.2.3", ("10.1.2.3", "fd00::3"), id="both"),
        pytest.param(b'{"ips":["fd00::3","10.1.2.3"]}', "fd00::3", ("fd00::3", "10.1.2.3"), id="ips-only-v6-first"),
        pytest.param(b'{"ip":"10.1.2.3","ips":[]}', "10.1.2.3", ("10.1.2.3",), id="empty-ips"),
        pytest.param(b'{"ip":"10.1.2.3"}', "10.1.2.3", ("10.1.2.3",), id="no-ips"),
    ],
)
def test_parse_status_ips(stdout: bytes, ip: str, ips: tuple[str, ...]) -> None:
    got = parse_status(stdout, plugin="p")
    assert got is not None and (got.ip, got.ips) == (ip, ips)


@pytest.mark.parametrize(
    ("stdout", "words"),
    [
        pytest.param(b'{"ip":"10.1.2.3","ips":"10.1.2.3"}', "invalid 'ips' '10.1.2.3': must be a list", id="not-list"),
        pytest.param(b'{"ips":["10.1.2.3",7]}', "invalid address in 'ips' 7: must be a string", id="number"),
        pytest.param(b'{"ips":["10.1.2.x"]}', "invalid address in 'ips' '10.1.2.x': not an IPv4", id="bad"),
        pytest.param(b'{"ips":["10.1.2.3","10.1.2.4"]}', "at most one IPv4 and one IPv6 address", id="two-v4"),
        pytest.param(b'{"ip":"10.1.2.4","ips":["10.1.2.3","fd00::3"]}', "must be the first of", id="not-first"),
        pytest.param(b'{"ips":[]}', "no 'ip'", id="empty"),
    ],
)
def test_parse_status_rejects_bad_ips(stdout: bytes, words: str) -> None:
    with pytest.raises(PluginOutputError) as info:
        parse_status(stdout, plugin="p", pod="default/web-0")
    assert words in info.value.message


def test_pod_network_status_ips() -> None:
    single = PodNetworkStatus("10.1.2.3")
    assert single.ips == ("10.1.2.3",) and single == PodNetworkStatus("10.1.2.3", ("10.1.2.3",))
    dual = PodNetworkStatus("10.1.2.3", ("10.1.2.3", "fd00::3"))
    assert dual.to_dict() == {
        "apiVersion": "v1beta1", "kind": "PodNetworkStatus", "ip": "10.1.2.3", "ips": ["10.1.2.3", "fd00::3"],
    }
    assert parse_status(json.dumps(dual.to_dict()).encode(), plugin="p") == dual
