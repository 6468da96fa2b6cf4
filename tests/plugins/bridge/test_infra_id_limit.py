"""Infra ids at the length limit work end to end with both bridge plugins (issue 13, class 7).

``names.MAX_INFRA_ID`` is what every consumer can store: ids of 248-256 characters used to pass
validation and then fail in both bridge plugins (their temporary file names grew past 255 bytes).
Here the longest accepted id is set up, reported and torn down by the bash plugin and by the
native one (crossed over, as a node switching plugins would), on a real bridge.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest

from netplugin.core.errors import InvalidArgument
from netplugin.core.names import MAX_INFRA_ID, PodRef, validate_infra_id
from netplugin.core.plugin import CallContext
from netplugin.plugins.bridge.bridge_plugin import NativeBridgePlugin
from tests.support.bridgenet import BridgeNet, Pod, host_veth_name, link_exists

kernel = pytest.mark.kernel


def long_pod(net: BridgeNet, n: int) -> Pod:
    # Every character class the rule allows, padded to exactly the limit.
    infra = f"{net.tag}{n}A_b.c-"
    infra += "x" * (MAX_INFRA_ID - len(infra))
    assert validate_infra_id(infra) == infra and len(infra) == MAX_INFRA_ID
    net.infra_ids.append(infra)
    netns = net.add_netns(f"long{n}")
    return Pod("default", f"long-{n}", infra, netns, host_veth_name(infra))


def test_one_character_more_is_refused_before_any_plugin_runs() -> None:
    with pytest.raises(InvalidArgument, match=f"at most {MAX_INFRA_ID} characters"):
        PodRef("default", "p", "a" * (MAX_INFRA_ID + 1))


@kernel
@pytest.mark.parametrize("first", ["bash", "native"])
def test_longest_infra_id_with_both_bridge_plugins(bridge_net_factory: Callable[..., BridgeNet], first: str) -> None:
    net = bridge_net_factory()
    net.ok("init")
    native = NativeBridgePlugin(state_dir=str(net.np_state))

    def call(plugin: str, action: str, pod: Pod) -> subprocess.CompletedProcess[str] | None:
        if plugin == "bash":
            return net.ok(action, pod)
        ctx = CallContext(netns=pod.netns_path, env=dict(net.env), state_dir=str(net.np_state), timeout=30)
        ref = PodRef(pod.namespace, pod.name, pod.infra_id)
        getattr(native, action)(ref, ctx)
        return None

    second = "native" if first == "bash" else "bash"
    pods = [long_pod(net, 0), long_pod(net, 1)]
    for p in pods:
        call(first, "setup", p)
        assert link_exists(p.host_veth)
    ips = [net.pod_ip(p) for p in pods]
    assert len(set(ips)) == 2
    assert net.ipam_files("pods") == sorted(p.infra_id for p in pods)
    for p, ip in zip(pods, ips, strict=True):
        assert net.status_ip(p) == ip  # the bash plugin reads what either wrote
        call(second, "setup", p)  # idempotent across plugins: same address
        assert net.pod_ip(p) == ip
    net.serve(pods[1])
    assert net.connect_from(pods[0], [ips[1]]) == {ips[1]: pods[1].name}
    for p in pods:
        call(second, "teardown", p)
        native.reaper.settle(p.host_veth, 10)  # the native teardown answers before the kernel's deletion
        assert not link_exists(p.host_veth)
    assert net.ipam_files("pods") == [] and net.ipam_files("ips") == []
