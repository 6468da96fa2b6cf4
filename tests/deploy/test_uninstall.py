"""``scripts/install.sh --uninstall``: everything the install wrote goes, and nothing else.

A node in a network namespace of the test's own: installed (``--no-venv``) into temp dirs, its
daemon started as the unit starts it (``netplugin serve --config FILE``) with a static cluster, so
that it makes what netplugin owns in the kernel (the egress table, a ``proto 78`` route to the
peer), and pods set up through it. The uninstall (``--purge``) must leave the file tree and the
namespace's nftables tables, routes and links as they were before the install; a second run
removes nothing. Without ``--purge`` the pods' records and the state dir stay.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.nettest import kernel_gate, underlay_netns
from tests.support.waits import wait_answering

REPO = Path(__file__).resolve().parents[2]
INSTALL = REPO / "scripts" / "install.sh"

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.skipif(os.geteuid() != 0, reason="installs root-owned files, runs nft in a netns; run as root"),
]


@pytest.fixture
def netns(request: pytest.FixtureRequest) -> Iterator[str]:
    kernel_gate(request)
    with underlay_netns("x", ["10.206.0.61/24"]) as name:
        yield name


def _in(ns: str, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        ["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, timeout=timeout, env=env, check=False
    )


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _kernel(ns: str) -> dict[str, object]:
    routes = []
    for family in ("-4", "-6"):
        table = json.loads(_in(ns, "ip", "-j", family, "route", "show", "table", "all").stdout or "[]")
        # the kernel's own (link-local, local, multicast) come and go with DAD: not anyone's doing
        routes += [json.dumps(r, sort_keys=True) for r in table if r.get("protocol") != "kernel"]
    return {
        "nft": _in(ns, "nft", "list", "ruleset").stdout,
        "routes": sorted(routes),
        "links": sorted(link["ifname"] for link in json.loads(_in(ns, "ip", "-j", "link").stdout)),
    }


def _node(root: Path) -> tuple[list[str], Path]:
    """The install's options (every dir under ``root``) and the config file to install."""
    d = {k: root / k for k in ("exec", "cni-bin", "cni-conf", "state", "run", "etc")}
    config = d["etc"] / "netplugin.yaml"
    flags = ["--no-venv", "--python", sys.executable, "--exec-dir", str(d["exec"]), "--cni-bin-dir", str(d["cni-bin"])]
    flags += ["--cni-conf-dir", str(d["cni-conf"]), "--state-dir", str(d["state"]), "--run-dir", str(d["run"])]
    return [*flags, "--config", str(config)], config


def test_uninstall_purge_leaves_the_node_as_before(netns: str, tmp_path: Path) -> None:
    root = tmp_path / "node"
    root.mkdir()
    nodes = tmp_path / "nodes"  # the cluster (not the install's)
    nodes.mkdir()
    for name, cidr, addr in (("me", "10.206.141.0/24", "10.206.0.61"), ("peer", "10.206.142.0/24", "10.206.0.62")):
        doc = {"kind": "Node", "metadata": {"name": name}, "spec": {"podCIDRs": [cidr]},
               "status": {"addresses": [{"type": "InternalIP", "address": addr}]}}  # fmt: skip
        (nodes / f"{name}.json").write_text(json.dumps(doc))
    flags, config = _node(root)
    cm = tmp_path / "cm.yaml"
    cm.write_text(
        f"plugin: kubernetes.io/no-op\nplugin_dir: {root}/exec\nstate_dir: {root}/state\nrun_dir: {root}/run\n"
        f"host: static\npods_dir: {tmp_path}/pods\nnodes_dir: {nodes}\nnode_name: me\n"
        "cluster_cidrs: [10.206.128.0/17]\nmetrics_address: none\n"
    )
    files_before, kernel_before = _files(root), _kernel(netns)

    done = _in(netns, "bash", str(INSTALL), *flags, "--config-from", str(cm))
    assert done.returncode == 0, done.stdout + done.stderr
    log = tmp_path / "daemon.log"
    with open(log, "wb") as out:
        daemon = subprocess.Popen(
            ["ip", "netns", "exec", netns, sys.executable, "-m", "netplugin", "serve", "--config", str(config)],
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_answering(str(root / "run" / "netplugin.sock"), daemon, log)
        for i in range(2):
            cli = [sys.executable, "-m", "netplugin", "--config", str(config)]
            pod = _in(netns, *cli, "setup", "default", f"w{i}", f"i{i}")
            assert pod.returncode == 0, pod.stderr
        kernel = _kernel(netns)
        assert "table inet netplugin" in str(kernel["nft"]) and "10.206.142.0/24" in str(kernel["routes"])

        dry = _in(netns, "bash", str(INSTALL), *flags, "--uninstall", "--purge", "--dry-run")
        assert dry.returncode == 0 and "install.sh: dry run, nothing removed" in dry.stdout, dry.stdout + dry.stderr
        assert daemon.poll() is None and _kernel(netns) == kernel

        gone = _in(netns, "bash", str(INSTALL), *flags, "--uninstall", "--purge")
        assert gone.returncode == 0, gone.stdout + gone.stderr
        out = gone.stdout
        assert "stopped the daemon (pid" in out and "tore down pod default/w0 (i0)" in out, out
        assert f"removed {root}/cni-conf/10-netplugin.conflist" in out and f"removed {config}" in out
        assert "install.sh: uninstalled" in out
        assert daemon.wait(30) == 0
    finally:
        if daemon.poll() is None:
            daemon.terminate()
            daemon.wait(30)
    assert _files(root) == files_before
    assert _kernel(netns) == kernel_before
    again = _in(netns, "bash", str(INSTALL), *flags, "--uninstall", "--purge")
    assert again.returncode == 0 and again.stdout.strip() == "install.sh: nothing to remove", again.stdout


def test_uninstall_without_purge_keeps_the_pods_state(tmp_path: Path) -> None:
    root = tmp_path / "node"
    root.mkdir()
    flags, config = _node(root)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_")}
    done = subprocess.run(["bash", str(INSTALL), *flags, "--plugin", "kubernetes.io/no-op"],
                          capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    pod = subprocess.run([sys.executable, "-m", "netplugin", "--config", str(config), "setup", "default", "w", "i"],
                         capture_output=True, text=True, env={**env, "PYTHONPATH": str(REPO)}, timeout=120)  # fmt: skip
    assert pod.returncode == 0, pod.stderr
    gone = subprocess.run(["bash", str(INSTALL), *flags, "--uninstall"], capture_output=True, text=True, env=env,
                          timeout=300)  # fmt: skip
    assert gone.returncode == 0, gone.stdout + gone.stderr
    assert "tore down" not in gone.stdout
    assert [p for p in _files(root) if "pods/" in p and p.endswith(".json")], _files(root)  # the record stays
    assert not (root / "etc").exists() and not (root / "exec").exists() and not (root / "cni-bin").exists()


# --- what an uninstall must keep, and the daemon it must stop ------------------------------------------


def _no_op_node(tmp_path: Path, netns: str, extra: str = "") -> tuple[Path, list[str], Path]:
    """A node installed from a config file (the no-op plugin: no kernel objects of its own) in ``netns``."""
    root = tmp_path / "node"
    root.mkdir()
    flags, config = _node(root)
    cm = tmp_path / "cm.yaml"
    cm.write_text(
        f"plugin: kubernetes.io/no-op\nplugin_dir: {root}/exec\nstate_dir: {root}/state\nrun_dir: {root}/run\n"
        f"host: none\nmetrics_address: none\n{extra}"
    )
    done = _in(netns, "bash", str(INSTALL), *flags, "--config-from", str(cm))
    assert done.returncode == 0, done.stdout + done.stderr
    return root, flags, config


def _hostport_table(ns: str) -> str:
    return _in(ns, "nft", "list", "table", "inet", "netplugin_hostport").stdout


@pytest.mark.parametrize("purge", [False, True], ids=["uninstall", "purge"])
def test_uninstall_keeps_the_hostport_table_of_live_pods_unless_purged(
    netns: str, tmp_path: Path, purge: bool
) -> None:
    root, flags, _ = _no_op_node(tmp_path, netns)
    # the hostport member's table (its guard chain included), as its init makes it on the node
    env_init = _in(netns, "env", f"NETPLUGIN_STATE_DIR={root}/state", str(REPO / "exec_plugins" / "hostport" /
                   "hostport"), "init")  # fmt: skip
    assert env_init.returncode == 0, env_init.stderr
    assert "chain guard" in _hostport_table(netns)
    gone = _in(netns, "bash", str(INSTALL), *flags, "--uninstall", *(["--purge"] if purge else []))
    assert gone.returncode == 0, gone.stdout + gone.stderr
    if purge:  # every pod torn down: nothing needs it
        assert "removed nftables table inet netplugin_hostport" in gone.stdout, gone.stdout
        assert _hostport_table(netns) == ""
    else:  # pods keep their network: their DNATs and the localhost guard stay
        assert "kept nftables table inet netplugin_hostport" in gone.stdout, gone.stdout
        assert "chain guard" in _hostport_table(netns)
        _in(netns, "nft", "delete", "table", "inet", "netplugin_hostport")


def test_uninstall_stops_the_daemon_at_the_socket_its_config_names(netns: str, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere" / "np.sock"
    elsewhere.parent.mkdir()
    _, flags, config = _no_op_node(tmp_path, netns, f"socket: {elsewhere}\n")
    log = tmp_path / "daemon.log"
    with open(log, "wb") as out:
        daemon = subprocess.Popen(
            ["ip", "netns", "exec", netns, sys.executable, "-m", "netplugin", "serve", "--config", str(config)],
            env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_answering(str(elsewhere), daemon, log)
        gone = _in(netns, "bash", str(INSTALL), *flags, "--uninstall")
        assert gone.returncode == 0, gone.stdout + gone.stderr
        assert f"at {elsewhere}" in gone.stdout and "stopped the daemon (pid" in gone.stdout, gone.stdout
        assert daemon.wait(30) == 0
    finally:
        if daemon.poll() is None:
            daemon.terminate()
            daemon.wait(30)


def test_purge_with_a_config_that_does_not_load_keeps_the_pods_state(netns: str, tmp_path: Path) -> None:
    root, flags, config = _no_op_node(tmp_path, netns)
    cli = [sys.executable, "-m", "netplugin", "--config", str(config)]
    pod = _in(netns, *cli, "setup", "default", "w", "i")
    assert pod.returncode == 0, pod.stderr
    records = sorted((root / "state" / "pods").glob("*.json"))
    assert records
    config.write_text(config.read_text() + "plugn: typo\n")  # the config no longer loads
    gone = _in(netns, "bash", str(INSTALL), *flags, "--uninstall", "--purge")
    assert gone.returncode == 1, gone.stdout + gone.stderr
    assert "could not be torn down" in gone.stderr and "does not load" in gone.stderr, gone.stderr
    assert sorted((root / "state" / "pods").glob("*.json")) == records  # what can still free the pod
    assert (root / "run").is_dir()


def test_uninstall_removes_the_man_page_link_install_made(tmp_path: Path) -> None:
    root = tmp_path / "node"
    prefix, man = root / "prefix", root / "man"
    for d in (man, prefix / "share" / "man" / "man1"):
        d.mkdir(parents=True)
    (prefix / "share" / "man" / "man1" / "netplugin.1").write_text(".TH NETPLUGIN 1\n")
    (man / "netplugin.1").symlink_to(prefix / "share" / "man" / "man1" / "netplugin.1")  # what install links
    (man / "other.1").symlink_to("/nonexistent/other.1")  # not ours
    flags, _ = _node(root)
    flags = [f for f in flags if f != "--no-venv"]
    argv = ["bash", str(INSTALL), *flags, "--prefix", str(prefix), "--bin-dir", str(root / "bin"),
            "--man-dir", str(man), "--systemd-dir", "none", "--uninstall"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_")}
    dry = subprocess.run([*argv, "--dry-run"], capture_output=True, text=True, env=env, timeout=300)
    assert f"would remove {man}/netplugin.1" in dry.stdout and (man / "netplugin.1").is_symlink(), dry.stdout
    gone = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert f"removed {man}/netplugin.1" in gone.stdout, gone.stdout + gone.stderr
    assert not (man / "netplugin.1").is_symlink() and (man / "other.1").is_symlink()


def test_purge_keeps_the_state_of_a_pod_whose_teardown_fails(netns: str, tmp_path: Path) -> None:
    root = tmp_path / "node"
    failer = root / "exec" / "failer"
    failer.mkdir(parents=True)
    (failer / "failer").write_text('#!/bin/bash\n[ "$1" != teardown ] || { echo "cannot let go" >&2; exit 1; }\n')
    for path, mode in ((root, 0o755), (root / "exec", 0o755), (failer, 0o755), (failer / "failer", 0o755)):
        path.chmod(mode)
    flags, config = _node(root)
    cm = tmp_path / "cm.yaml"
    cm.write_text(f"plugin: failer\nplugin_dir: {root}/exec\nstate_dir: {root}/state\nrun_dir: {root}/run\n"
                  "host: none\nmetrics_address: none\n")  # fmt: skip
    done = _in(netns, "bash", str(INSTALL), *flags, "--config-from", str(cm))
    assert done.returncode == 0, done.stdout + done.stderr
    pod = _in(netns, sys.executable, "-m", "netplugin", "--config", str(config), "setup", "default", "w", "i")
    assert pod.returncode == 0, pod.stderr
    records = sorted((root / "state" / "pods").glob("*.json"))
    gone = _in(netns, "bash", str(INSTALL), *flags, "--uninstall", "--purge")
    # the records are all that can still free the pod: they stay
    assert records and sorted((root / "state" / "pods").glob("*.json")) == records, gone.stdout
    assert gone.returncode == 1, gone.stdout + gone.stderr
    assert "cannot let go" in gone.stderr and "could not be torn down" in gone.stderr, gone.stderr
