"""The stock-Debian path: scripts/install.sh puts the wheel into a venv made by Debian's /usr/bin/python3.

Everything goes under a temp dir (prefix, PATH links, exec dir, CNI dirs, state, run, systemd dir),
so the machine is not touched. The venv is made by the system interpreter (PEP 668: nothing is
pip-installed into it), first without the daemon extra (``serve`` must say which extra to install),
then with it; ``netplugin demo`` then runs from the venv on the real kernel.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
INSTALL = REPO / "scripts" / "install.sh"
SYSTEM_PYTHON = Path("/usr/bin/python3")

pytestmark = [
    pytest.mark.skipif(not SYSTEM_PYTHON.exists(), reason="no system interpreter /usr/bin/python3 (not Debian)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="installs root-owned files; run as root"),
]


class Node:
    """A node's directories under one temp root, and how to run what was installed there."""

    def __init__(self, root: Path, wheel: Path) -> None:
        self.root, self.wheel = root, wheel
        self.prefix = root / "opt" / "netplugin"
        self.bin = root / "usr" / "local" / "bin"
        self.man = root / "usr" / "local" / "share" / "man" / "man1"
        self.systemd = root / "etc" / "systemd" / "system"
        self.exec_dir = root / "exec"
        self.cni_bin = root / "opt" / "cni" / "bin"
        self.cni_conf = root / "etc" / "cni" / "net.d"
        self.state = root / "var" / "lib" / "netplugin"
        self.run_dir = root / "run" / "netplugin"
        self.config = root / "etc" / "netplugin" / "netplugin.yaml"
        self.first: subprocess.CompletedProcess[str] | None = None

    def install(self, *extra: str) -> subprocess.CompletedProcess[str]:
        argv = ["bash", str(INSTALL), "--python", str(SYSTEM_PYTHON), "--wheel", str(self.wheel)]
        for flag, path in (
            ("--prefix", self.prefix),
            ("--bin-dir", self.bin),
            ("--man-dir", self.man),
            ("--systemd-dir", self.systemd),
            ("--exec-dir", self.exec_dir),
            ("--cni-bin-dir", self.cni_bin),
            ("--cni-conf-dir", self.cni_conf),
            ("--state-dir", self.state),
            ("--run-dir", self.run_dir),
            ("--config", self.config),
        ):
            argv += [flag, str(path)]
        return subprocess.run(
            [*argv, *extra], capture_output=True, text=True, timeout=600, env=self.env(), stdin=subprocess.DEVNULL
        )

    def env(self, **extra: str) -> dict[str, str]:
        # Nothing of the development checkout may leak in: no PYTHONPATH, no NETPLUGIN_* settings.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("NETPLUGIN_", "PYTHON", "_NETPLUGIN"))}
        env["PATH"] = f"{self.bin}:{env.get('PATH', '/usr/bin:/bin')}"
        env.update(extra)
        return env

    def netplugin(self, *args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["netplugin", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env(**env),
            stdin=subprocess.DEVNULL,
            cwd=self.root,
        )


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, dists: dict[str, Path]) -> Iterator[Node]:
    root = tmp_path_factory.mktemp("node")
    n = Node(root, dists["wheel"])
    # First without the daemon extra; test_adding_the_extra_then_nothing_to_do adds it.
    n.first = n.install("--extras", "")
    assert n.first.returncode == 0, n.first.stdout + n.first.stderr
    yield n
    shutil.rmtree(root, ignore_errors=True)


def test_install_without_the_daemon_extra(node: Node) -> None:
    assert node.first is not None
    assert f"create venv {node.prefix} ({SYSTEM_PYTHON})" in node.first.stdout
    # The venv is Debian's interpreter, and nothing went into the system's site-packages.
    base = subprocess.run(
        [str(node.prefix / "bin" / "python"), "-c", "import sys; print(sys.base_prefix, sys.prefix)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert base == ["/usr", str(node.prefix)]
    for cmd in ("netplugin", "netplugin-cni"):
        assert os.readlink(node.bin / cmd) == str(node.prefix / "bin" / cmd)
    assert shutil.which("netplugin", path=node.env()["PATH"]) == str(node.bin / "netplugin")


def test_serve_without_the_extra_names_it_and_exits_5(node: Node) -> None:
    for args in (["serve"], ["serve", "-o", "json"]):
        out = node.netplugin("--run-dir", str(node.root / "serve-run"), *args)
        assert out.returncode == 5, out.stderr
        assert "Traceback" not in out.stderr
        message = json.loads(out.stderr)["message"] if "json" in args else out.stderr
        assert "prometheus_client" in message and "netplugin[daemon]" in message
    assert not (node.root / "serve-run").exists()


def test_man_page_is_installed_from_the_wheel(node: Node) -> None:
    page = node.man / "netplugin.1"
    assert page.is_symlink() and page.resolve() == (node.prefix / "share" / "man" / "man1" / "netplugin.1").resolve()
    shown = subprocess.run(["man", "-l", str(page)], capture_output=True, text=True, timeout=60, env=node.env())
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stdout.split())
    assert "netplugin version" in text and "--log-level" in text and "EXIT STATUS" in text


def test_installed_plugins_come_from_the_wheel_and_pass_discovery(node: Node) -> None:
    out = node.netplugin("--plugin-dir", str(node.exec_dir), "plugins", "-o", "json")
    assert out.returncode == 0, out.stderr
    listed = {c["name"]: c for c in json.loads(out.stdout)}
    shipped = {p.name.replace("~", "/") for p in (REPO / "exec_plugins").iterdir() if p.is_dir()}
    assert shipped | {"kubernetes.io/no-op", "netplugin.io/bridge", "netplugin.io/hostport"} == set(listed)
    assert all(c["valid"] for c in listed.values()), listed
    for name in shipped:
        assert listed[name]["path"].startswith(f"{node.exec_dir}/")
    # A missing exec dir still lists the built-ins, with a warning naming the dir.
    gone = node.netplugin("--plugin-dir", str(node.root / "nope"), "plugins")
    assert gone.returncode == 0, gone.stderr
    assert f"{node.root / 'nope'} does not exist" in gone.stderr
    builtins = ["kubernetes.io/no-op", "netplugin.io/bridge", "netplugin.io/hostport"]
    assert [line.split()[0] for line in gone.stdout.splitlines()[1:]] == builtins


def test_conflist_names_the_config_and_the_config_the_dirs(node: Node) -> None:
    conf = json.loads((node.cni_conf / "10-netplugin.conflist").read_text())
    [plugin] = [p for p in conf["plugins"] if p["type"] == "netplugin-cni"]
    assert plugin == {
        "type": "netplugin-cni",
        "configFile": str(node.config),
        "runDir": str(node.run_dir),
        "capabilities": {"portMappings": True},  # the runtime passes a pod's hostPorts
    }
    out = node.netplugin("--config", str(node.config), "plugins", "-o", "json")
    assert out.returncode == 0, out.stderr
    assert any(c["path"].startswith(f"{node.exec_dir}/") for c in json.loads(out.stdout))


def test_shim_runs_isolated_from_the_venv(node: Node, tmp_path: Path) -> None:
    # The runtime's shim is the compiled one (gcc is a CI dependency); the Python shim beside it is
    # what it execs when the daemon does not run a call.
    assert (node.cni_bin / "netplugin-cni").read_bytes().startswith(b"\x7fELF")
    shim = node.cni_bin / "netplugin-cni-python"
    text = shim.read_text()
    # Isolated (-I) and without site (-S), with the venv's site-packages spelled out: either the
    # entry script `netplugin install-shim` writes, or install.sh's own.
    assert re.search(r"-I -S |-IS\n", text), text
    assert str(node.prefix) in text
    # The runtime's working directory and environment must not matter: a poisoned netplugin in cwd.
    (tmp_path / "netplugin").mkdir()
    (tmp_path / "netplugin" / "__init__.py").write_text("raise SystemExit('imported from cwd')\n")
    out = subprocess.run(
        [str(shim)],
        input=json.dumps({"cniVersion": "1.0.0", "name": "x", "type": "netplugin-cni"}),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "CNI_COMMAND": "VERSION", "PYTHONPATH": str(tmp_path)},
    )
    assert out.returncode == 0, out.stderr
    assert "1.0.0" in json.loads(out.stdout)["supportedVersions"]


def test_unit_runs_the_venvs_netplugin_and_verifies(node: Node) -> None:
    unit = (node.systemd / "netplugin.service").read_text()
    assert f"ExecStart={node.prefix}/bin/netplugin serve --config {node.config}" in unit.splitlines()
    assert not [line for line in unit.splitlines() if line.startswith(("Environment=", "EnvironmentFile="))]
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    out = subprocess.run(
        [analyze, "verify", str(node.systemd / "netplugin.service")], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert not [line for line in out.stderr.splitlines() if "netplugin.service" in line], out.stderr


def test_adding_the_extra_then_nothing_to_do(node: Node) -> None:
    out = node.install()
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"[daemon] into {node.prefix}" in out.stdout
    again = node.install()
    assert again.returncode == 0, again.stdout + again.stderr
    assert "install.sh: nothing to do" in again.stdout, again.stdout
    serve = node.netplugin("serve", "--help")
    assert serve.returncode == 0, serve.stderr
    # What scripts/install-deps.sh runs (the demo's install): the venv and the links only.
    venv_only = node.install("--venv-only")
    assert venv_only.returncode == 0, venv_only.stderr
    assert "install.sh: nothing to do" in venv_only.stdout
    assert "exec" not in venv_only.stdout and "netplugin-cni (0755)" not in venv_only.stdout


@pytest.mark.kernel
def test_demo_runs_from_the_venv(node: Node) -> None:
    out = node.netplugin("-o", "json", "demo", "--pods", "2", timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert report["ok"] is True
    assert report["leftovers"] == []
    assert all(c["ok"] for c in report["checks"])
