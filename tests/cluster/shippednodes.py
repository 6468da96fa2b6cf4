"""Simulated nodes installed from the shipped DaemonSet and ConfigMap, each with its own containerd.

A mixin of :class:`SimCluster`'s, for the cluster suites that run a real runtime on each node
(tests/cluster/test_cluster_installed.py with simcluster's API server, tests/cluster/test_kubelet.py
with kubelets against the real control plane). Each node is installed the way the DaemonSet
installs it, not with test settings:

* its config is the shipped ConfigMap's ``netplugin.yaml``, with what the cluster itself decides
  substituted: the hostPath directories mapped under the node's temp root (as the DaemonSet's host
  mounts map them), the API server (``kubeconfig``, the stand-in for the in-cluster service
  account) and ``cluster_cidrs`` (the cluster's pod CIDR, which the ConfigMap says to set);
* the init container's install steps: its ``install.sh`` argv from ``daemonset.yaml``, every host path
  remapped, with this tree as ``--source`` and the test's interpreter as the node's python3;
* the daemon: the DaemonSet container's ``command`` and its ``NODE_NAME`` (the Downward API's value).

A private containerd runs inside each node's namespace (``nsenter --net``, so that its pods' netns
mounts stay visible to everyone) with the CNI dirs the installer filled.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from netplugin.frontends.lab.simcluster.cluster import CLUSTER_CIDRS, SimCluster, SimNode
from tests.frontends.cni.containerd import Containerd
from tests.support.shipped import configmap_settings, daemonset, init_install_argv, main_container, run_install

__all__ = ["ShippedNodes"]


class ShippedNodes(SimCluster):
    """Nodes installed from the shipped DaemonSet and ConfigMap, each with its own containerd."""

    def __init__(self, *args: Any, peers: Path | None = None, **kw: Any) -> None:
        """``peers``: containerd 2 from this peer dir; None: Debian's containerd 1.6."""
        self.containerds: dict[str, Containerd] = {}
        self.peers = peers
        super().__init__(*args, **kw)

    @staticmethod
    def host_dirs(node: SimNode) -> dict[str, str]:
        """The DaemonSet's hostPath directories -> where they are for this node (SimNode's own layout)."""
        spec = daemonset()["spec"]["template"]["spec"]
        paths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
        where = {
            "exec-dir": "exec",
            "state-dir": "state",
            "run-dir": "run",
            "cni-conf-dir": "cni-conf",
            "cni-bin-dir": "cni-bin",
            "lib-dir": "lib",
            "node-config": ".",
        }
        return {paths[name]: str((node.root / sub).resolve()) for name, sub in where.items()}

    def remap(self, node: SimNode, path: str) -> str:
        for host, mine in sorted(self.host_dirs(node).items(), key=lambda kv: -len(kv[0])):
            if path == host or path.startswith(host + "/"):
                return mine + path[len(host) :]
        return path

    def _write_config(self, node: SimNode) -> None:
        super()._write_config(node)  # the node's dirs, the shipped bridge plugin, the kubeconfig
        settings = configmap_settings()
        for key in ("plugin_dir", "state_dir", "run_dir"):
            settings[key] = self.remap(node, settings[key])
        settings["kubeconfig"] = str(node.root / "kubeconfig")
        settings["cluster_cidrs"] = list(CLUSTER_CIDRS)
        configmap = node.root / "configmap" / "netplugin.yaml"  # as the init container mounts it
        configmap.parent.mkdir()
        configmap.write_text(yaml.safe_dump(settings))
        argv = init_install_argv(lambda p: self.remap(node, p), configmap, sys.executable)
        done = run_install(argv, NETPLUGIN_LIB_PYTHON=sys.executable)
        if done.returncode != 0:
            raise AssertionError(f"the init container's install failed on {node.name}:\n{done.stdout}{done.stderr}")
        assert node.config_path.read_text() == configmap.read_text()

    def daemon_command(self, node: SimNode) -> tuple[list[str], dict[str, str]]:
        c = main_container()
        argv = [*c.get("command", []), *c.get("args", [])]
        assert argv[0] == "netplugin"  # the image's console script: this tree's netplugin here
        inside = ["ip", "netns", "exec", node.netns, sys.executable, "-m", "netplugin"]
        env = {k: v for k, v in self.env.items() if not k.startswith("NETPLUGIN_")}
        env.update(NODE_NAME=node.name, HOST_IP=node.ipv4)
        return [*inside, *(self.remap(node, a) for a in argv[1:])], env

    def start_containerd(self, node: SimNode) -> Containerd:
        ctd = Containerd(
            node.root / "containerd",
            None,
            cni_bin_dir=node.root / "cni-bin",
            cni_conf_dir=node.root / "cni-conf",
            netns=node.netns,
            peers=self.peers,
        )
        self.containerds[node.name] = ctd
        ctd.start()
        ctd.wait_network("netplugin")
        return ctd

    def close_containerds(self) -> None:
        """Remove every sandbox (each CNI DEL reaches the node's daemon, still up), stop each containerd."""
        for ctd in self.containerds.values():
            ctd.close()
        self.containerds.clear()

    def close(self) -> None:
        self.close_containerds()
        super().close()
