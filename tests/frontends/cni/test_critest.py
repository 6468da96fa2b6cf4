"""critest, the CRI validation suite (cri-tools v1.37), judges containerd 2 with netplugin as the only CNI network.

One run of critest per module, on its PodSandbox and Networking specs, against a private containerd 2
(both built by scripts/build-peers.sh) whose one conflist is netplugin-cni with the bridge exec
plugin. critest's images cannot be pulled here: the two it needs are built from busybox-static
(a container image whose command is ``top``; a web server on port 80, busybox's ``httpd``, for
nginx) and imported, and its ``--test-images-file`` names them. Each spec is then one test here, so
that a spec critest stops running fails too.
"""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest
from gopeers import require

from .containerd import Containerd, image_archive, unavailable_reason
from .test_containerd import CONTAINERD2_PEERS, CniNet

pytestmark = pytest.mark.containerd

BUSYBOX_IMAGE = "localhost/netplugin-critest-busybox:1"
WEB_IMAGE = "localhost/netplugin-critest-web:1"
#: what critest runs in its default container (top), execs (cat, hostname) and in its web server
APPLETS = ("sh", "top", "cat", "hostname", "sleep", "ls", "echo", "httpd")
HOST_PORT = (
    "this critest's containerd runs in the machine's own network namespace, where a test must not add nft "
    "rules, so its conflist chains no hostport member; hostPort through containerd 1.6 and 2 in a node netns "
    "is proven by test_containerd_hostport"
)
#: (the spec's own text, which names it in critest's report; why it is expected to fail, or None)
SPECS = [
    ("runtime should support running PodSandbox", None),
    ("runtime should support stopping PodSandbox", None),
    ("runtime should support removing PodSandbox", None),
    ("runtime should support preserving PodSandbox attributes", None),
    ("runtime should support returning metrics descriptors", None),
    ("runtime should support listing pod sandbox metrics", None),
    ("should support safe sysctls", None),
    ("should support unsafe sysctls", None),
    ("runtime should support DNS config", None),
    ("runtime should support set hostname", None),
    ("runtime should support port mapping with only container port", None),
    ("runtime should support port mapping with host port and container port", HOST_PORT),
]


@pytest.fixture(scope="module")
def critest_report(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """critest's verdict per spec (``passed``, ``failed: <message>``, ``skipped``), from its JUnit report."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    peers = require(*CONTAINERD2_PEERS, "critest")
    root = tmp_path_factory.mktemp("critest")
    made = subprocess.run(
        [sys.executable, "-m", "netplugin", "install-shim", str(root / "netplugin-cni")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    ctd = Containerd(root / "containerd", Path(made.stdout.strip()), peers=peers)
    net = CniNet(ctd, root / "net")
    try:
        ctd.start()
        image_archive(BUSYBOX_IMAGE, root / "busybox.tar", ["/bin/sh"], APPLETS)
        ctd.import_image(root / "busybox.tar")
        index = {"www/index.html": b"<html>netplugin critest</html>\n"}
        image_archive(WEB_IMAGE, root / "web.tar", ["/bin/httpd", "-f", "-p", "80", "-h", "/www"], APPLETS, index)
        ctd.import_image(root / "web.tar")
        net.use()
        yield run_critest(peers / "critest", ctd, root)
    finally:
        net.close()
        ctd.close()


def run_critest(critest: Path, ctd: Containerd, root: Path) -> dict[str, str]:
    images = root / "images.yaml"
    images.write_text(f"defaultTestContainerImage: {BUSYBOX_IMAGE}\nwebServerTestImage: {WEB_IMAGE}\n")
    report = root / "junit.xml"
    argv = [
        str(critest),
        f"--runtime-endpoint=unix://{ctd.socket}",
        f"--image-endpoint=unix://{ctd.socket}",
        f"--test-images-file={images}",
        f"--ginkgo.junit-report={report}",
        "--ginkgo.focus=PodSandbox|Networking",
        "--ginkgo.no-color",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False, cwd=root)
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


def _params() -> list[object]:
    return [
        pytest.param(spec, marks=pytest.mark.xfail(strict=True, reason=why)) if why else spec for spec, why in SPECS
    ]


@pytest.mark.parametrize("spec", _params())
def test_critest_spec_passes_with_netplugin_as_the_network(critest_report: dict[str, str], spec: str) -> None:
    found = {name: verdict for name, verdict in critest_report.items() if spec in name}
    assert len(found) == 1, f"critest ran no single spec {spec!r}: {sorted(critest_report)}"
    assert list(found.values()) == ["passed"], found


def test_every_other_spec_critest_ran_passed(critest_report: dict[str, str]) -> None:
    # The focus also selects specs beyond the table (more PodSandbox cases): none of them may fail.
    others = {n: v for n, v in critest_report.items() if v != "skipped" and not any(s in n for s, _ in SPECS)}
    assert others and set(others.values()) == {"passed"}, others
