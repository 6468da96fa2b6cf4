"""``netplugin serve`` keeps the egress masquerade: installed at start, removed at stop.

The daemon runs inside a network namespace of the test's own (nftables rules belong to a
namespace), with the built-in no-op plugin and ``cluster_cidrs`` from its config file.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.waits import wait_answering

pytestmark = pytest.mark.kernel

REPO = Path(__file__).resolve().parents[2]


def _nft_tables(ns: str) -> list[str]:
    r = subprocess.run(["ip", "netns", "exec", ns, "nft", "list", "tables"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


@pytest.fixture
def netns() -> Iterator[str]:
    name = f"np-{secrets.token_hex(3)}-daemon"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name])


def _serve(ns: str, tmp_path: Path, cluster: str, path: str | None = None) -> tuple[subprocess.Popen[bytes], Path]:
    cfg = tmp_path / "netplugin.yaml"
    plugins = tmp_path / "exec"
    plugins.mkdir(mode=0o755, exist_ok=True)
    cfg.write_text(
        f"state_dir: {tmp_path}/state\nrun_dir: {tmp_path}/run\nplugin_dir: {plugins}\nhost: none\n"
        f"metrics_address: none\ncluster_cidrs: {cluster}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_")}
    env.update(NETPLUGIN_CONFIG=str(cfg), PYTHONPATH=str(REPO))
    if path is not None:
        env["PATH"] = path
    log = tmp_path / "daemon.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [shutil.which("ip") or "ip", "netns", "exec", ns, sys.executable, "-m", "netplugin", "serve"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    wait_answering(str(tmp_path / "run" / "netplugin.sock"), proc, log)
    return proc, log


def _stop(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=30)


def test_daemon_installs_egress_at_start_and_removes_it_at_stop(netns: str, tmp_path: Path) -> None:
    subprocess.run(["ip", "netns", "exec", netns, "nft", "add", "table", "ip", "np_foreign"], check=True)
    proc, log = _serve(netns, tmp_path, '[10.206.0.0/20, "fd00:10:206::/56"]')
    try:
        assert "table inet netplugin" in _nft_tables(netns)
        rules = subprocess.run(
            ["ip", "netns", "exec", netns, "nft", "list", "table", "inet", "netplugin"], capture_output=True, text=True
        ).stdout
        assert "10.206.0.0/20" in rules and "fd00:10:206::/56" in rules and rules.count("masquerade") == 2
    finally:
        assert _stop(proc) == 0, log.read_text()
    # the FORWARD accepts (iptables-nft's filter tables) stay: pods forward through a restart
    filters = ("table ip filter", "table ip6 filter")
    assert [t for t in _nft_tables(netns) if t not in filters] == ["table ip np_foreign"]
    for cmd, cidr in (("iptables", "10.206.0.0/20"), ("ip6tables", "fd00:10:206::/56")):
        kept = subprocess.run(["ip", "netns", "exec", netns, cmd, "-S"], capture_output=True, text=True).stdout
        assert "-A FORWARD -m comment --comment \"netplugin pod forwarding\" -j NETPLUGIN-FORWARD" in kept, kept
        assert f"-A NETPLUGIN-FORWARD -s {cidr}" in kept
    assert "egress: masquerading pod traffic leaving 10.206.0.0/20, fd00:10:206::/56" in log.read_text()


def test_daemon_without_nft_logs_and_serves(netns: str, tmp_path: Path) -> None:
    bare = tmp_path / "bin"
    bare.mkdir()
    proc, log = _serve(netns, tmp_path, "10.206.0.0/20", path=str(bare))
    try:
        assert proc.poll() is None
    finally:
        assert _stop(proc) == 0, log.read_text()
    text = log.read_text()
    assert "egress masquerade not installed: cannot install nftables table inet netplugin: nft not found" in text
    assert _nft_tables(netns) == []
