"""etc/kubernetes/ and scripts/install.sh: the pieces that put netplugin onto a cluster's nodes.

The manifests are checked against each other and against netplugin.core.config's defaults, so that
renaming a path, a ConfigMap or the ServiceAccount in one place fails here instead of on a node.
install.sh itself is run for real in tests/deploy/test_install.py.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from netplugin.core import config as npconfig
from netplugin.core import defaults as npdefaults
from netplugin.core.defaults import SOCKET_NAME

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


def test_rbac_is_exactly_read_pods_and_nodes() -> None:
    # What the code uses: GET pod (every host), GET node (CLI path), LIST+WATCH pods with a
    # spec.nodeName field selector and LIST+WATCH nodes (the daemon's caches). Nothing more.
    role = _one("ClusterRole")
    assert len(role["rules"]) == 2
    for rule, resource in zip(role["rules"], ["pods", "nodes"], strict=True):
        assert set(rule) == {"apiGroups", "resources", "verbs"}  # no resourceNames, no nonResourceURLs
        assert rule["apiGroups"] == [""]
        assert rule["resources"] == [resource]
        assert sorted(rule["verbs"]) == ["get", "list", "watch"]
    assert "aggregationRule" not in role


def test_daemonset_shape(ds: dict[str, Any], pod_spec: dict[str, Any], main_container: dict[str, Any]) -> None:
    assert ds["metadata"]["name"] == "netplugin"
    template_labels = ds["spec"]["template"]["metadata"]["labels"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= template_labels.items()
    assert pod_spec["hostNetwork"] is True
    # The daemon finds orphaned plugins of host-side callers (shim, CLI) through /proc.
    assert pod_spec["hostPID"] is True
    assert pod_spec["priorityClassName"] == "system-node-critical"
    # One toleration with operator Exists and no key/effect tolerates every taint.
    assert {"operator": "Exists"} in pod_spec["tolerations"]
    assert main_container["securityContext"]["privileged"] is True
    argv = [*main_container.get("command", []), *main_container.get("args", [])]
    assert argv == ["netplugin", "serve", "--config", npdefaults.DEFAULT_CONFIG]
    images = {c["image"] for c in pod_spec["containers"] + pod_spec["initContainers"]}
    assert len(images) == 1, "the installer and the daemon must come from the same image"


HOST_DIRS = [
    pytest.param(npdefaults.DEFAULT_PLUGIN_DIR, id="exec-dir"),
    pytest.param(npdefaults.DEFAULT_STATE_DIR, id="state-dir"),
    pytest.param(npdefaults.DEFAULT_RUN_DIR, id="run-dir"),
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


def test_config_is_installed_on_the_node_where_daemon_and_shim_read_it(
    pod_spec: dict[str, Any], main_container: dict[str, Any], init_container: dict[str, Any]
) -> None:
    # The init container installs the ConfigMap's file on the node (--config-from) ...
    [config_volume] = [v for v in pod_spec["volumes"] if "configMap" in v]
    items = config_volume["configMap"].get("items") or [{"key": "netplugin.yaml", "path": "netplugin.yaml"}]
    cm_mount = _mounts(init_container)[config_volume["name"]]
    argv = [*init_container.get("command", []), *init_container.get("args", [])]
    assert argv[argv.index("--config-from") + 1] == f"{cm_mount['mountPath']}/{items[0]['path']}"
    assert argv[argv.index("--config") + 1] == npdefaults.DEFAULT_CONFIG
    # ... a host dir, so that the shim on the host reads the very file the daemon reads.
    host_dir = os.path.dirname(npdefaults.DEFAULT_CONFIG)
    assert _mount_for_host_path(pod_spec, init_container, host_dir)["mountPath"] == host_dir
    daemon_mount = _mount_for_host_path(pod_spec, main_container, host_dir)
    assert (daemon_mount["mountPath"], daemon_mount.get("readOnly")) == (host_dir, True)
    assert config_volume["name"] not in _mounts(main_container)  # the daemon reads the node's copy only


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
        npdefaults.DEFAULT_PLUGIN_DIR,
        npdefaults.DEFAULT_STATE_DIR,
        npdefaults.DEFAULT_RUN_DIR,
    )
    # The probes ask the daemon on its socket, which lives in a mounted dir (the CLI and shim use it).
    assert os.path.dirname(cfg.socket_path) in mount_paths


def test_init_container_installs_into_the_mounted_dirs(
    pod_spec: dict[str, Any], init_container: dict[str, Any]
) -> None:
    argv = [*init_container.get("command", []), *init_container.get("args", [])]
    [script_at] = [i for i, a in enumerate(argv) if a.endswith("scripts/install.sh")]
    rest = [a for a in argv[script_at + 1 :] if a != "--no-venv"]
    assert "--no-venv" in argv  # the image's netplugin stays in the image; the node gets plugins and shim
    flags = dict(zip(rest[::2], rest[1::2], strict=True))
    assert flags["--exec-dir"] == npdefaults.DEFAULT_PLUGIN_DIR
    mounts = [m["mountPath"] for m in init_container["volumeMounts"]]
    for flag in ("--exec-dir", "--cni-bin-dir", "--cni-conf-dir", "--lib-dir"):
        target = flags[flag]
        assert any(target == m or target.startswith(m.rstrip("/") + "/") for m in mounts), flag
    # The installer must write what the daemon's containers later read.
    assert flags["--cni-bin-dir"] == "/opt/cni/bin"
    assert flags["--cni-conf-dir"] == "/etc/cni/net.d"
    # ... and point the conflist at the daemon's dirs.
    assert (flags["--state-dir"], flags["--run-dir"]) == (npdefaults.DEFAULT_STATE_DIR, npdefaults.DEFAULT_RUN_DIR)


def test_install_sh_defaults_match_config_and_daemonset() -> None:
    text = INSTALL.read_text()
    assert f"NETPLUGIN_PLUGIN_DIR:-{npdefaults.DEFAULT_PLUGIN_DIR}" in text
    assert "NETPLUGIN_CNI_BIN_DIR:-/opt/cni/bin" in text
    assert "NETPLUGIN_CNI_CONF_DIR:-/etc/cni/net.d" in text


# --- a DaemonSet that would pass review ----------------------------------------------------------


def _containers(pod_spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod_spec["initContainers"], *pod_spec["containers"]]


def test_daemonset_placement_and_dns(pod_spec: dict[str, Any]) -> None:
    assert pod_spec["nodeSelector"] == {"kubernetes.io/os": "linux"}
    # Cluster DNS needs the pod network this agent provides: resolve like the node does.
    assert pod_spec["dnsPolicy"] == "Default"
    assert pod_spec["tolerations"] == [{"operator": "Exists"}]


def test_termination_grace_covers_the_drain_bound(configmap_config: npconfig.Config, pod_spec: dict[str, Any]) -> None:
    from types import SimpleNamespace

    from netplugin.frontends.daemon.server import Daemon

    bound = Daemon.drain_bound(SimpleNamespace(config=configmap_config))  # type: ignore[arg-type]
    assert pod_spec["terminationGracePeriodSeconds"] >= bound


def test_every_container_has_resources(pod_spec: dict[str, Any]) -> None:
    for c in _containers(pod_spec):
        assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"], c["name"]
        assert c["resources"]["limits"]["memory"], c["name"]


def test_init_container_is_unprivileged(init_container: dict[str, Any], pod_spec: dict[str, Any]) -> None:
    sc = init_container["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    # Root-owned files on the node: uid 0 with only what copying and chown/chmod of its files need.
    assert set(sc["capabilities"]["add"]) <= {"CHOWN", "DAC_OVERRIDE", "FOWNER"}
    assert sc["readOnlyRootFilesystem"] is True
    tmp = _mounts(init_container)["tmp"]  # install.sh's temp files
    assert tmp["mountPath"] == "/tmp"
    assert {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}} in pod_spec["volumes"]


def test_probes_ask_the_daemon(main_container: dict[str, Any]) -> None:
    for probe in ("livenessProbe", "readinessProbe"):
        argv = main_container[probe]["exec"]["command"]
        assert argv[:2] == ["netplugin", "health"], probe  # a stale socket fails it (tests/frontends/daemon)
        wait = float(argv[argv.index("--wait") + 1])
        assert main_container[probe]["timeoutSeconds"] > wait, probe
    assert main_container["livenessProbe"]["failureThreshold"] >= 3


def test_metrics_port_is_declared_and_matches_the_config(
    configmap_config: npconfig.Config, main_container: dict[str, Any]
) -> None:
    [port] = [p for p in main_container["ports"] if p["name"] == "metrics"]
    assert str(port["containerPort"]) == configmap_config.metrics_address.rsplit(":", 1)[1]
    env = {e["name"]: e for e in main_container["env"]}
    assert env["HOST_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"  # for binding beyond loopback


def test_image_is_pinned_by_digest(pod_spec: dict[str, Any]) -> None:
    kust = yaml.safe_load((KUBE_DIR / "kustomization.yaml").read_text())
    [pin] = kust["images"]
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", pin["digest"])
    for c in _containers(pod_spec):
        assert c["image"].split(":")[0] == pin["name"], c["name"]


def test_kustomize_renders_the_digest_in_every_container() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    out = subprocess.run([kubectl, "kustomize", str(KUBE_DIR)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    [ds] = [d for d in yaml.safe_load_all(out.stdout) if d and d["kind"] == "DaemonSet"]
    spec = ds["spec"]["template"]["spec"]
    digest = yaml.safe_load((KUBE_DIR / "kustomization.yaml").read_text())["images"][0]["digest"]
    assert {c["image"] for c in _containers(spec)} == {f"ghcr.io/netplugin/netplugin@{digest}"}


def test_manifests_pass_kubernetes_validate_strict() -> None:
    validate = shutil.which("kubernetes-validate")
    if validate is None:
        pytest.skip("kubernetes-validate is not installed (pip install -e .[test])")
    out = subprocess.run(
        [validate, "--strict", *map(str, _manifest_files())], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("passed") == len(_docs()), out.stdout


def test_init_container_installs_the_images_compiled_shim_in_cluster_mode(
    configmap_config: npconfig.Config, init_container: dict[str, Any]
) -> None:
    argv = [*init_container.get("command", []), *init_container.get("args", [])]
    [script_at] = [i for i, a in enumerate(argv) if a.endswith("scripts/install.sh")]
    rest = [a for a in argv[script_at + 1 :] if a != "--no-venv"]
    flags = dict(zip(rest[::2], rest[1::2], strict=True))
    # The binary the image's build stage compiled (the Containerfile copies it there), not a mount.
    copies = re.findall(r"^COPY --from=shim /netplugin-cni (\S+)$", (REPO / "Containerfile").read_text(), re.M)
    assert flags["--native-shim"] in copies, copies
    mounts = [m["mountPath"] for m in init_container["volumeMounts"]]
    assert not any(flags["--native-shim"].startswith(m.rstrip("/") + "/") for m in mounts)
    # Cluster mode: no Python per call; without the daemon, CNI error 11 (never a shim on its own).
    assert flags["--shim-fallback"] == "none"
    # The socket install.sh writes into the shim (<run dir>/netplugin.sock) is the daemon's.
    assert os.path.join(flags["--run-dir"], SOCKET_NAME) == configmap_config.socket_path
