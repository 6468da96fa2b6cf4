"""A plugin chain under containerd: the conflist names netplugin's chain ``[bridge, bandwidth]`` and
declares the CNI ``bandwidth`` capability; containerd's CRI plugin turns a sandbox's bandwidth
annotations into ``runtimeConfig.bandwidth``, the shim hands it to the chain, and the pod gets its
limit (a real transfer, within 25 %), with and without the daemon. The pod without annotations is
not shaped, and nothing is left after the sandboxes are removed (ifb included).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.nettest import tcp_rate

from .containerd import Containerd
from .test_containerd import CniNet, assert_nothing_left, containerd  # noqa: F401 - the session fixture

REPO = Path(__file__).resolve().parents[3]
BANDWIDTH = REPO / "exec_plugins" / "bandwidth" / "bandwidth"
IN, OUT = "kubernetes.io/ingress-bandwidth", "kubernetes.io/egress-bandwidth"

pytestmark = pytest.mark.containerd


@pytest.fixture
def chain_net(containerd: Containerd, tmp_path: Path) -> Iterator[CniNet]:  # noqa: F811
    n = CniNet(containerd, tmp_path)
    d = n.exec_dir / "bandwidth"
    d.mkdir(mode=0o755)
    os.chmod(d, 0o755)
    shutil.copyfile(BANDWIDTH, d / "bandwidth")
    os.chmod(d / "bandwidth", 0o755)
    try:
        yield n
    finally:
        n.close()


def chain_conflist(net: CniNet) -> dict[str, Any]:
    conflist = net.conflist()
    conf = conflist["plugins"][0]
    del conf["plugin"]  # the chain instead of one plugin
    conf["netplugin"] = {**conf["netplugin"], "plugins": ["bridge", "bandwidth"]}
    conf["capabilities"] = {"bandwidth": True}
    return conflist


def _ifb(infra_id: str) -> str:
    out = subprocess.run(["bash", "-c", f'source <(sed -n "/^ifb_name()/,/^}}/p" {BANDWIDTH}); '
                          'ifb_name "$1"; echo "$IFB"', "_", infra_id], capture_output=True, text=True, check=True)
    return out.stdout.strip()


@pytest.mark.parametrize("daemon", [False, True], ids=["shim-alone", "through-the-daemon"])
def test_a_pod_with_bandwidth_annotations_gets_its_limit_through_the_shim(chain_net: CniNet, daemon: bool) -> None:
    net = chain_net
    conflist = chain_conflist(net)
    if daemon:
        config = net.daemon_config()
        text = config.read_text().replace("plugin: bridge\n", "plugins: [bridge, bandwidth]\n")
        config.write_text(text)
        net.start_daemon(config)
        conflist["plugins"][0]["configFile"] = str(config)
    net.ctd.use_network(conflist)
    shaped = net.ctd.run_pod("np-bw", "shaped", str(uuid.uuid4()), annotations={IN: "20M", OUT: "10M"})
    net.sandboxes.append(shaped.id)
    plain = net.ctd.run_pod("np-bw", "plain", str(uuid.uuid4()))
    net.sandboxes.append(plain.id)

    adds = {e["containerID"]: e for e in net.log_entries() if e["command"] == "ADD"}
    assert adds[shaped.id]["runtimeConfig"] == ["bandwidth"], adds[shaped.id]
    into = tcp_rate(plain.netns_name, shaped.netns_name, shaped.ip, 5_000_000)
    out_of = tcp_rate(shaped.netns_name, plain.netns_name, plain.ip, 4_000_000)
    free = tcp_rate(None, plain.netns_name, plain.ip, 50_000_000)
    print(f"containerd: into {into / 1e6:.2f} (20), out of {out_of / 1e6:.2f} (10), unshaped {free / 1e6:.0f} Mbit/s")
    assert 0.75 * 20e6 <= into <= 1.25 * 20e6, f"into the shaped pod: {into / 1e6:.1f} Mbit/s"
    assert 0.75 * 10e6 <= out_of <= 1.25 * 10e6, f"out of the shaped pod: {out_of / 1e6:.1f} Mbit/s"
    assert free > 5 * 20e6, f"into the unshaped pod: {free / 1e6:.1f} Mbit/s"

    records = {r["infra_id"]: r for r in net.records()}
    for sb in (shaped, plain):
        assert [(m["plugin"], m["state"]) for m in records[sb.id]["chain"]] == [("bridge", "ready"),
                                                                                 ("bandwidth", "ready")]
    assert os.path.exists(f"/sys/class/net/{_ifb(shaped.id)}")
    assert not os.path.exists(f"/sys/class/net/{_ifb(plain.id)}")
    for sb in (shaped, plain):
        net.ctd.stop_remove(sb.id)
    assert not os.path.exists(f"/sys/class/net/{_ifb(shaped.id)}")
    assert_nothing_left(net, [shaped, plain])
