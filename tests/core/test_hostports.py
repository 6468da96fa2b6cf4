"""A pod's hostPorts from the runtime's portMappings capability or the Pod's spec, and the variable
plugins read (netplugin.core.hostports): what is accepted, what is refused and how it is named."""

from __future__ import annotations

from typing import Any

import pytest

from netplugin.core.errors import InvalidArgument
from netplugin.core.hostports import from_pod, from_runtime_config, parse_env, pod_host_ports, to_env
from netplugin.frontends.cni.netconf import host_ports_env
from netplugin.frontends.cni.spec import CniError
from netplugin.frontends.wire.codes import CNI_INVALID_CONFIG as E_CONFIG


@pytest.mark.parametrize(
    ("maps", "env"),
    [
        pytest.param(None, "", id="no-capability"),
        pytest.param([], "", id="none"),
        pytest.param([{"hostPort": 8080, "containerPort": 80, "protocol": "tcp", "hostIP": ""}], "tcp/8080/80",
                     id="spec-spelling"),
        pytest.param([{"HostPort": 53, "ContainerPort": 5353, "Protocol": "UDP", "HostIP": "0.0.0.0"}], "udp/53/5353",
                     id="containerd-1.6-spelling"),
        pytest.param([{"hostPort": 9, "containerPort": 9, "protocol": "SCTP", "hostIP": "fd00:0::1"}],
                     "sctp/9/9/fd00::1", id="sctp-ipv6-host-ip"),
        pytest.param([{"hostPort": 80, "containerPort": 80}] * 2, "tcp/80/80", id="duplicates-once"),
    ],
)
def test_the_capability_becomes_the_variable(maps: Any, env: str) -> None:
    conf: dict[str, Any] = {"type": "netplugin-cni"}
    if maps is not None:
        conf["runtimeConfig"] = {"portMappings": maps}
    assert to_env(from_runtime_config(conf)) == env
    assert host_ports_env(conf) == ({"NETPLUGIN_HOST_PORTS": env} if env else {})
    assert to_env(parse_env(env)) == env  # what a plugin reads back


@pytest.mark.parametrize(
    ("maps", "words"),
    [
        ("8080", "runtimeConfig.portMappings"),
        ([{"hostPort": 0, "containerPort": 80}], "runtimeConfig.portMappings[0].hostPort"),
        ([{"hostPort": 80, "containerPort": 70000}], "runtimeConfig.portMappings[0].containerPort"),
        ([{"hostPort": 80, "containerPort": 80, "protocol": "icmp"}], "must be TCP, UDP or SCTP"),
        ([{"hostPort": 80, "containerPort": 80, "hostIP": "node-1"}], "must be an IP address"),
        ([{"hostPort": 80, "containerPort": 80, "hostIP": "::1"}], "hostIP '::1': IPv6 has no route_localnet"),
        ([{"hostPort": 80, "containerPort": 80, "hostIP": "::ffff:10.0.0.5"}], "IPv4-mapped address: use 10.0.0.5"),
        # a zone names a link, not an address of the node: never handed to nft verbatim
        ([{"hostPort": 80, "containerPort": 80, "hostIP": "fe80::1%eth0"}], "portMappings[0].hostIP 'fe80::1%eth0'"),
        ([{"hostPort": 80, "containerPort": 80, "hostIP": "fd00::1%1"}], "scoped address"),
    ],
)
def test_a_bad_mapping_is_error_7_naming_it(maps: Any, words: str) -> None:
    with pytest.raises(CniError) as info:
        host_ports_env({"runtimeConfig": {"portMappings": maps}})
    assert info.value.code == E_CONFIG and words in info.value.msg


#: (the setting in the config's env, the hostIP, what the refusal says or None: accepted)
LOOPBACK_CASES = [
    pytest.param({}, "127.0.0.1", None, id="default-maps-127.0.0.1"),
    pytest.param({"NETPLUGIN_HOSTPORT_LOCALHOST": "true"}, "127.0.0.2", None, id="on-maps-127/8"),
    pytest.param({"NETPLUGIN_HOSTPORT_LOCALHOST": "false"}, "127.0.0.1",
                 "runtimeConfig.portMappings[0].hostIP '127.0.0.1': a loopback hostIP is mapped only with "
                 "NETPLUGIN_HOSTPORT_LOCALHOST=true, which is off", id="off-refuses-naming-the-setting"),
    pytest.param({"NETPLUGIN_HOSTPORT_LOCALHOST": "no"}, "10.0.0.5", None, id="off-other-host-ips-mapped"),
    pytest.param({"NETPLUGIN_HOSTPORT_LOCALHOST": "maybe"}, "10.0.0.5", "invalid NETPLUGIN_HOSTPORT_LOCALHOST 'maybe'",
                 id="bad-setting"),
]  # fmt: skip


@pytest.mark.parametrize(("settings", "host_ip", "refused"), LOOPBACK_CASES)
def test_a_loopback_host_ip_is_mapped_unless_the_setting_is_off(
    settings: dict[str, str], host_ip: str, refused: str | None
) -> None:
    conf = {"runtimeConfig": {"portMappings": [{"hostPort": 54323, "containerPort": 8080, "hostIP": host_ip}]}}
    if refused is None:
        assert host_ports_env(conf, settings) == {"NETPLUGIN_HOST_PORTS": f"tcp/54323/8080/{host_ip}"}
        return
    with pytest.raises(CniError) as info:
        host_ports_env(conf, settings)
    assert info.value.code == E_CONFIG and refused in info.value.msg


@pytest.mark.parametrize("host_ip", ["127.0.0.1", "127.1.2.3"])
def test_the_members_refuse_a_loopback_host_ip_in_the_variable_with_the_setting_off(host_ip: str) -> None:
    assert to_env(parse_env(f"tcp/54323/8080/{host_ip}", True)) == f"tcp/54323/8080/{host_ip}"
    with pytest.raises(InvalidArgument) as info:
        parse_env(f"tcp/54323/8080/{host_ip}", False)
    message = info.value.message
    assert "NETPLUGIN_HOST_PORTS[0].hostIP" in message and "NETPLUGIN_HOSTPORT_LOCALHOST=true" in message


POD = {"spec": {"containers": [
    {"name": "web", "ports": [{"containerPort": 80, "hostPort": 8080}, {"containerPort": 9090}]},
    {"name": "dns", "ports": [{"containerPort": 53, "hostPort": 53, "protocol": "UDP", "hostIP": "10.0.0.5"}]},
]}}  # fmt: skip


def test_the_pods_spec_is_the_source_when_the_runtime_passes_none() -> None:
    assert to_env(from_pod(POD)) == "tcp/8080/80 udp/53/53/10.0.0.5"
    assert pod_host_ports({}, POD) == {"NETPLUGIN_HOST_PORTS": "tcp/8080/80 udp/53/53/10.0.0.5"}
    assert pod_host_ports({"NETPLUGIN_HOST_PORTS": "tcp/1/1"}, POD) == {}  # the runtime's win
    assert pod_host_ports({}, {"spec": {"containers": [{"name": "x"}]}}) == {}
    assert pod_host_ports({}, None) == {}


@pytest.mark.parametrize("value", ["tcp/80", "tcp/x/80", "gre/1/1", "tcp/80/80/::1", "tcp/80/80/a/b"])
def test_a_bad_variable_is_refused(value: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_env(value)
    assert "NETPLUGIN_HOST_PORTS[0]" in info.value.message


@pytest.mark.parametrize("value", ["tcp/80/80/fe80::1%eth0", "udp/53/53/fd00::5%lo"])
def test_a_scoped_host_ip_in_the_variable_is_refused(value: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_env(value)
    assert "NETPLUGIN_HOST_PORTS[0].hostIP" in info.value.message and "scoped" in info.value.message


@pytest.mark.parametrize(
    ("value", "ips", "refused"),
    [
        ("tcp/80/80/fd00::1", ["10.201.9.2"], "no IPv6 address"),
        ("tcp/80/80 udp/53/53/10.0.0.5", ["fd00:10:201:9::2"], "NETPLUGIN_HOST_PORTS[1].hostIP '10.0.0.5'"),
        ("tcp/80/80/fd00::1", ["10.201.9.2", "fd00:10:201:9::2"], None),
        ("tcp/80/80", ["10.201.9.2"], None),
    ],
)
def test_a_host_ip_of_a_family_the_pod_lacks_is_refused(value: str, ips: list[str], refused: str | None) -> None:
    from netplugin.core.hostports import check_families

    if refused is None:
        check_families(parse_env(value), ips)
        return
    with pytest.raises(InvalidArgument) as info:
        check_families(parse_env(value), ips)
    assert refused in info.value.message
