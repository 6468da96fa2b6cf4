"""Real nodes on one machine: each a network namespace with containerd 2, netplugin as the DaemonSet
installs it, and a kubelet that registers its Node with the real control plane (:mod:`kubeplane`).

A node joins the way a real one does (:meth:`KubeletCluster.join`): the init container's install
(:class:`ShippedNodes`: the ConfigMap's ``netplugin.yaml``, the conflist, the compiled shim), then
containerd 2 inside the node's namespace, then the kubelet, which registers the Node (the
controller-manager gives it its pod CIDRs) and reports it NotReady while the runtime's network is not
ready: containerd asks the CNI plugin's ``STATUS``, which fails until netplugin's daemon runs. Then
the daemon (the DaemonSet container's command), after which the kubelet reports the node Ready and
the node lifecycle controller lifts its not-ready taint: only then does the scheduler place pods.

Everything the kubelet writes stays inside the test's namespaces and temp dirs:

* ``--root-dir`` and ``--cert-dir`` under the node's temp root, ``podLogsDir`` too; the volume plugin
  dir (default /usr/libexec/...) under it as well.
* The kubelet runs in a mount namespace of its own (``unshare --mount``), where ``/var/log`` and
  ``/var/lib`` are temp dirs (:data:`FIXED_DIRS`: it writes there whatever its flags say), and
  where the kernel settings it checks at start (:data:`KERNEL_TUNABLES`) are files holding the
  values it wants: those are machine-wide sysctls, which it would otherwise write.
  ``protectKernelDefaults`` makes it only read them. Its root dir is a shared mount, so the volumes
  it mounts there (a pod's service-account token) reach containerd, which runs in the machine's
  mount namespace.
* ``cgroupsPerQOS: false``: two kubelets share this machine's cgroups, so neither builds a
  ``kubepods`` hierarchy; containerd puts each container in a cgroup of its own, removed with it.
  The cgroups are v1 (hybrid) here, which kubelet 1.37 refuses unless ``failCgroupV1: false``.

:meth:`KubeletCluster.close` stops the kubelets first (nothing restarts a pod), then removes every
sandbox through containerd (each CNI DEL reaches the node's daemon), then unmounts what the kubelets
mounted, then removes the namespaces and the temp dirs.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from netplugin.frontends.lab.simcluster.cluster import SimNode
from netplugin.frontends.lab.simcluster.sessions import stop_session
from tests.cluster.kubecluster import KubeCluster
from tests.cluster.shippednodes import ShippedNodes
from tests.frontends.cni.containerd import NETNS_DIR, image_archive
from tests.support.kubeplane import ApiError, ControlPlane
from tests.support.waits import wait_for

__all__ = ["KUBELET_PEERS", "WEB_IMAGE", "KubeletCluster"]

#: the peers a kubelet node needs besides the control plane's (paths under the peer dir)
KUBELET_PEERS = ("kubelet", "kube-scheduler", "containerd", "ctr", "containerd-shim-runc-v2", "cni/loopback", "crictl")
#: the pods' image: busybox-static with a shell, httpd and nc, imported into each containerd
WEB_IMAGE = "localhost/netplugin-test-web:1"
#: the machine-wide settings kubelet checks at start (setupKernelTunables in
#: pkg/kubelet/cm/container_manager_linux.go), with the values it wants, as /proc/sys paths
KERNEL_TUNABLES = {
    "vm/overcommit_memory": 1,
    "vm/panic_on_oom": 0,
    "kernel/panic": 10,
    "kernel/panic_on_oops": 1,
    "kernel/keys/root_maxkeys": 1000000,
    "kernel/keys/root_maxbytes": 25000000,
}
#: bounds of the waits below: generous, for two kubelets and a control plane on two shared cores
JOIN_TIMEOUT = 120.0

#: the fixed paths the kubelet writes whatever its flags say, each made a temp dir (of the node's
#: root) in its mount namespace: /var/log/containers (the log symlinks), and
#: /var/lib/kubelet/device-plugins/kubelet.sock (the device plugin API's socket)
FIXED_DIRS = {"/var/log": "var-log", "/var/lib": "var-lib"}

# Run in the kubelet's own mount namespace (``unshare --mount --propagation unchanged``), then exec
# the kubelet: argv is TUNABLES_DIR (SOURCE TARGET)... -- KUBELET [ARGS...]. The root mount and /proc
# are made private first, so that nothing mounted here reaches the machine's namespace.
_LAUNCH = r"""
import os, subprocess, sys
end = sys.argv.index("--")
tunables, binds, argv = sys.argv[1], sys.argv[2:end], sys.argv[end + 1:]
def mount(*args):
    subprocess.run(["mount", *args], check=True)
mount("--make-private", "/")
mount("--make-rprivate", "/proc")
for name in sorted(os.listdir(tunables)):
    mount("--bind", os.path.join(tunables, name), "/proc/sys/" + name.replace(".", "/"))
for source, target in zip(binds[::2], binds[1::2]):
    mount("--bind", source, target)
os.execv(argv[0], argv)
"""


def _mounts_under(path: Path) -> list[str]:
    """The mount points at or under ``path`` in this mount namespace, deepest first."""
    prefix = str(path)
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    mine = [p for p in points if p == prefix or p.startswith(prefix + "/")]
    return sorted(mine, key=len, reverse=True)


class KubeletCluster(ShippedNodes, KubeCluster):
    """Nodes with containerd 2, netplugin installed as shipped, and a kubelet, against ``plane``."""

    def __init__(self, plane: ControlPlane, peers: Path) -> None:
        super().__init__(plane, peers=peers, bookmark_interval=0.5)
        self.kubelets: dict[str, subprocess.Popen[bytes]] = {}
        #: each Node's Ready condition while its daemon was not yet running (see join)
        self.not_ready: dict[str, dict[str, Any]] = {}

    # --- a node joins ------------------------------------------------------------------------------

    def join(self) -> SimNode:
        """The next node, joined as described in the module docstring; Ready when this returns."""
        node = self.add_node(start=False, register=False)  # its netns, and the init container's install
        self.start_containerd(node)
        self.import_web_image(node)
        self.start_kubelet(node)
        node.pod_cidrs = tuple(self.wait_pod_cidrs(node.name, JOIN_TIMEOUT))
        self.not_ready[node.name] = self.wait_ready(node, "False")
        self.start_daemon(node)
        self.wait_ready(node, "True")
        return node

    def import_web_image(self, node: SimNode) -> None:
        archive = node.root / "web-image.tar"
        image_archive(WEB_IMAGE, archive, ["/bin/sh"], ("sh", "httpd", "nc", "tail", "cat", "mkdir", "echo", "printf"))
        self.containerds[node.name].import_image(archive)

    def kubelet_dir(self, node: SimNode) -> Path:
        return node.root / "kubelet"

    def kubelet_log(self, node: SimNode, lines: int = 40) -> str:
        try:
            text = (node.root / "kubelet.log").read_text(errors="replace")
        except OSError:
            return "(no kubelet log)"
        return "\n".join(text.splitlines()[-lines:])

    def kubelet_config(self, node: SimNode) -> dict[str, Any]:
        """The node's KubeletConfiguration (see the module docstring for the why of each unusual key)."""
        ctd = self.containerds[node.name]
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "containerRuntimeEndpoint": f"unix://{ctd.socket}",
            "cgroupDriver": "cgroupfs",
            "failCgroupV1": False,
            "cgroupsPerQOS": False,
            "enforceNodeAllocatable": ["none"],
            "failSwapOn": False,
            "protectKernelDefaults": True,
            "podLogsDir": str(node.root / "pod-logs"),
            "volumePluginDir": str(self.kubelet_dir(node) / "volume-plugins"),
            # its API on the node's own address, health on the node's own loopback (its netns)
            "address": node.ipv4,
            "healthzBindAddress": "127.0.0.1",
            "readOnlyPort": 0,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(self.plane.pki / "ca.crt")},
            },
            "authorization": {"mode": "AlwaysAllow"},
            # a Ready change is posted within this (the default is 10 s)
            "nodeStatusUpdateFrequency": "2s",
            # the machine's disk is shared with everything else: neither evict nor collect images for it
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "1Mi",
                "nodefs.available": "1%",
                "nodefs.inodesFree": "1%",
                "imagefs.available": "1%",
            },
        }

    def start_kubelet(self, node: SimNode) -> subprocess.Popen[bytes]:
        kdir = self.kubelet_dir(node)
        binds = [a for target, sub in FIXED_DIRS.items() for a in (str(node.root / sub), target)]
        for d in (kdir, node.root / "pod-logs", node.root / "tunables", *(node.root / s for s in FIXED_DIRS.values())):
            d.mkdir(mode=0o755)
        for path, value in KERNEL_TUNABLES.items():
            (node.root / "tunables" / path.replace("/", ".")).write_text(f"{value}\n")
        # A shared mount: what the kubelet mounts under it (in its own namespace) reaches containerd.
        subprocess.run(["mount", "--bind", str(kdir), str(kdir)], check=True, timeout=30)
        subprocess.run(["mount", "--make-shared", str(kdir)], check=True, timeout=30)
        config = node.root / "kubelet-config.json"  # JSON is YAML: the kubelet reads it as is
        config.write_text(json.dumps(self.kubelet_config(node), indent=1))
        kubeconfig = self.plane.node_kubeconfig(node.root / "kubelet.kubeconfig", node.name, server=self.api_url)
        kubelet = [
            str(self.plane.peers / "kubelet"), f"--config={config}", f"--kubeconfig={kubeconfig}",
            f"--root-dir={kdir}", f"--cert-dir={kdir / 'pki'}", f"--hostname-override={node.name}",
            f"--node-ip={node.ipv4},{node.ipv6}", "--v=2",
        ]  # fmt: skip
        argv = [
            "nsenter", f"--net={NETNS_DIR}/{node.netns}", "unshare", "--mount", "--propagation", "unchanged",
            sys.executable, "-c", _LAUNCH, str(node.root / "tunables"), *binds, "--", *kubelet,
        ]  # fmt: skip
        with open(node.root / "kubelet.log", "ab") as log:
            # Its own session: a Ctrl-C of pytest must not stop it before close() runs.
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        self.kubelets[node.name] = proc
        return proc

    def node_object(self, name: str) -> dict[str, Any] | None:
        with contextlib.suppress(ApiError):
            obj: dict[str, Any] = self.plane.request("GET", f"/api/v1/nodes/{name}")
            return obj
        return None

    def wait_ready(self, node: SimNode, status: str, timeout: float = JOIN_TIMEOUT) -> dict[str, Any]:
        """The Node's Ready condition once its status is ``status`` (and, for "True", its taints gone)."""
        seen: dict[str, Any] = {}  # the last Ready condition and taints, for the failure

        def ready() -> dict[str, Any] | None:
            proc = self.kubelets[node.name]
            if proc.poll() is not None:
                raise AssertionError(
                    f"the kubelet of {node.name} exited ({proc.returncode}):\n{self.kubelet_log(node)}"
                )
            obj = self.node_object(node.name) or {}
            conditions = (obj.get("status") or {}).get("conditions") or []
            cond = next((c for c in conditions if c["type"] == "Ready"), None)
            taints = (obj.get("spec") or {}).get("taints") or []
            seen.update(ready=cond, taints=taints)
            if cond is not None and cond["status"] == status and (status != "True" or not taints):
                return dict(cond)
            return None

        return wait_for(
            ready,
            f"Node {node.name}: Ready {status} (and untainted)",
            timeout,
            detail=lambda: f"last seen: {seen}\nkubelet log:\n{self.kubelet_log(node)}",
            interval=0.2,
        )

    # --- leaving -----------------------------------------------------------------------------------

    def stop_kubelets(self) -> None:
        for proc in self.kubelets.values():
            stop_session(proc, grace=30.0)
        self.kubelets.clear()

    def unmount_kubelets(self) -> None:
        """Unmount what the kubelets mounted (pods' volumes) and their shared root-dir mounts; every
        one is tried, and any that stays mounted fails the close."""
        failed = []
        for node in self.nodes.values():
            for point in _mounts_under(self.kubelet_dir(node)):
                done = subprocess.run(["umount", "-l", point], timeout=30, capture_output=True, text=True)
                if done.returncode != 0 and point in _mounts_under(self.kubelet_dir(node)):
                    failed.append(f"{point}: {done.stderr.strip()}")
        assert failed == [], f"left mounted: {failed}"

    def close(self) -> None:
        try:
            self.stop_kubelets()
            self.close_containerds()
        finally:
            self.unmount_kubelets()
            super().close()
