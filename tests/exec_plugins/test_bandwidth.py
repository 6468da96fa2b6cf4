"""The shipped bandwidth plugin as a chain member behind the bash bridge and the native bridge.

Kernel tests: real pods (netns, veths, the bridge) set up through the Manager with the chain
``[bridge, bandwidth]``, and real TCP transfers between two pods measured at the receiver. The
measured rate must be within 25 % of the annotation in each direction, and far above it for the
pod without annotations. Plus the plugin's input handling (quantities, bad values, no-op).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from netplugin.core.errors import PluginFailed
from netplugin.core.names import PodRef
from netplugin.manager.manager import CallOptions, Manager
from netplugin.plugins import BRIDGE_NAME
from tests.support.bridgenet import EXEC_PLUGINS, BridgeNet, Pod, link_exists
from tests.support.fakehost import FakeHost
from tests.support.nettest import tcp_rate
from tests.support.waits import wait_for

kernel = pytest.mark.kernel
BANDWIDTH = EXEC_PLUGINS / "bandwidth" / "bandwidth"
#: how long a torn-down pod's host veth may take to go (its deletion follows the answer)
VETH_GONE = 10.0
IN, OUT = "kubernetes.io/ingress-bandwidth", "kubernetes.io/egress-bandwidth"

def transfer(src: Pod, dst: Pod, dst_ip: str, nbytes: int) -> float:
    return tcp_rate(src.netns, dst.netns, dst_ip, nbytes)


@dataclass
class ChainNet:
    net: BridgeNet
    manager: Manager
    host: FakeHost

    def pod(self, i: int, annotations: dict[str, str] | None = None) -> tuple[Pod, PodRef]:
        p = self.net.pod(i)
        meta: dict[str, Any] = {"namespace": p.namespace, "name": p.name, "uid": f"uid-{i}"}
        if annotations:
            meta["annotations"] = {**annotations, "kubectl.kubernetes.io/last-applied-configuration":
                                   '{"metadata":{"annotations":{"' + IN + '":"1k"}}}'}
        self.host.add({"apiVersion": "v1", "kind": "Pod", "metadata": meta})
        return p, PodRef(p.namespace, p.name, p.infra_id)

    def setup(self, p: Pod, ref: PodRef) -> None:
        self.manager.setup(ref, CallOptions(netns=p.netns_path))

    def teardown(self, p: Pod, ref: PodRef) -> None:
        self.manager.teardown(ref, CallOptions(netns=p.netns_path))


@pytest.fixture(params=["bridge", BRIDGE_NAME], ids=["bash-bridge", "native-bridge"])
def chain_net(request: Any, bridge_net_factory: Callable[..., BridgeNet], make_manager: Any,
              plugin_dir: Any) -> Iterator[ChainNet]:
    net = bridge_net_factory()
    for name, src in (("bridge", EXEC_PLUGINS / "bridge" / "bridge"), ("bandwidth", BANDWIDTH)):
        plugin_dir.install(name, script=src)
    host = FakeHost()
    env = {k: v for k, v in net.env.items() if k.startswith("NETPLUGIN_BRIDGE_")}
    m = make_manager(plugins=[request.param, "bandwidth"], host=host, env=env, state_dir=str(net.np_state))
    yield ChainNet(net, m, host)
    for ifb in _ifbs(net):
        subprocess.run(["ip", "link", "del", ifb], capture_output=True)


def _ifbs(net: BridgeNet) -> list[str]:
    out = subprocess.run(["bash", "-c", f'source <(sed -n "/^ifb_name()/,/^}}/p" {BANDWIDTH}); '
                          'for i in "$@"; do ifb_name "$i"; echo "$IFB"; done', "_", *net.infra_ids],
                         capture_output=True, text=True, check=True)
    return out.stdout.split()


@kernel
def test_two_pods_one_shaped_each_direction_within_a_quarter_of_the_limit(chain_net: ChainNet) -> None:
    c = chain_net
    shaped, shaped_ref = c.pod(0, {IN: "20M", OUT: "10M"})
    plain, plain_ref = c.pod(1)
    other, other_ref = c.pod(2)
    for p, ref in ((shaped, shaped_ref), (plain, plain_ref), (other, other_ref)):
        c.setup(p, ref)
    ips = {p.name: c.net.pod_ip(p) for p in (shaped, plain, other)}
    into = transfer(plain, shaped, ips[shaped.name], 5_000_000)  # ~2 s at 20 Mbit/s
    out_of = transfer(shaped, plain, ips[plain.name], 4_000_000)  # ~3 s at 10 Mbit/s
    free = transfer(plain, other, ips[other.name], 50_000_000)
    print(f"measured: into {into / 1e6:.2f} (limit 20), out of {out_of / 1e6:.2f} (limit 10), "
          f"unshaped {free / 1e6:.0f} Mbit/s")
    assert 0.75 * 20e6 <= into <= 1.25 * 20e6, f"into the shaped pod: {into / 1e6:.1f} Mbit/s"
    assert 0.75 * 10e6 <= out_of <= 1.25 * 10e6, f"out of the shaped pod: {out_of / 1e6:.1f} Mbit/s"
    assert free > 5 * 20e6, f"between unshaped pods: {free / 1e6:.1f} Mbit/s"

    ifb = _ifbs(c.net)[0]
    assert link_exists(ifb)
    c.teardown(shaped, shaped_ref)
    assert not link_exists(ifb)
    # the native bridge deletes a torn-down pod's host veth after its answer (docs/cni.md)
    wait_for(lambda: not link_exists(shaped.host_veth), f"{shaped.host_veth} deleted", VETH_GONE)
    c.teardown(shaped, shaped_ref)  # idempotent


@kernel
def test_a_bad_annotation_fails_the_chain_naming_it_and_rolls_the_bridge_back(chain_net: ChainNet) -> None:
    c = chain_net
    p, ref = c.pod(0, {OUT: "10 megabits"})
    with pytest.raises(PluginFailed) as info:
        c.setup(p, ref)
    assert info.value.plugin == "bandwidth" and f"invalid {OUT} '10 megabits'" in info.value.message
    assert info.value.details["rolled_back"] is True
    # the bridge member was rolled back; the native bridge deletes its host veth after the answer
    wait_for(lambda: not link_exists(p.host_veth), f"{p.host_veth} deleted", VETH_GONE)


# --- the plugin alone: input handling ----------------------------------------------------------------------


def _run(action: str, stdin: str = "", **env: str) -> subprocess.CompletedProcess[str]:
    full = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "NETPLUGIN_INFRA_ID": "x", **env}
    return subprocess.run([str(BANDWIDTH), action, "default", "web-0", "x"] if action != "init"
                          else [str(BANDWIDTH), "init"], input=stdin, env=full, capture_output=True, text=True,
                          timeout=30)


def test_init_declares_setup_and_teardown_only() -> None:
    r = _run("init")
    assert (r.returncode, r.stdout.strip()) == (0, '{"actions":["setup","teardown","repair"]}')


@pytest.mark.parametrize(
    ("stdin", "env", "words"),
    [
        ('{"metadata":{"annotations":{"' + IN + '":"10X"}}}', {}, f"invalid {IN} '10X'"),
        ('{"metadata":{"annotations":{"' + OUT + '":"999"}}}', {}, "unreasonably small"),
        ('{"metadata":{"annotations":{"' + IN + '":"2P"}}}', {}, "unreasonably large"),
        ("", {"NETPLUGIN_BANDWIDTH_EGRESS_RATE": "-5"}, "invalid NETPLUGIN_BANDWIDTH_EGRESS_RATE '-5'"),
        ("", {"NETPLUGIN_BANDWIDTH_INGRESS_RATE": "5"}, "must be 1000 to"),
        ('{"metadata":{"annotations":{"' + IN + '":"10M"}}}', {}, "no host-side interface"),
        ('{"metadata":{"annotations":{"' + IN + '":"10M"}}}', {"NETPLUGIN_PREV_HOST_INTERFACE": "npnosuch0"},
         "npnosuch0 does not exist"),
    ],
)
def test_bad_values_get_a_clear_error_naming_the_source(stdin: str, env: dict[str, str], words: str) -> None:
    r = _run("setup", stdin, **env)
    assert r.returncode == 1 and words in r.stderr, r.stderr


def test_without_annotations_setup_and_teardown_do_nothing() -> None:
    doc = '{"metadata":{"annotations":{"other":"1","x":"{\\"' + IN + '\\":\\"1k\\"}"}}}'
    for action in ("setup", "teardown"):
        r = _run(action, doc)
        assert (r.returncode, r.stdout, r.stderr) == (0, "", "")


def test_the_plugin_is_shellcheck_clean() -> None:
    if shutil.which("shellcheck") is None:
        pytest.fail("shellcheck is a test dependency (scripts/install-deps.sh)")
    r = subprocess.run(["shellcheck", "-S", "style", str(BANDWIDTH)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout
