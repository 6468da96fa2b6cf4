"""The CNI shim as a runtime sees it: real ``netplugin.frontends.cni`` processes, a real (scriptable) exec plugin."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from netplugin.core.spares import SPARE_DIR
from netplugin.frontends.cni.netconf import derived_pod_name
from netplugin.frontends.cni.result import make_result
from netplugin.frontends.cni.spec import NO_NETNS, SUPPORTED_VERSIONS, parse_cni_args

CID = "c0ffee0123456789abcdef"
K8S_ARGS = "IgnoreUnknown=1;K8S_POD_NAMESPACE=web;K8S_POD_NAME=web-0"

# --- VERSION ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("asked", ["0.3.1", "1.0.0", "1.1.0"])
def test_version_lists_supported_versions_and_echoes_the_request(shim: Any, asked: str) -> None:
    done = shim.run("VERSION", stdin=json.dumps({"cniVersion": asked}), container_id=None, netns="dummy")
    assert done.returncode == 0, done
    assert done.doc == {"cniVersion": asked, "supportedVersions": list(SUPPORTED_VERSIONS)}


def test_version_needs_no_plugin_and_tolerates_empty_stdin(shim: Any) -> None:
    # podman calls VERSION before DEL with CNI_IFNAME/CNI_NETNS/CNI_PATH "dummy" and no container id.
    done = shim.run("VERSION", stdin="", container_id="", ifname="dummy", netns="dummy", args="")
    assert done.returncode == 0, done
    assert done.doc["supportedVersions"] == ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]


# --- ADD ----------------------------------------------------------------------------------------------


def test_add_runs_init_setup_status_and_prints_a_result(shim: Any, fake: Any) -> None:
    done = shim.run("ADD", ifname="net1")
    assert done.returncode == 0, done
    assert fake.calls() == ["init", f"setup web web-0 {CID}", f"status web web-0 {CID}"]
    assert done.doc == {
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "net1", "sandbox": str(shim.netns)}],
        "ips": [{"address": "10.201.5.7/24", "gateway": "10.201.5.1", "interface": 0}],
    }
    env = fake.env_of("setup")
    assert env["NETPLUGIN_NETNS"] == str(shim.netns)
    assert env["NETPLUGIN_IFNAME"] == "net1"
    assert env["NETPLUGIN_BRIDGE_IFNAME"] == "net1"
    assert env["NETPLUGIN_BRIDGE_SUBNET"] == "10.201.5.0/24"
    assert env["NETPLUGIN_STATE_DIR"] == shim.conf["stateDir"]
    # the runtime's CNI variables reach the plugin too (inherit_env is on by default)
    assert env["CNI_CONTAINERID"] == CID


def test_add_runs_init_once(shim: Any, fake: Any) -> None:
    assert shim.run("ADD").returncode == 0
    assert shim.run("ADD", container_id="second1").returncode == 0
    assert [c for c in fake.calls() if c == "init"] == ["init"]


def test_add_result_versions(shim: Any, fake: Any) -> None:
    old = shim.run("ADD", conf=shim.with_conf(cniVersion="0.4.0")).doc
    assert old["cniVersion"] == "0.4.0"
    assert old["ips"][0]["version"] == "4"
    new = shim.run("ADD", conf=shim.with_conf(cniVersion="1.1.0")).doc
    assert new["cniVersion"] == "1.1.0"
    assert "version" not in new["ips"][0]


def test_add_address_outside_the_subnet_is_a_host_address(shim: Any, fake: Any) -> None:
    fake.set("status", stdout='{"ip":"192.0.2.77"}')
    done = shim.run("ADD")
    assert done.doc["ips"] == [{"address": "192.0.2.77/32", "interface": 0}]
    fake.set("status", stdout='{"ip":"fd00::5"}')
    assert shim.run("ADD").doc["ips"] == [{"address": "fd00::5/128", "interface": 0}]


def test_add_gateway_from_settings(shim: Any, fake: Any) -> None:
    conf = shim.with_conf(env={"NETPLUGIN_BRIDGE_SUBNET": "10.201.5.0/24", "NETPLUGIN_BRIDGE_GATEWAY": "10.201.5.254"})
    assert shim.run("ADD", conf=conf).doc["ips"][0]["gateway"] == "10.201.5.254"


def test_add_without_status_output_reports_no_ips(shim: Any, fake: Any) -> None:
    fake.clear("status")
    done = shim.run("ADD")
    assert done.returncode == 0, done
    assert done.doc["ips"] == []
    assert done.doc["interfaces"] == [{"name": "eth0", "sandbox": str(shim.netns)}]


def test_add_extends_prev_result(shim: Any, fake: Any) -> None:
    prev = {
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "lo", "sandbox": "/x"}],
        "ips": [{"address": "127.0.0.1/8", "interface": 0}],
        "dns": {"nameservers": ["10.96.0.10"]},
    }
    done = shim.run("ADD", conf=shim.with_conf(prevResult=prev))
    assert done.returncode == 0, done
    assert [i["name"] for i in done.doc["interfaces"]] == ["lo", "eth0"]
    assert done.doc["ips"][1] == {"address": "10.201.5.7/24", "gateway": "10.201.5.1", "interface": 1}
    assert done.doc["dns"] == prev["dns"]


def test_add_podman_args_use_the_container_name_or_a_derived_one(shim: Any, fake: Any) -> None:
    assert shim.run("ADD", args="IgnoreUnknown=1;K8S_POD_NAME=my-box").returncode == 0
    # podman allows names that are not DNS-1123 subdomains: the pod name is derived from the id
    cid = "ABCdef_0123456789xyz"
    assert shim.run("ADD", container_id=cid, args="IgnoreUnknown=1;K8S_POD_NAME=My_Box").returncode == 0
    assert shim.run("ADD", container_id="nothing12", args="").returncode == 0
    setups = [c for c in fake.calls() if c.startswith("setup")]
    assert setups == [
        f"setup default my-box {CID}",
        f"setup default cni-abcdef012345 {cid}",
        "setup default cni-nothing12 nothing12",
    ]
    assert derived_pod_name(cid) == "cni-abcdef012345"


def test_add_default_namespace_from_config(shim: Any, fake: Any) -> None:
    done = shim.run("ADD", conf=shim.with_conf(defaultNamespace="lab"), args="K8S_POD_NAME=box")
    assert done.returncode == 0, done
    assert f"setup lab box {CID}" in fake.calls()


def test_add_plugin_failure_is_999_with_stderr_and_rolls_back(shim: Any, fake: Any) -> None:
    fake.set("setup", exit=3, stderr="no free address in 10.201.5.0/24")
    done = shim.run("ADD")
    err = done.error()
    assert err["code"] == 999
    assert "setup failed" in err["msg"]
    assert "no free address in 10.201.5.0/24" in err["details"]
    assert err["cniVersion"] == "1.0.0"
    assert fake.calls()[-1] == f"teardown web web-0 {CID}"


def test_add_failure_with_failed_rollback_says_so(shim: Any, fake: Any) -> None:
    fake.set("setup", exit=1, stderr="veth failed")
    fake.set("teardown", exit=1, stderr="cannot release")
    err = shim.run("ADD").error()
    assert err["code"] == 999
    assert "veth failed" in err["details"] and "cannot release" in err["details"]


def test_add_timeout_is_try_again_later(shim: Any, fake: Any) -> None:
    fake.set("setup", sleep=30)
    conf = shim.with_conf(netplugin={"timeouts": {"setup": 0.5}, "kill_grace": 0.2})
    done = shim.run("ADD", conf=conf)
    err = done.error()
    assert err["code"] == 11, err
    assert "timed out" in err["msg"]


def test_add_status_failure_after_setup_is_reported(shim: Any, fake: Any) -> None:
    fake.set("status", stdout="not json")
    err = shim.run("ADD").error()
    assert err["code"] == 999
    assert "not JSON" in err["msg"]


# --- DEL ------------------------------------------------------------------------------------------------


def test_del_tears_down_and_is_idempotent(shim: Any, fake: Any) -> None:
    assert shim.run("ADD").returncode == 0
    for _ in range(2):
        done = shim.run("DEL")
        assert done.returncode == 0, done
        assert done.stdout == ""
    assert fake.calls()[-2:] == [f"teardown web web-0 {CID}"] * 2
    assert fake.env_of("teardown")["NETPLUGIN_NETNS"] == str(shim.netns)


def test_del_without_netns(shim: Any, fake: Any) -> None:
    done = shim.run("DEL", netns="")
    assert done.returncode == 0, done
    assert fake.env_of("teardown")["NETPLUGIN_NETNS"] == NO_NETNS
    # a netns that is already gone is passed as it is; the plugin's teardown copes
    assert shim.run("DEL", netns=str(shim.tmp / "gone")).returncode == 0
    assert fake.env_of("teardown")["NETPLUGIN_NETNS"] == str(shim.tmp / "gone")


def test_del_names_the_same_pod_as_add(shim: Any, fake: Any) -> None:
    args = "IgnoreUnknown=1;K8S_POD_NAME=Upper_Case"
    assert shim.run("ADD", args=args).returncode == 0
    assert shim.run("DEL", args=args, netns="").returncode == 0
    setup, teardown = (c for c in fake.calls() if c.startswith(("setup", "teardown")))
    assert setup.split()[1:] == teardown.split()[1:]


def test_a_runtime_name_no_pod_can_have_gives_way_to_a_derived_one(shim: Any, fake: Any) -> None:
    # critest names its sandboxes with capitals; the namespace is still a Kubernetes one
    assert shim.run("ADD", args="K8S_POD_NAMESPACE=cri-test;K8S_POD_NAME=PodSandbox-for-test-1").returncode == 0
    setup = next(c for c in fake.calls() if c.startswith("setup"))
    assert setup.split()[1:3] == ["cri-test", f"cni-{CID[:12].lower()}"], setup


def test_del_uses_the_identity_add_recorded(shim: Any, fake: Any) -> None:
    assert shim.run("ADD", args="IgnoreUnknown=1;K8S_POD_NAME=before").returncode == 0
    assert shim.run("DEL", args="IgnoreUnknown=1;K8S_POD_NAME=after").returncode == 0
    assert fake.calls()[-1] == f"teardown default before {CID}"
    # with no record (never added here), the call's own arguments name the pod
    assert shim.run("DEL", args="IgnoreUnknown=1;K8S_POD_NAME=after").returncode == 0
    assert fake.calls()[-1] == f"teardown default after {CID}"


def test_add_and_del_keep_netplugin_pod_records(shim: Any, fake: Any) -> None:
    assert shim.run("ADD").returncode == 0
    records = list((Path(shim.conf["stateDir"]) / "pods").glob("*.json"))
    assert [r.name for r in records] == [f"web_web-0_{CID}.json"]
    record = json.loads(records[0].read_text())
    assert (record["state"], record["ip"], record["netns"]) == ("ready", "10.201.5.7", str(shim.netns))
    assert shim.run("DEL").returncode == 0
    assert list((Path(shim.conf["stateDir"]) / "pods").glob("*.json")) == []


def test_del_failure_is_reported(shim: Any, fake: Any) -> None:
    fake.set("teardown", exit=1, stderr="device busy")
    err = shim.run("DEL").error()
    assert err["code"] == 999 and "device busy" in err["details"]


# --- CHECK ----------------------------------------------------------------------------------------------


def _prev(address: str) -> dict[str, Any]:
    return {"cniVersion": "1.0.0", "interfaces": [{"name": "eth0"}], "ips": [{"address": address, "interface": 0}]}


def test_check_passes_when_the_address_matches(shim: Any, fake: Any) -> None:
    done = shim.run("CHECK", conf=shim.with_conf(prevResult=_prev("10.201.5.7/24")))
    assert done.returncode == 0, done
    assert fake.calls()[-1] == f"status web web-0 {CID}"


def test_check_fails_when_the_address_differs(shim: Any, fake: Any) -> None:
    err = shim.run("CHECK", conf=shim.with_conf(prevResult=_prev("10.201.5.9/24"))).error()
    assert err["code"] == 999
    assert "10.201.5.7" in err["msg"] and "10.201.5.9" in err["msg"]


def test_check_unknown_container_is_code_3(shim: Any, fake: Any) -> None:
    fake.clear("status")
    err = shim.run("CHECK", conf=shim.with_conf(prevResult=_prev("10.201.5.7/24"))).error()
    assert err["code"] == 3


def test_check_needs_prev_result(shim: Any, fake: Any) -> None:
    err = shim.run("CHECK").error()
    assert err["code"] == 7 and "prevResult" in err["msg"]


# --- STATUS ---------------------------------------------------------------------------------------------


def test_status_ready_runs_init(shim: Any, fake: Any) -> None:
    done = shim.run("STATUS", container_id=None, ifname=None, args=None, netns="")
    assert done.returncode == 0, done
    assert done.stdout == ""
    assert fake.calls() == ["init"]


def test_status_unavailable_when_init_fails(shim: Any, fake: Any) -> None:
    fake.set("init", exit=1, stderr="bridge module missing")
    err = shim.run("STATUS", container_id=None, ifname=None, args=None, netns="").error()
    assert err["code"] == 50
    assert "bridge module missing" in err["details"]


def test_status_unavailable_when_plugin_missing(shim: Any, plugin_dir: Any) -> None:
    err = shim.run("STATUS", container_id=None, ifname=None, netns="").error()
    assert err["code"] == 50
    assert "'fake' not found" in err["msg"]


# --- GC -------------------------------------------------------------------------------------------------


def _gc(shim: Any, valid: list[dict[str, str]], **changes: Any) -> Any:
    conf = shim.with_conf(**{"cni.dev/valid-attachments": valid}, **changes)
    return shim.run("GC", conf=conf, container_id=None, ifname=None, netns="", args=None)


def _teardowns(fake: Any) -> list[str]:
    return [c.split()[3] for c in fake.calls() if c.startswith("teardown")]


def test_gc_tears_down_only_attachments_that_are_no_longer_valid(shim: Any, fake: Any) -> None:
    for cid in ("keep1", "gone2", "keep3"):
        assert shim.run("ADD", container_id=cid, args=f"K8S_POD_NAMESPACE=web;K8S_POD_NAME=p-{cid}").returncode == 0
    index = Path(shim.conf["stateDir"]) / "cni" / "nptest"
    assert sorted(p.name for p in index.iterdir()) == ["gone2:eth0.json", "keep1:eth0.json", "keep3:eth0.json"]

    done = _gc(shim, [{"containerID": "keep1", "ifname": "eth0"}, {"containerID": "keep3"}])
    assert done.returncode == 0, done
    assert _teardowns(fake) == ["gone2"]
    assert "teardown web p-gone2 gone2" in fake.calls()
    # the netns recorded at ADD is the one the teardown gets
    assert fake.env_of("teardown")["NETPLUGIN_NETNS"] == str(shim.netns)
    assert sorted(p.name for p in index.iterdir() if p.name != SPARE_DIR) == ["keep1:eth0.json", "keep3:eth0.json"]

    assert _gc(shim, [{"containerID": "keep1", "ifname": "eth0"}, {"containerID": "keep3"}]).returncode == 0
    assert _teardowns(fake) == ["gone2"]  # nothing more to collect


def test_gc_only_touches_its_own_network(shim: Any, fake: Any) -> None:
    assert shim.run("ADD", container_id="mine1").returncode == 0
    assert shim.run("ADD", container_id="theirs1", conf=shim.with_conf(name="other")).returncode == 0
    assert _gc(shim, []).returncode == 0
    assert _teardowns(fake) == ["mine1"]


def test_gc_after_del_has_nothing_to_do(shim: Any, fake: Any) -> None:
    assert shim.run("ADD").returncode == 0
    assert shim.run("DEL").returncode == 0
    assert _gc(shim, []).returncode == 0
    assert _teardowns(fake) == [CID]  # only the DEL's


def test_gc_continues_past_failures_and_reports_them(shim: Any, fake: Any) -> None:
    for cid in ("old1", "old2"):
        assert shim.run("ADD", container_id=cid).returncode == 0
    fake.set("teardown", exit=1, stderr="busy")
    err = _gc(shim, []).error()
    assert err["code"] == 999
    assert "old1" in err["details"] and "old2" in err["details"]
    assert _teardowns(fake) == ["old1", "old2"]
    fake.clear("teardown")
    assert _gc(shim, []).returncode == 0  # the failed ones were kept and are retried
    assert _teardowns(fake) == ["old1", "old2", "old1", "old2"]


def test_gc_needs_valid_attachments(shim: Any, fake: Any) -> None:
    err = shim.run("GC", container_id=None, ifname=None, netns="").error()
    assert err["code"] == 7 and "valid-attachments" in err["msg"]
    conf = shim.with_conf(**{"cni.dev/valid-attachments": [{"ifname": "eth0"}]})
    assert shim.run("GC", conf=conf, container_id=None, ifname=None, netns="").error()["code"] == 7


# --- bad environment ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"command": None}, "CNI_COMMAND is not set"),
        ({"command": "FROB"}, "unknown CNI_COMMAND 'FROB'"),
        ({"container_id": None}, "CNI_CONTAINERID"),
        ({"container_id": "-bad"}, "CNI_CONTAINERID"),
        ({"ifname": None}, "CNI_IFNAME"),
        ({"ifname": "a" * 16}, "at most 15"),
        ({"ifname": "eth 0"}, "whitespace"),
        ({"netns": ""}, "CNI_NETNS is required"),
        ({"netns": "/nonexistent/netns"}, "does not exist"),
        ({"args": "K8S_POD_NAME"}, "not KEY=VALUE"),
        ({"args": "K8S_POD_NAMESPACE=Bad_NS;K8S_POD_NAME=x"}, "K8S_POD_NAMESPACE"),
    ],
)
def test_bad_environment_is_code_4(shim: Any, fake: Any, overrides: dict[str, Any], needle: str) -> None:
    command = overrides.pop("command", "ADD")
    err = shim.run(command, **overrides).error()
    assert err["code"] == 4, err
    assert needle in err["msg"]
    assert [c for c in fake.calls() if c != "init"] == []


# --- bad stdin and config -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "stdin",
    ["", "{not json", "[1, 2]", '"text"', pytest.param("[" * 100000 + "]" * 100000, id="too-deep")],
)
def test_undecodable_config_is_code_6(shim: Any, fake: Any, stdin: str) -> None:
    err = shim.run("ADD", stdin=stdin).error()
    assert err["code"] == 6
    assert fake.calls() == []


@pytest.mark.parametrize("version", ["0.2.0", "2.0.0", None])
def test_unsupported_version_is_code_1(shim: Any, fake: Any, version: str | None) -> None:
    err = shim.run("ADD", conf=shim.with_conf(cniVersion=version)).error()
    assert err["code"] == 1
    assert "1.1.0" in err.get("details", "")
    assert fake.calls() == []


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"pluginDir": 5}, "pluginDir"),
        ({"plugin": "bad name!"}, "plugin"),
        ({"netplugin": {"timeouts": {"setup": -1}}}, "netplugin.timeouts"),
        ({"netplugin": {"no_such_key": 1}}, "netplugin.no_such_key"),
        ({"netplugin": "nope"}, "netplugin"),
        ({"netplugin": {"netns_template": "/x/{infra_id}"}}, "netplugin.netns_template"),
        ({"env": ["A=1"]}, "env"),
        ({"env": {"A": {"nested": 1}}}, "env.A"),
        ({"defaultNamespace": "Not_Valid"}, "defaultNamespace"),
        ({"configFile": "/nonexistent/netplugin.yaml"}, "configFile"),
        ({"name": "-bad-name"}, "network name"),
    ],
)
def test_bad_config_is_code_7_naming_the_key(shim: Any, fake: Any, changes: dict[str, Any], key: str) -> None:
    err = shim.run("ADD", conf=shim.with_conf(**changes)).error()
    assert err["code"] == 7, err
    assert key in err["msg"], err
    assert fake.calls() == []


def test_missing_plugin_is_code_7(shim: Any, plugin_dir: Any) -> None:
    err = shim.run("ADD").error()
    assert err["code"] == 7 and "'fake' not found" in err["msg"]


def test_unusable_run_dir_is_an_io_error(shim: Any, fake: Any, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    err = shim.run("ADD", conf=shim.with_conf(runDir=str(blocker / "run"))).error()
    assert err["code"] == 5, err


def test_config_file_and_precedence(shim: Any, fake: Any, tmp_path: Path) -> None:
    cfg = tmp_path / "np.yaml"
    cfg.write_text("env:\n  NETPLUGIN_BRIDGE_SUBNET: 10.201.9.0/24\n  FROM_FILE: yes-file\ntimeouts:\n  setup: 7\n")
    conf = shim.with_conf(configFile=str(cfg), env={"NETPLUGIN_BRIDGE_SUBNET": "10.201.5.0/24"})
    done = shim.run("ADD", conf=conf)
    assert done.returncode == 0, done
    env = fake.env_of("setup")
    assert env["FROM_FILE"] == "yes-file"
    assert env["NETPLUGIN_BRIDGE_SUBNET"] == "10.201.5.0/24"  # the network config wins
    assert done.doc["ips"][0]["address"] == "10.201.5.7/24"


def test_log_file_gets_one_line_per_call(shim: Any, fake: Any, tmp_path: Path) -> None:
    log = tmp_path / "cni.log"
    conf = shim.with_conf(logFile=str(log))
    shim.run("ADD", conf=conf)
    shim.run("DEL", conf=conf)
    shim.run("CHECK", conf=conf)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [entry["command"] for entry in lines] == ["ADD", "DEL", "CHECK"]
    assert lines[0]["result"] == "ok" and lines[0]["containerID"] == CID
    assert lines[2]["result"]["code"] == 7


# --- pure helpers ---------------------------------------------------------------------------------------


def test_parse_cni_args() -> None:
    assert parse_cni_args("") == {}
    assert parse_cni_args("IgnoreUnknown=1;K8S_POD_NAME=a=b;;") == {"IgnoreUnknown": "1", "K8S_POD_NAME": "a=b"}


def test_make_result_includes_mac_when_known() -> None:
    result = make_result("1.0.0", "eth0", "/run/netns/x", "10.201.5.3", {}, mac="aa:bb:cc:dd:ee:ff")
    assert result["interfaces"] == [{"name": "eth0", "mac": "aa:bb:cc:dd:ee:ff", "sandbox": "/run/netns/x"}]
    assert result["ips"] == [{"address": "10.201.5.3/32", "interface": 0}]


@pytest.mark.parametrize(
    ("prev", "host", "want_names", "want_index"),
    [
        pytest.param(None, None, [("eth0", "/run/netns/x")], 0, id="no-host-interface"),
        pytest.param(None, ("np0a1b2c", "02:00:00:00:00:01"), [("np0a1b2c", None), ("eth0", "/run/netns/x")], 1,
                     id="host-veth-first"),
        pytest.param({"interfaces": [{"name": "lo", "sandbox": "/x"}], "ips": []}, ("np0a1b2c", None),
                     [("lo", "/x"), ("np0a1b2c", None), ("eth0", "/run/netns/x")], 2, id="after-a-prev-result"),
    ],
)
def test_the_result_lists_the_host_veth_and_the_ips_point_at_the_pod_interface(
    prev: Any, host: Any, want_names: list[Any], want_index: int
) -> None:
    result = make_result("1.0.0", "eth0", "/run/netns/x", "10.201.5.3", {}, prev, host=host)
    assert [(i["name"], i.get("sandbox")) for i in result["interfaces"]] == want_names
    assert result["ips"] == [{"address": "10.201.5.3/32", "interface": want_index}]
    if host and host[1]:
        assert result["interfaces"][0] == {"name": host[0], "mac": host[1]}
