"""``netplugin doctor`` on broken nodes: each breakage is named, with its fix, and the exit code says so.

A node here is a few temp dirs (config file, CNI conf and bin dirs, state and run dirs) laid out as
scripts/install.sh lays them out; each case breaks one thing and runs the real CLI. The daemon-side
checks (a node whose calls reach its daemon, settings that differ from it) run against real daemons
in tests/deploy/test_node_installed.py and tests/cluster/test_cluster_installed.py.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.waits import WITHIN, wait_answering, wait_for

REPO = Path(__file__).resolve().parents[2]


class DoctorNode:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.conf_dir, self.bin_dir = root / "net.d", root / "cni-bin"
        self.state, self.run = root / "state", root / "run"
        self.config = root / "netplugin.yaml"
        for d in (self.conf_dir, self.bin_dir):
            d.mkdir()
        (root / "exec").mkdir(mode=0o755)
        self.config.write_text(
            f"plugin: kubernetes.io/no-op\nplugin_dir: {root / 'exec'}\nstate_dir: {self.state}\nrun_dir: {self.run}\n"
        )
        self.conflist(
            "10-netplugin.conflist", {"type": "netplugin-cni", "configFile": str(self.config), "runDir": str(self.run)}
        )
        made = subprocess.run(
            [sys.executable, "-m", "netplugin", "install-shim", str(self.bin_dir)], capture_output=True, text=True
        )
        assert made.returncode == 0, made.stderr
        init = subprocess.run(
            [sys.executable, "-m", "netplugin", "--config", str(self.config), "init"], capture_output=True, text=True
        )
        assert init.returncode == 0, init.stderr  # a node that ran its plugin's init

    def conflist(self, name: str, entry: dict[str, Any], network: str = "netplugin") -> None:
        doc = {"cniVersion": "1.0.0", "name": network, "plugins": [entry]}
        (self.conf_dir / name).write_text(json.dumps(doc))

    def doctor(self) -> tuple[int, dict[str, dict[str, Any]]]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_")}
        env["PYTHONPATH"] = str(REPO)
        argv = [sys.executable, "-m", "netplugin", "--config", str(self.config), "-o", "json", "doctor"]
        argv += ["--cni-conf-dir", str(self.conf_dir), "--cni-bin-dir", str(self.bin_dir)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
        assert "Traceback" not in done.stderr, done.stderr
        return done.returncode, {c["name"]: c for c in json.loads(done.stdout)["checks"]}


@pytest.fixture
def node(tmp_path: Path) -> DoctorNode:
    return DoctorNode(tmp_path)


def _foreign_first(n: DoctorNode) -> None:
    n.conflist("00-other.conflist", {"type": "bridge"}, network="other")


def _no_conflist(n: DoctorNode) -> None:
    (n.conf_dir / "10-netplugin.conflist").unlink()


def _inline_settings(n: DoctorNode) -> None:
    entry = {"type": "netplugin-cni", "configFile": str(n.config), "runDir": str(n.run), "env": {"X": "1"}}
    n.conflist("10-netplugin.conflist", entry)


def _not_our_shim(n: DoctorNode) -> None:
    (n.bin_dir / "netplugin-cni").write_text("#!/bin/sh\necho '{}'\n")


def _old_shim(n: DoctorNode) -> None:
    shim = n.bin_dir / "netplugin-cni"
    shim.write_text(shim.read_text().replace("(netplugin ", "(netplugin 0.0.0-old"))


def _no_shim(n: DoctorNode) -> None:
    (n.bin_dir / "netplugin-cni").unlink()


def _compiled_shim_elsewhere(n: DoctorNode) -> None:
    from netplugin.frontends.cni.native import build_native

    build_native(str(n.bin_dir / "netplugin-cni"), socket="/run/np-elsewhere/netplugin.sock", fallback="")


def _unsafe_state_dir(n: DoctorNode) -> None:
    n.state.mkdir(mode=0o777)
    os.chmod(n.state, 0o777)


def _bad_plugin(n: DoctorNode) -> None:
    n.config.write_text(n.config.read_text().replace("kubernetes.io/no-op", "no-such-plugin"))


CASES: list[tuple[str, Callable[[DoctorNode], None], str, str]] = [
    ("foreign-conflist-first", _foreign_first, "conflist", "00-other.conflist, which is not netplugin's"),
    ("no-conflist", _no_conflist, "conflist", "the runtime has no network"),
    ("inline-settings", _inline_settings, "settings", "override"),
    ("not-our-shim", _not_our_shim, "shim", "is not netplugin's shim"),
    ("old-shim", _old_shim, "shim", "was written by netplugin 0.0.0-old"),
    ("no-shim", _no_shim, "shim", "the runtime cannot run netplugin"),
    ("compiled-shim-other-socket", _compiled_shim_elsewhere, "shim", "calls the daemon at /run/np-elsewhere/"),
    ("unsafe-state-dir", _unsafe_state_dir, "dirs", "writable"),
    ("bad-plugin", _bad_plugin, "plugin", "not found"),
]


@pytest.mark.parametrize(("breakage", "check", "words"), [pytest.param(*c[1:], id=c[0]) for c in CASES])
def test_doctor_names_what_is_broken(
    node: DoctorNode, breakage: Callable[[DoctorNode], None], check: str, words: str
) -> None:
    code, before = node.doctor()
    assert before[check]["ok"], before[check]  # fine until broken
    breakage(node)
    code, checks = node.doctor()
    assert code == 7
    assert not checks[check]["ok"] and words in checks[check]["problem"], checks[check]
    assert checks[check]["fix"]


def test_doctor_without_a_daemon_is_a_problem_and_text_output_has_one_line_per_check(node: DoctorNode) -> None:
    code, checks = node.doctor()
    assert code == 7
    assert list(checks) == ["conflist", "shim", "daemon", "settings", "plugin", "node", "egress", "bridge_netfilter",
                           "policy", "forward", "mtu", "hostport", "repairs", "keepers", "dirs"]  # fmt: skip
    assert "no daemon answers" in checks["daemon"]["problem"] and "systemctl start" in checks["daemon"]["fix"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_")}
    env["PYTHONPATH"] = str(REPO)
    argv = [sys.executable, "-m", "netplugin", "--config", str(node.config), "doctor"]
    argv += ["--cni-conf-dir", str(node.conf_dir), "--cni-bin-dir", str(node.bin_dir)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 7
    heads = [line.split()[:2] for line in done.stdout.splitlines() if not line.startswith(" ")]
    assert [h[1] for h in heads] == list(checks)
    assert ["problem", "daemon"] in heads and ["ok", "conflist"] in heads


@pytest.mark.parametrize("name", ["00-a.conflist", "00-b.conf", "00-c.json"])
def test_doctor_skips_a_directory_named_like_a_conflist_as_runtimes_do(node: DoctorNode, name: str) -> None:
    """Hostile node, round 3: libcni skips directories, so the runtime picks our conflist after it."""
    (node.conf_dir / name).mkdir()
    _, checks = node.doctor()
    assert checks["conflist"]["ok"], checks["conflist"]
    assert "10-netplugin.conflist" in checks["conflist"]["found"] and name not in checks["conflist"]["found"]


_CHECK_AS_USER = """
import json, sys
from netplugin.core.config import Config
from netplugin.frontends.checks import Node, check_daemon
node = Node(Config(), "/nonexistent", ())
node.call_conf = {"type": "netplugin-cni", "runDir": sys.argv[1]}
c = check_daemon(node)
print(json.dumps({"problem": c.problem, "fix": c.fix}))
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_a_socket_refused_for_permission_asks_for_root_not_a_start(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(run_dir, 0o755)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(run_dir / "netplugin.sock"))
        server.listen(1)
        os.chmod(run_dir / "netplugin.sock", 0o600)  # the daemon's socket: root's only
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO)}
        argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        argv += [sys.executable, "-c", _CHECK_AS_USER, str(run_dir)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, cwd="/")
    assert done.returncode == 0, done.stderr
    check = json.loads(done.stdout)
    assert "root" in check["fix"] and "systemctl start" not in check["fix"]
    assert "Permission denied" in check["problem"]


def test_doctor_says_the_daemon_refused_the_config_on_disk(node: DoctorNode) -> None:
    import signal

    node.config.write_text(node.config.read_text() + "metrics_address: none\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_")}
    env["PYTHONPATH"] = str(REPO)
    log = node.root / "daemon.log"
    with open(log, "wb") as out:
        daemon = subprocess.Popen([sys.executable, "-m", "netplugin", "serve", "--config", str(node.config)],
                                  env=env, stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        wait_answering(str(node.run / "netplugin.sock"), daemon, log)
        _, checks = node.doctor()
        assert checks["settings"]["ok"] and checks["repairs"]["ok"], checks
        node.config.write_text(node.config.read_text().replace("kubernetes.io/no-op", "brdge"))
        daemon.send_signal(signal.SIGHUP)
        wait_for(
            lambda: "reload refused" in log.read_text(), "the refused reload's log line", WITHIN, detail=log.read_text
        )
        code, checks = node.doctor()
        assert code == 7
        problem = checks["settings"]["problem"]
        assert "config on disk refused at " in problem and "plugin: network plugin 'brdge' not found" in problem
        assert "netplugin config check" in checks["settings"]["fix"]
    finally:
        daemon.terminate()
        daemon.wait(60)
