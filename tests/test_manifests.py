"""etc/kubernetes/ and scripts/install.sh: the pieces that put netplugin onto a cluster's nodes.

The manifests are checked against each other and against netplugin.core.config's defaults, so that
renaming a path, a ConfigMap or the ServiceAccount in one place fails here instead of on a node.
install.sh is run for real, with every target directory under tmp_path.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from netplugin.core import config as npconfig

REPO = Path(__file__).resolve().parent.parent
KUBE_DIR = REPO / "etc" / "kubernetes"
INSTALL = REPO / "scripts" / "install.sh"
CNI_CONFLIST = REPO / "etc" / "cni" / "10-netplugin.conflist"


# --- loading -------------------------------------------------------------------------------------


def _manifest_files() -> list[Path]:
    return sorted(p for p in KUBE_DIR.glob("*.y*ml") if p.name != "kustomization.yaml")


def _docs() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in _manifest_files():
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is None:
                continue
            assert isinstance(doc, dict) and "kind" in doc, f"{path.name}: a document without kind"
            doc["__file__"] = path.name
            docs.append(doc)
    return docs


def _one(kind: str) -> dict[str, Any]:
    found = [d for d in _docs() if d["kind"] == kind]
    assert len(found) == 1, f"expected exactly one {kind}, found {len(found)}"
    return found[0]


@pytest.fixture(scope="module")
def ds() -> dict[str, Any]:
    return _one("DaemonSet")


@pytest.fixture(scope="module")
def pod_spec(ds: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = ds["spec"]["template"]["spec"]
    return spec


@pytest.fixture(scope="module")
def main_container(pod_spec: dict[str, Any]) -> dict[str, Any]:
    [container] = [c for c in pod_spec["containers"] if c["name"] == "netplugin"]
    return container


@pytest.fixture(scope="module")
def init_container(pod_spec: dict[str, Any]) -> dict[str, Any]:
    [container] = pod_spec["initContainers"]
    return container


@pytest.fixture(scope="module")
def configmap_config(tmp_path_factory: pytest.TempPathFactory) -> npconfig.Config:
    cm = _one("ConfigMap")
    path = tmp_path_factory.mktemp("cm") / "netplugin.yaml"
    path.write_text(cm["data"]["netplugin.yaml"])
    # environ={} so that the machine's NETPLUGIN_* variables cannot mask a bad file.
    return npconfig.load_config(str(path), environ={})


def _mounts(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """volume name -> its mount in this container."""
    return {m["name"]: m for m in container.get("volumeMounts", [])}


def _host_paths(pod_spec: dict[str, Any]) -> dict[str, str]:
    return {v["name"]: v["hostPath"]["path"] for v in pod_spec["volumes"] if "hostPath" in v}


def _mount_for_host_path(pod_spec: dict[str, Any], container: dict[str, Any], host_path: str) -> dict[str, Any]:
    names = [name for name, path in _host_paths(pod_spec).items() if path == host_path]
    assert names, f"no hostPath volume for {host_path}"
    mounts = _mounts(container)
    found = [mounts[n] for n in names if n in mounts]
    assert found, f"{container['name']} does not mount {host_path}"
    return found[0]


def _run_dir(path: str) -> str:
    # /var/run is a symlink to /run on every current distribution (and in the image).
    return "/run" + path[len("/var/run") :] if path.startswith("/var/run/") else path


# --- the manifests agree with each other ---------------------------------------------------------


def test_every_file_parses_and_has_expected_kinds() -> None:
    kinds = sorted(d["kind"] for d in _docs())
    assert kinds == ["ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet", "ServiceAccount"]


def test_kustomization_lists_every_file() -> None:
    kust = yaml.safe_load((KUBE_DIR / "kustomization.yaml").read_text())
    assert kust["kind"] == "Kustomization"
    assert sorted(kust["resources"]) == sorted(p.name for p in _manifest_files())
    assert len(kust["resources"]) == len(set(kust["resources"]))


def test_kustomize_builds_when_kubectl_is_installed() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    out = subprocess.run([kubectl, "kustomize", str(KUBE_DIR)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    built = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert sorted(d["kind"] for d in built) == sorted(d["kind"] for d in _docs())


def test_namespaced_objects_live_in_kube_system() -> None:
    for doc in _docs():
        if doc["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            assert "namespace" not in doc["metadata"], doc["__file__"]
        else:
            assert doc["metadata"]["namespace"] == "kube-system", doc["__file__"]


def test_names_agree(pod_spec: dict[str, Any]) -> None:
    sa, role, binding, cm = _one("ServiceAccount"), _one("ClusterRole"), _one("ClusterRoleBinding"), _one("ConfigMap")
    assert pod_spec["serviceAccountName"] == sa["metadata"]["name"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": sa["metadata"]["namespace"]}
    ]
    [config_volume] = [v for v in pod_spec["volumes"] if "configMap" in v]
    assert config_volume["configMap"]["name"] == cm["metadata"]["name"]
    keys = [item["key"] for item in config_volume["configMap"].get("items", [])]
    assert keys in ([], ["netplugin.yaml"])
    assert "netplugin.yaml" in cm["data"]


def test_rbac_is_exactly_read_pods() -> None:
    role = _one("ClusterRole")
    assert len(role["rules"]) == 1
    [rule] = role["rules"]
    assert set(rule) == {"apiGroups", "resources", "verbs"}  # no resourceNames, no nonResourceURLs
    assert rule["apiGroups"] == [""]
    assert rule["resources"] == ["pods"]
    assert sorted(rule["verbs"]) == ["get", "list", "watch"]
    assert "aggregationRule" not in role


def test_daemonset_shape(ds: dict[str, Any], pod_spec: dict[str, Any], main_container: dict[str, Any]) -> None:
    assert ds["metadata"]["name"] == "netplugin"
    template_labels = ds["spec"]["template"]["metadata"]["labels"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= template_labels.items()
    assert pod_spec["hostNetwork"] is True
    assert pod_spec["hostPID"] is False
    assert pod_spec["priorityClassName"] == "system-node-critical"
    # One toleration with operator Exists and no key/effect tolerates every taint.
    assert {"operator": "Exists"} in pod_spec["tolerations"]
    assert main_container["securityContext"]["privileged"] is True
    assert [*main_container.get("command", []), *main_container.get("args", [])] == ["netplugin", "serve"]
    images = {c["image"] for c in pod_spec["containers"] + pod_spec["initContainers"]}
    assert len(images) == 1, "the installer and the daemon must come from the same image"


HOST_DIRS = [
    pytest.param(npconfig.DEFAULT_PLUGIN_DIR, id="exec-dir"),
    pytest.param(npconfig.DEFAULT_STATE_DIR, id="state-dir"),
    pytest.param(npconfig.DEFAULT_RUN_DIR, id="run-dir"),
    pytest.param(_run_dir(os.path.dirname(npconfig.Config().netns_template)), id="netns-dir"),
    pytest.param("/etc/cni/net.d", id="cni-conf-dir"),
    pytest.param("/opt/cni/bin", id="cni-bin-dir"),
]


@pytest.mark.parametrize("host_path", HOST_DIRS)
def test_daemon_mounts_each_host_dir_at_the_same_path(
    pod_spec: dict[str, Any], main_container: dict[str, Any], host_path: str
) -> None:
    mount = _mount_for_host_path(pod_spec, main_container, host_path)
    assert mount["mountPath"] == host_path


def test_every_host_path_mount_is_at_its_host_path(pod_spec: dict[str, Any]) -> None:
    # Paths inside and outside the pod must agree: the daemon hands them to plugins and records them.
    host_paths = _host_paths(pod_spec)
    for container in pod_spec["containers"] + pod_spec["initContainers"]:
        for name, mount in _mounts(container).items():
            if name in host_paths:
                assert mount["mountPath"] == host_paths[name], f"{container['name']}: {name}"


def test_netns_mount_propagates_from_the_host(pod_spec: dict[str, Any], main_container: dict[str, Any]) -> None:
    mount = _mount_for_host_path(pod_spec, main_container, "/run/netns")
    assert mount["mountPropagation"] == "HostToContainer"


def test_config_is_mounted_where_netplugin_reads_it(pod_spec: dict[str, Any], main_container: dict[str, Any]) -> None:
    [config_volume] = [v for v in pod_spec["volumes"] if "configMap" in v]
    mount = _mounts(main_container)[config_volume["name"]]
    assert mount["mountPath"] == os.path.dirname(npconfig.DEFAULT_CONFIG)
    items = config_volume["configMap"].get("items") or [{"key": "netplugin.yaml", "path": "netplugin.yaml"}]
    assert [i["path"] for i in items] == [os.path.basename(npconfig.DEFAULT_CONFIG)]


def test_configmap_config_loads_and_matches_the_mounts(
    configmap_config: npconfig.Config, pod_spec: dict[str, Any], main_container: dict[str, Any]
) -> None:
    cfg = configmap_config
    assert cfg.host == "kube"
    assert cfg.kubeconfig is None  # in-cluster service account
    mount_paths = {m["mountPath"] for m in main_container["volumeMounts"]}
    for directory in (cfg.plugin_dir, cfg.state_dir, cfg.run_dir, _run_dir(os.path.dirname(cfg.netns_template))):
        assert directory in mount_paths, directory
    assert (cfg.plugin_dir, cfg.state_dir, cfg.run_dir) == (
        npconfig.DEFAULT_PLUGIN_DIR,
        npconfig.DEFAULT_STATE_DIR,
        npconfig.DEFAULT_RUN_DIR,
    )
    # The readiness probe waits for the socket the daemon will create.
    probe = main_container["readinessProbe"]["exec"]["command"]
    assert probe[-1] == cfg.socket_path
    assert os.path.dirname(cfg.socket_path) in mount_paths


def test_init_container_installs_into_the_mounted_dirs(
    pod_spec: dict[str, Any], init_container: dict[str, Any]
) -> None:
    argv = [*init_container.get("command", []), *init_container.get("args", [])]
    [script_at] = [i for i, a in enumerate(argv) if a.endswith("scripts/install.sh")]
    rest = argv[script_at + 1 :]
    flags = dict(zip(rest[::2], rest[1::2], strict=True))
    assert flags["--exec-dir"] == npconfig.DEFAULT_PLUGIN_DIR
    mounts = [m["mountPath"] for m in init_container["volumeMounts"]]
    for flag in ("--exec-dir", "--cni-bin-dir", "--cni-conf-dir", "--lib-dir"):
        target = flags[flag]
        assert any(target == m or target.startswith(m.rstrip("/") + "/") for m in mounts), flag
    # The installer must write what the daemon's containers later read.
    assert flags["--cni-bin-dir"] == "/opt/cni/bin"
    assert flags["--cni-conf-dir"] == "/etc/cni/net.d"


def test_install_sh_defaults_match_config_and_daemonset() -> None:
    text = INSTALL.read_text()
    assert f"NETPLUGIN_PLUGIN_DIR:-{npconfig.DEFAULT_PLUGIN_DIR}" in text
    assert "NETPLUGIN_CNI_BIN_DIR:-/opt/cni/bin" in text
    assert "NETPLUGIN_CNI_CONF_DIR:-/etc/cni/net.d" in text


# --- install.sh, for real ------------------------------------------------------------------------


def test_install_sh_is_shellcheck_clean() -> None:
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed")
    out = subprocess.run(["shellcheck", str(INSTALL)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout
    assert os.access(INSTALL, os.X_OK)


def _install(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_")}
    full.update(env)
    return subprocess.run(
        ["bash", str(INSTALL), *args], capture_output=True, text=True, timeout=120, env=full, stdin=subprocess.DEVNULL
    )


def _targets(tmp_path: Path) -> dict[str, Path]:
    return {
        "--exec-dir": tmp_path / "node" / "exec",
        "--cni-bin-dir": tmp_path / "node" / "cni-bin",
        "--cni-conf-dir": tmp_path / "node" / "cni-conf",
    }


def _flags(targets: dict[str, Path]) -> list[str]:
    return [x for flag, path in targets.items() for x in (flag, str(path))]


def _tree_state(root: Path) -> dict[str, tuple[int, int, int]]:
    """relative path -> (mode, uid, mtime_ns) of everything under root."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(root))] = (stat.S_IMODE(st.st_mode), st.st_uid, st.st_mtime_ns)
    return out


def _make_source(tmp_path: Path) -> Path:
    """A source tree with sloppy modes, the way a checkout under a lax umask looks."""
    src = tmp_path / "src"
    plugin = src / "exec_plugins" / "example.org~sloppy"
    (plugin / "lib").mkdir(parents=True)
    exe = plugin / "sloppy"
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o775)
    (plugin / "README").write_text("docs\n")
    (plugin / "README").chmod(0o666)
    (plugin / "lib" / "helper.sh").write_text("true\n")
    plugin.chmod(0o777)
    (src / "exec_plugins" / "README.md").write_text("not a plugin\n")
    (src / "etc" / "cni").mkdir(parents=True)
    (src / "etc" / "cni" / "10-netplugin.conflist").write_text('{"cniVersion": "1.0.0", "name": "netplugin"}\n')
    pkg = src / "netplugin"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    # A stand-in shim: shows that the wrapper runs netplugin.frontends.cni:main with the runtime's env and argv.
    (pkg / "frontends" / "cni").mkdir(parents=True)
    (pkg / "frontends" / "__init__.py").write_text("")
    (pkg / "frontends" / "cni" / "__init__.py").write_text(
        "import json, os, sys\n"
        "def main():\n"
        "    print(json.dumps({'cmd': os.environ.get('CNI_COMMAND'), 'argv': sys.argv[1:],"
        " 'file': __file__}))\n"
        "    return 0\n"
    )
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / "__init__.cpython-311.pyc").write_bytes(b"junk")
    return src


@pytest.mark.skipif(os.geteuid() != 0, reason="checks root ownership; run as root")
def test_install_sloppy_source_is_normalised_and_idempotent(tmp_path: Path) -> None:
    src = _make_source(tmp_path)
    targets = _targets(tmp_path)
    exec_dir, cni_bin, cni_conf = targets.values()
    lib = tmp_path / "node" / "lib"
    # An earlier bad install left a world-writable exec dir behind: the installer must fix it.
    exec_dir.mkdir(parents=True)
    exec_dir.chmod(0o777)
    args = [*_flags(targets), "--source", str(src), "--python", sys.executable, "--lib-dir", str(lib)]
    first = _install(*args)
    assert first.returncode == 0, first.stderr

    plugin = exec_dir / "example.org~sloppy"
    expected_modes = {
        exec_dir: 0o755,
        plugin: 0o755,
        plugin / "sloppy": 0o755,
        plugin / "README": 0o644,
        plugin / "lib": 0o755,
        plugin / "lib" / "helper.sh": 0o644,
        cni_bin / "netplugin-cni": 0o755,
        cni_conf / "10-netplugin.conflist": 0o644,
        lib / "netplugin" / "frontends" / "cni" / "__init__.py": 0o644,
    }
    for path, mode in expected_modes.items():
        st = path.stat()
        assert stat.S_IMODE(st.st_mode) == mode, path
        assert (st.st_uid, st.st_gid) == (0, 0), path
    assert not (exec_dir / "README.md").exists()  # docs beside the plugins are not plugins
    assert not (lib / "netplugin" / "__pycache__").exists()
    assert (cni_conf / "10-netplugin.conflist").read_text() == (src / "etc/cni/10-netplugin.conflist").read_text()
    assert not [p for p in (tmp_path / "node").rglob("*netplugin-tmp*")]

    # netplugin's own discovery accepts what was installed.
    from netplugin.core.discovery import scan

    [cand] = scan(str(exec_dir))
    assert (cand.name, cand.problem) == ("example.org/sloppy", None)

    # The wrapper runs the shim from --lib-dir with --python, passing argv and the CNI environment.
    out = subprocess.run(
        [str(cni_bin / "netplugin-cni"), "x"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={"PATH": os.environ["PATH"], "CNI_COMMAND": "VERSION"},
    )
    assert out.returncode == 0, out.stderr
    ran = json.loads(out.stdout)
    stand_in = lib / "netplugin" / "frontends" / "cni" / "__init__.py"
    assert ran == {"cmd": "VERSION", "argv": ["x"], "file": str(stand_in)}

    # Second run: nothing to do, nothing touched.
    before = _tree_state(tmp_path / "node")
    second = _install(*args)
    assert second.returncode == 0, second.stderr
    assert "nothing to do" in second.stdout
    assert not [line for line in second.stdout.splitlines() if line.startswith(("install ", "create ", "fix "))]
    assert _tree_state(tmp_path / "node") == before

    # A file someone loosened is repaired on the next run.
    (plugin / "sloppy").chmod(0o777)
    third = _install(*args)
    assert f"install {plugin / 'sloppy'} (0755)" in third.stdout
    assert stat.S_IMODE((plugin / "sloppy").stat().st_mode) == 0o755


def test_install_dry_run_changes_nothing(tmp_path: Path) -> None:
    targets = _targets(tmp_path)
    out = _install(*_flags(targets), "--dry-run")
    assert out.returncode == 0, out.stderr
    assert not (tmp_path / "node").exists()
    assert f"would install {targets['--exec-dir']}/bridge/bridge (0755)" in out.stdout
    assert f"would install {targets['--cni-bin-dir']}/netplugin-cni (0755)" in out.stdout
    if CNI_CONFLIST.exists():
        assert f"would install {targets['--cni-conf-dir']}/10-netplugin.conflist (0644)" in out.stdout
    assert "dry run, nothing changed" in out.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="checks root ownership; run as root")
def test_install_repo_plugins_pass_discovery(tmp_path: Path) -> None:
    targets = _targets(tmp_path)
    # Flags may also come from the environment (the DaemonSet could set them that way).
    out = _install(
        "--cni-bin-dir",
        str(targets["--cni-bin-dir"]),
        NETPLUGIN_PLUGIN_DIR=str(targets["--exec-dir"]),
        NETPLUGIN_CNI_CONF_DIR=str(targets["--cni-conf-dir"]),
    )
    assert out.returncode == 0, out.stderr
    from netplugin.core.discovery import scan

    shipped = sorted(p.name for p in (REPO / "exec_plugins").iterdir() if p.is_dir())
    cands = scan(str(targets["--exec-dir"]))
    assert sorted(os.path.basename(os.path.dirname(c.path)) for c in cands) == shipped
    assert [c.problem for c in cands] == [None] * len(shipped)
    wrapper = (targets["--cni-bin-dir"] / "netplugin-cni").read_text()
    assert "from netplugin.frontends.cni import main" in wrapper
    assert "PYTHONPATH" not in wrapper.replace("# ", "")  # no --lib-dir: the node's installed netplugin


@pytest.mark.parametrize(
    ("args", "words"),
    [
        pytest.param(["--bogus"], "unknown argument: --bogus", id="unknown-flag"),
        pytest.param(["--exec-dir"], "--exec-dir needs a value", id="missing-value"),
        pytest.param(["--source", "/nonexistent"], "is not a netplugin source tree", id="bad-source"),
        pytest.param(["--python", "python3"], "--python must be an absolute path", id="relative-python"),
        pytest.param(["--lib-dir", "/opt/with space"], "--lib-dir must be an absolute path", id="unsafe-lib-dir"),
    ],
)
def test_install_usage_errors(tmp_path: Path, args: list[str], words: str) -> None:
    out = _install(*_flags(_targets(tmp_path)), *args)
    assert out.returncode == 2
    assert words in out.stderr
    assert not (tmp_path / "node").exists()


def test_install_refuses_symlinks(tmp_path: Path) -> None:
    src = _make_source(tmp_path)
    (src / "exec_plugins" / "example.org~sloppy" / "passwd").symlink_to("/etc/passwd")
    out = _install(*_flags(_targets(tmp_path)), "--source", str(src))
    assert out.returncode == 1
    assert "refusing symlink" in out.stderr
