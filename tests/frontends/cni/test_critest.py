"""critest, the CRI validation suite (cri-tools v1.37), judges containerd 2 with netplugin as the only CNI network.

One run of critest per module, on its PodSandbox and Networking specs, against a private containerd 2
(both built by scripts/build-peers.sh). Both run inside a node netns of the test's own, so the
hostPort rules never touch the machine's netfilter: critest checks a hostPort on
``http://127.0.0.1:<hostPort>`` from its own netns. The node's one conflist is netplugin-cni
(``portMappings`` declared) and netplugin's daemon runs in the node with the chain
``[netplugin.io/bridge, hostport]`` (the built-in bridge, then the shipped bash hostport) and
``NETPLUGIN_HOSTPORT_LOCALHOST=true`` (docs/hostport.md). critest's images cannot be pulled here:
the two it needs are built from busybox-static (a container image whose command is ``top``; a web
server on port 80, busybox's ``httpd``, for nginx) and imported, and its ``--test-images-file``
names them. Each spec is then one test here, so that a spec critest stops
running fails too. Last, the host-port spec runs again with the setting off: it fails, as it must.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from netplugin.core.hostports import ENV_LOCALHOST
from tests.support.gopeers import require
from tests.support.nettest import ip_in

from .containerd import NETNS_DIR, Containerd, image_archive, unavailable_reason
from .test_containerd import CONTAINERD2_PEERS, CniNet

pytestmark = [pytest.mark.containerd, pytest.mark.kernel]
REPO = Path(__file__).resolve().parents[3]

BUSYBOX_IMAGE = "localhost/netplugin-critest-busybox:1"
WEB_IMAGE = "localhost/netplugin-critest-web:1"
#: what critest runs in its default container (top), execs (cat, hostname) and in its web server
APPLETS = ("sh", "top", "cat", "hostname", "sleep", "ls", "echo", "httpd")
#: the specs' own text, which names each in critest's report
SPECS = [
    "runtime should support running PodSandbox",
    "runtime should support stopping PodSandbox",
    "runtime should support removing PodSandbox",
    "runtime should support preserving PodSandbox attributes",
    "runtime should support returning metrics descriptors",
    "runtime should support listing pod sandbox metrics",
    "should support safe sysctls",
    "should support unsafe sysctls",
    "runtime should support DNS config",
    "runtime should support set hostname",
    "runtime should support port mapping with only container port",
    "runtime should support port mapping with host port and container port",
]


HOST_PORT_SPEC = SPECS[-1]


@dataclass
class CritestNode:
    """A node netns with containerd 2, netplugin's daemon and critest's images in it."""

    name: str
    root: Path
    ctd: Containerd
    net: CniNet
    config: Path
    critest: Path

    def run(self, focus: str) -> dict[str, str]:
        return run_critest(self.critest, self.ctd, self.root, focus, self.name)

    def set_localhost(self, value: str) -> None:
        """The setting changed in the node's config file; the daemon restarted (its init rebuilds the table)."""
        text = self.config.read_text()
        self.config.write_text(text.replace(f"{ENV_LOCALHOST}: \"true\"", f"{ENV_LOCALHOST}: \"{value}\""))
        assert self.net.daemon is not None
        self.net.daemon.terminate()
        assert self.net.daemon.wait(60) == 0
        os.unlink(self.ctd.root / "netplugin.sock")
        self.net.start_daemon(self.config, self.name)


def _daemon_config(net: CniNet) -> Path:
    """The config as a node would have it: the shipped bridge and hostport, the localhost setting on."""
    for plugin in ("hostport",):
        d = net.exec_dir / plugin
        d.mkdir(mode=0o755, exist_ok=True)
        shutil.copyfile(REPO / "exec_plugins" / plugin / plugin, d / plugin)
        os.chmod(d / plugin, 0o755)
    config = net.daemon_config()
    text = config.read_text().replace("plugin: bridge\n", "plugins: [netplugin.io/bridge, hostport]\n")
    for key in ("IP_FORWARD", "BR_NETFILTER"):  # the node netns is the test's
        text = text.replace(f'NETPLUGIN_BRIDGE_{key}: "false"', f'NETPLUGIN_BRIDGE_{key}: "true"')
    config.write_text(text + f"  {ENV_LOCALHOST}: \"true\"\n")
    return config


@pytest.fixture(scope="module")
def critest_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CritestNode]:
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    peers = require(*CONTAINERD2_PEERS, "critest")
    root = tmp_path_factory.mktemp("critest")
    # the shim as install.sh installs it: the compiled one, the Python one its fallback
    made = subprocess.run([sys.executable, "-m", "netplugin", "install-shim", str(root / "netplugin-cni-python")],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert made.returncode == 0, made.stderr
    native = subprocess.run([sys.executable, "-m", "netplugin", "install-shim", "--kind", "cni-native",
                             str(root / "cni"), "--socket", str(root / "containerd" / "netplugin.sock"),
                             "--fallback", made.stdout.strip()], capture_output=True, text=True, timeout=120,
                            check=False)  # fmt: skip
    assert native.returncode == 0, native.stderr
    name = f"np{uuid.uuid4().hex[:6]}c"
    assert subprocess.run(["ip", "netns", "add", name], check=False).returncode == 0
    ctd = Containerd(root / "containerd", Path(native.stdout.strip()), peers=peers, netns=name)
    net = CniNet(ctd, root / "net")
    try:
        ip_in(name, "link", "set", "lo", "up")
        config = _daemon_config(net)
        ctd.start()
        net.start_daemon(config, name)
        conflist = net.conflist()
        conflist["plugins"] = [{"type": "netplugin-cni", "configFile": str(config), "logFile": str(net.log),
                                "capabilities": {"portMappings": True}}]  # fmt: skip
        ctd.use_network(conflist)
        image_archive(BUSYBOX_IMAGE, root / "busybox.tar", ["/bin/sh"], APPLETS)
        ctd.import_image(root / "busybox.tar")
        index = {"www/index.html": b"<html>netplugin critest</html>\n"}
        image_archive(WEB_IMAGE, root / "web.tar", ["/bin/httpd", "-f", "-p", "80", "-h", "/www"], APPLETS, index)
        ctd.import_image(root / "web.tar")
        yield CritestNode(name, root, ctd, net, config, peers / "critest")
    finally:
        net.close()
        ctd.close()
        subprocess.run(["ip", "netns", "del", name], check=False)


@pytest.fixture(scope="module")
def critest_report(critest_node: CritestNode) -> dict[str, str]:
    """critest's verdict per spec (``passed``, ``failed: <message>``, ``skipped``), from its JUnit report."""
    return critest_node.run("PodSandbox|Networking")


def run_critest(critest: Path, ctd: Containerd, root: Path, focus: str, netns: str) -> dict[str, str]:
    images = root / "images.yaml"
    images.write_text(f"defaultTestContainerImage: {BUSYBOX_IMAGE}\nwebServerTestImage: {WEB_IMAGE}\n")
    report = root / "junit.xml"
    argv = [
        str(critest),
        f"--runtime-endpoint=unix://{ctd.socket}",
        f"--image-endpoint=unix://{ctd.socket}",
        f"--test-images-file={images}",
        f"--ginkgo.junit-report={report}",
        f"--ginkgo.focus={focus}",
        "--ginkgo.no-color",
    ]
    report.unlink(missing_ok=True)
    inside = ["nsenter", f"--net={NETNS_DIR}/{netns}"]  # where its 127.0.0.1 is the node's
    done = subprocess.run([*inside, *argv], capture_output=True, text=True, timeout=900, check=False, cwd=root)
    (root / "critest.log").write_text(done.stdout + done.stderr)
    summary = [line for line in done.stdout.splitlines() if line.startswith(("Ran ", "FAIL!", "SUCCESS!"))]
    print("critest:", " | ".join(summary))
    verdicts: dict[str, str] = {}
    for xml in [report] if report.exists() else []:
        for case in ET.parse(xml).getroot().iter("testcase"):
            failure = case.find("failure")
            if failure is None:
                failure = case.find("error")
            if failure is not None:
                verdicts[case.get("name", "")] = f"failed: {failure.get('message', '')}"
            elif case.find("skipped") is not None:
                verdicts[case.get("name", "")] = "skipped"
            else:
                verdicts[case.get("name", "")] = "passed"
    assert verdicts, f"critest wrote no report; its output:\n{done.stdout[-4000:]}{done.stderr[-2000:]}"
    return verdicts


@pytest.mark.parametrize("spec", SPECS)
def test_critest_spec_passes_with_netplugin_as_the_network(critest_report: dict[str, str], spec: str) -> None:
    found = {name: verdict for name, verdict in critest_report.items() if spec in name}
    assert len(found) == 1, f"critest ran no single spec {spec!r}: {sorted(critest_report)}"
    assert list(found.values()) == ["passed"], found


def test_every_other_spec_critest_ran_passed(critest_report: dict[str, str]) -> None:
    # The focus also selects specs beyond the table (more PodSandbox cases): none of them may fail.
    others = {n: v for n, v in critest_report.items() if v != "skipped" and not any(s in n for s in SPECS)}
    assert others and set(others.values()) == {"passed"}, others


def test_the_host_port_spec_fails_with_the_localhost_setting_off(critest_node: CritestNode) -> None:
    # critest asks 127.0.0.1:<hostPort>: without the setting the node does not map its loopback address
    critest_node.set_localhost("false")
    verdicts = critest_node.run("port mapping with host port")
    found = {name: verdict for name, verdict in verdicts.items() if HOST_PORT_SPEC in name}
    assert len(found) == 1 and next(iter(found.values())).startswith("failed"), verdicts
    table = subprocess.run(["ip", "netns", "exec", critest_node.name, "nft", "list", "chain", "inet",
                            "netplugin_hostport", "output"], capture_output=True, text=True).stdout  # fmt: skip
    assert "ip daddr 127.0.0.0/8 return" in table, table
