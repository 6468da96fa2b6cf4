"""A real 2-node Kubernetes on this machine, with netplugin deployed as a user deploys it.

Everything lives in namespaces this module makes (every name carries the run's tag) and under one
temp dir; nothing of the machine's own network or file system is changed:

``np<tag>u``, "the network" (a netns)
    bridge br0 10.206.0.1/24 fd6e:7031:1a00::1/64 joining the nodes, the control plane (etcd,
    kube-apiserver at 10.206.0.1:6443, the ``kubernetes`` Service's real endpoint,
    kube-controller-manager with every default controller, kube-scheduler) and ``e2e.test``: this
    process enters it (:meth:`Cluster.up`), as an operator's workstation on the node network. Its
    routes to each node's pod CIDRs via the node's address are the network's routing table, what a
    cloud's route table is to real nodes: the API server reaches pod IPs (``pods/proxy``).
``np<tag>n<i>``, node-i (a netns, and a mount namespace of its own)
    eth0 10.206.0.1<i> fd6e:7031:1a00::1<i> on br0. Its mount namespace (held by a small process,
    :data:`_HOLD`) overlays /etc, /opt, /usr/libexec, /var/lib, /var/log and /run with writable
    layers of its own, so every path a node has (the DaemonSet's hostPath dirs /etc/netplugin,
    /opt/cni/bin, /var/lib/netplugin, /run/netns..., the kubelet's /var/lib/kubelet, containerd's
    /var/lib/containerd and /run/containerd) is the node's and not the machine's. The kernel
    settings the kubelet checks at start are files there holding what it wants (they are
    machine-wide sysctls it would otherwise write). containerd 2, kube-proxy (nftables) and the
    kubelet run in both namespaces, with their default paths.

netplugin is not installed by this module: :meth:`Cluster.deploy_netplugin` applies the shipped
``etc/kubernetes`` (ServiceAccount, RBAC, ConfigMap, DaemonSet) through ``kubectl apply -k`` of an
overlay that does what the manifests tell a user to: set the image digest (of the image
``scripts/build-image.sh`` built, imported into each node's containerd as a registry would serve
it) and the cluster's pod CIDRs. The kubelet runs the DaemonSet's pod: the init container installs
the node, the daemon container serves it, and only then does containerd's CNI status, and so the
Node, turn ready. CoreDNS runs as a Deployment behind the ``kube-dns`` Service, on the pod network.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from netplugin.core.netns import setns
from netplugin.frontends.lab.simcluster.cluster import UNDERLAY_V4, UNDERLAY_V6, node_addresses
from netplugin.frontends.lab.simcluster.nsexec import ip, netns_exists
from netplugin.frontends.lab.simcluster.sessions import stop_session
from tests.cluster.kubeletnodes import KERNEL_TUNABLES
from tests.conformance.images import archive_refs
from tests.support.kubeplane import CLUSTER_CIDRS, SERVICE_CIDR, ApiError, ControlPlane

__all__ = ["API_ADDRESS", "BRIDGE_NETWORK", "DNS_IP", "NETWORK_LABEL", "Cluster", "Node"]

REPO = Path(__file__).resolve().parents[2]
API_ADDRESS = str(UNDERLAY_V4.network_address + 1)
#: the ``kubernetes`` Service's cluster IP (the first of the range) and kube-dns's
KUBERNETES_IP = str(ipaddress.ip_network(SERVICE_CIDR).network_address + 1)
DNS_IP = str(ipaddress.ip_network(SERVICE_CIDR).network_address + 10)
CLUSTER_DOMAIN = "cluster.local"
#: the image the shipped DaemonSet names (the kustomization pins it by digest)
NETPLUGIN_IMAGE = "ghcr.io/netplugin/netplugin"
#: the sandbox image the kubelet and containerd expect (the e2e suite's Pause)
PAUSE_IMAGE = "registry.k8s.io/pause:3.10.2"
#: the peers a node and the control plane need
PEERS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy", "kubelet",
         "containerd", "containerd-shim-runc-v2", "ctr", "crictl", "kubectl")  # fmt: skip
#: the machine's directories each node has its own writable layer over (every hostPath lives under one)
OVERLAID = ("/etc", "/opt", "/usr/libexec", "/var/lib", "/var/log", "/run")
#: the node's own plain directories (not overlays: containerd's snapshots cannot live on overlayfs),
#: mounted at these paths; "shared": what is mounted under it reaches the containers that mount it
#: with propagation (the DaemonSet's /run/netns, HostToContainer) and the kubelet's volumes
NODE_DIRS = {
    "/var/lib/containerd": ("containerd", False),
    "/run/containerd": ("run-containerd", False),
    "/var/lib/kubelet": ("kubelet", True),
    "/run/netns": ("netns", True),
}
#: the label saying which network a node runs; netplugin's DaemonSet stays off the nodes labelled
#: :data:`BRIDGE_NETWORK`, whose network is the CNI v1.10 reference bridge (the bench's contender)
NETWORK_LABEL = "network.netplugin.test/provider"
BRIDGE_NETWORK = "cni-bridge"
#: what such a node's /opt/cni/bin gets from the peer build's CNI plugins v1.10
BRIDGE_PLUGINS = ("bridge", "host-local", "portmap")
#: bounds of the waits: generous, for a control plane and two nodes on two shared cores
UP_WITHIN = 240.0

# Held in the node's network namespace: make the node's mount namespace (argv[1]: JSON of the
# overlays, the binds and the tunables), say "ready" and wait to be killed. Everything on the node
# is started in this process's namespaces (nsenter), so the namespace lives as long as it does.
_HOLD = r"""
import json, os, signal, subprocess, sys
spec = json.loads(sys.argv[1])
def mount(*args):
    subprocess.run(["mount", *args], check=True)
mount("--make-rslave", "/")
for target, upper, work in spec["overlays"]:
    mount("-t", "overlay", "overlay", "-o", f"lowerdir={target},upperdir={upper},workdir={work}", target)
for source, target, shared in spec["binds"]:
    os.makedirs(target, exist_ok=True)
    mount("--bind", source, target)
    if shared:
        mount("--make-shared", target)
mount("--make-rprivate", "/proc")
for name, path in spec["tunables"]:
    mount("--bind", path, "/proc/sys/" + name)
print("ready", flush=True)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
while True:
    signal.pause()
"""


def _daemonset_host_paths() -> list[str]:
    """The hostPath directories of the shipped DaemonSet."""
    [ds] = [d for d in yaml.safe_load_all((REPO / "etc/kubernetes/daemonset.yaml").read_text()) if d]
    return [v["hostPath"]["path"] for v in ds["spec"]["template"]["spec"]["volumes"] if "hostPath" in v]


def _log_default(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class Node:
    """One node: its network namespace on the underlay, its mount namespace, and what runs in them."""

    def __init__(self, cluster: Cluster, index: int) -> None:
        self.cluster, self.index = cluster, index
        self.name = f"node-{index}"
        self.netns = f"np{cluster.tag}n{index}"
        self.ipv4, self.ipv6 = node_addresses(index)
        self.root = cluster.root / self.name
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.pod_cidrs: list[str] = []
        #: "netplugin" (its DaemonSet serves the node) or :data:`BRIDGE_NETWORK`
        self.network = "netplugin"

    # --- the namespaces ------------------------------------------------------------------------------

    def make_netns(self) -> None:
        c = self.cluster
        c.add_netns(self.netns)
        c.sysctl(self.netns, "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")
        port = f"np{c.tag}u{self.index}"
        ip("-n", c.underlay, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", self.netns)
        ip("-n", c.underlay, "link", "set", port, "master", "br0", "up")
        ip("-n", self.netns, "link", "set", "eth0", "up")
        ip("-n", self.netns, "addr", "add", f"{self.ipv4}/{UNDERLAY_V4.prefixlen}", "dev", "eth0")
        ip("-n", self.netns, "addr", "add", f"{self.ipv6}/{UNDERLAY_V6.prefixlen}", "dev", "eth0")
        ip("-n", self.netns, "route", "add", "default", "via", API_ADDRESS)
        ip("-n", self.netns, "-6", "route", "add", "default", "via", str(UNDERLAY_V6.network_address + 1))

    def make_mountns(self) -> None:
        self.root.mkdir(mode=0o755)
        overlays = []
        for target in OVERLAID:
            layer = self.root / "layers" / target.strip("/").replace("/", "-")
            (layer / "upper").mkdir(parents=True)
            (layer / "work").mkdir()
            overlays.append((target, str(layer / "upper"), str(layer / "work")))
        binds = []
        for target, (sub, shared) in NODE_DIRS.items():
            (self.root / sub).mkdir()
            binds.append((str(self.root / sub), target, shared))
        # The DaemonSet's hostPath dirs start empty, whatever the machine has there (a CNI config of
        # its own in /etc/cni/net.d would make the node's network ready before netplugin runs).
        for host_path in _daemonset_host_paths():
            if host_path not in NODE_DIRS:
                self.host_dir(host_path).mkdir()
                binds.append((str(self.host_dir(host_path)), host_path, False))
        (self.root / "tunables").mkdir()
        tunables = []
        for name, value in KERNEL_TUNABLES.items():
            path = self.root / "tunables" / name.replace("/", ".")
            path.write_text(f"{value}\n")
            tunables.append((name, str(path)))
        spec = json.dumps({"overlays": overlays, "binds": binds, "tunables": tunables})
        argv = ["nsenter", f"--net=/var/run/netns/{self.netns}", "unshare", "--mount", "--propagation", "unchanged",
                sys.executable, "-c", _HOLD, spec]  # fmt: skip
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
        )
        self.procs["hold"] = proc
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != b"ready":
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            raise RuntimeError(f"{self.name}: its mount namespace could not be made: {err[-2000:]}")

    def host_dir(self, path: str) -> Path:
        """Where the node's ``path`` (one of the DaemonSet's hostPath dirs) lives, as the machine sees it."""
        return self.root / ("host" + path.replace("/", "-"))

    @property
    def hold_pid(self) -> int:
        return self.procs["hold"].pid

    def inside(self, argv: list[str]) -> list[str]:
        """``argv`` run in the node's network and mount namespaces."""
        pid = self.hold_pid
        return ["nsenter", f"--mount=/proc/{pid}/ns/mnt", f"--net=/proc/{pid}/ns/net", "--wd=/", *argv]

    def run(self, argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.inside(argv), capture_output=True, text=True, timeout=timeout, check=False)

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        with open(self.root / f"{name}.log", "ab") as log:
            # Its own session: a Ctrl-C must not stop it before the teardown does, in order.
            proc = subprocess.Popen(
                self.inside(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, start_new_session=True
            )
        self.procs[name] = proc
        return proc

    def log_tail(self, name: str, lines: int = 40) -> str:
        try:
            text = (self.root / f"{name}.log").read_text(errors="replace")
        except OSError:
            return f"(no {name} log)"
        return "\n".join(text.splitlines()[-lines:])

    def check_alive(self, *names: str) -> None:
        for name in names:
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{name} on {self.name} exited ({proc.returncode}):\n{self.log_tail(name)}")

    # --- containerd ----------------------------------------------------------------------------------

    @property
    def containerd_socket(self) -> Path:
        """The node's containerd socket, as the machine sees it (the node's /run/containerd is this dir)."""
        return self.root / "run-containerd" / "containerd.sock"

    def containerd_config(self) -> str:
        images, runtime = 'plugins."io.containerd.cri.v1.images"', 'plugins."io.containerd.cri.v1.runtime"'
        return f"""version = 3
# NRI's socket would be the node's, but nothing here uses it
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.nri.v1.nri"]
[{images}.pinned_images]
  sandbox = "{PAUSE_IMAGE}"
[{runtime}]
  # root here lacks CAP_SYS_RESOURCE: runc cannot lower a sandbox's oom_score_adj
  restrict_oom_score_adj = true
  [{runtime}.cni]
    bin_dirs = ["/opt/cni/bin"]
    conf_dir = "/etc/cni/net.d"
    max_conf_num = 1
    # lo comes up without a loopback plugin binary: /opt/cni/bin holds only what netplugin installs
    use_internal_loopback = true
  [{runtime}.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
"""

    def start_containerd(self) -> None:
        peers = self.cluster.peers
        config = self.root / "containerd.toml"
        config.write_text(self.containerd_config())
        env = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_")}
        # its shim, the one built with it, from PATH
        env["PATH"] = f"{peers}:{env.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
        self.spawn("containerd", [str(peers / "containerd"), "--config", str(config)], env=env)
        deadline = time.monotonic() + 60
        while self.ctr("version").returncode != 0:
            self.check_alive("containerd")
            if time.monotonic() > deadline:
                raise RuntimeError(f"containerd on {self.name} did not answer:\n{self.log_tail('containerd')}")
            time.sleep(0.2)

    def ctr(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        argv = [str(self.cluster.peers / "ctr"), "--address", str(self.containerd_socket), "-n", "k8s.io", *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)

    def import_image(self, archive: Path) -> None:
        done = self.ctr("images", "import", str(archive))
        if done.returncode != 0:
            raise RuntimeError(f"importing {archive.name} into {self.name}'s containerd: {done.stderr[-2000:]}")

    def name_by_digest(self, ref: str) -> str:
        """``repo@digest`` for image ``ref`` (repo:tag), the name a pull by digest gives an image, which
        the CRI resolves a digest reference by; the digest."""
        digest = self.image_digest(ref)
        done = self.ctr("images", "tag", "--force", ref, f"{ref.rsplit(':', 1)[0]}@{digest}")
        if done.returncode != 0:
            raise RuntimeError(f"naming {ref} by its digest on {self.name}: {done.stderr}")
        return digest

    def image_digest(self, ref: str) -> str:
        done = self.ctr("images", "ls", f"name=={ref}")
        lines = done.stdout.splitlines()[1:]
        if done.returncode != 0 or not lines:
            raise RuntimeError(f"{ref} is not in {self.name}'s containerd: {done.stderr}")
        return next(f for f in lines[0].split() if f.startswith("sha256:"))

    # --- kube-proxy and kubelet ----------------------------------------------------------------------

    def start_kube_proxy(self) -> None:
        plane = self.cluster.plane
        kubeconfig = plane.write_kubeconfig(self.root / "kube-proxy.kubeconfig", cert="kube-proxy")
        argv = [
            str(self.cluster.peers / "kube-proxy"), f"--kubeconfig={kubeconfig}", "--proxy-mode=nftables",
            f"--hostname-override={self.name}", f"--cluster-cidr={','.join(CLUSTER_CIDRS)}",
            # the conntrack sysctls are the machine's: leave them alone
            "--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0s",
            "--conntrack-tcp-timeout-close-wait=0s",
            # the node's own loopback (each node is a netns of its own)
            "--metrics-bind-address=127.0.0.1:10249", "--healthz-bind-address=127.0.0.1:10256",
        ]  # fmt: skip
        self.spawn("kube-proxy", argv)

    def kubelet_config(self) -> dict[str, Any]:
        """The KubeletConfiguration: default paths (the node's own), and what two kubelets sharing one
        machine's cgroups and sysctls need (tests/cluster/kubeletnodes.py says why for each)."""
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
            "cgroupDriver": "cgroupfs",
            "failCgroupV1": False,
            "cgroupsPerQOS": False,
            "enforceNodeAllocatable": ["none"],
            "failSwapOn": False,
            "protectKernelDefaults": True,
            "healthzBindAddress": "127.0.0.1",
            "readOnlyPort": 0,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(self.cluster.plane.pki / "ca.crt")},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "clusterDNS": [DNS_IP],
            "clusterDomain": CLUSTER_DOMAIN,
            "nodeStatusUpdateFrequency": "4s",
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "1Mi",
                "nodefs.available": "1%",
                "nodefs.inodesFree": "1%",
                "imagefs.available": "1%",
            },
            **({"maxPods": self.cluster.max_pods} if self.cluster.max_pods is not None else {}),
        }

    def start_kubelet(self) -> None:
        plane = self.cluster.plane
        config = self.root / "kubelet-config.json"  # JSON is YAML: the kubelet reads it as is
        config.write_text(json.dumps(self.kubelet_config(), indent=1))
        kubeconfig = plane.node_kubeconfig(self.root / "kubelet.kubeconfig", self.name)
        argv = [
            str(self.cluster.peers / "kubelet"), f"--config={config}", f"--kubeconfig={kubeconfig}",
            f"--hostname-override={self.name}", f"--node-ip={self.ipv4},{self.ipv6}", "--v=2",
            f"--node-labels={NETWORK_LABEL}={self.network}",
        ]  # fmt: skip
        self.spawn("kubelet", argv)

    def install_bridge_network(self) -> None:
        """The CNI v1.10 reference as this node's network, as a user of the plain CNI plugins sets it up:
        bridge (gateway, masquerade, hairpin) with host-local over the Node's pod CIDRs, then portmap
        (the runtime's hostPorts): the same jobs netplugin's shipped chain does on its nodes."""
        bins = self.host_dir("/opt/cni/bin")
        for plugin in BRIDGE_PLUGINS:
            shutil.copy2(self.cluster.peers / "cni" / plugin, bins / plugin)
        conflist = {
            "cniVersion": "1.0.0",
            "name": "cni-bridge",
            "plugins": [
                {"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": True, "hairpinMode": True,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": c}] for c in self.pod_cidrs],
                          "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]}},
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }  # fmt: skip
        (self.host_dir("/etc/cni/net.d") / "10-bridge.conflist").write_text(json.dumps(conflist, indent=1))

    # --- leaving -------------------------------------------------------------------------------------

    def _processes(self) -> set[int]:
        """Every process in the node's namespaces, and every descendant of one (containers)."""
        try:
            mnt = os.stat(f"/proc/{self.hold_pid}/ns/mnt").st_ino
        except (OSError, KeyError):
            mnt = None
        try:
            net = os.stat(f"/var/run/netns/{self.netns}").st_ino
        except OSError:
            net = None
        parents: dict[int, int] = {}
        mine: set[int] = set()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
                parents[pid] = int(stat.rsplit(")", 1)[1].split()[1])
                if os.stat(f"/proc/{pid}/ns/mnt").st_ino == mnt or os.stat(f"/proc/{pid}/ns/net").st_ino == net:
                    mine.add(pid)
            except (OSError, ValueError, IndexError):
                continue
        grew = True
        while grew:
            more = {p for p, pp in parents.items() if pp in mine and p not in mine}
            mine |= more
            grew = bool(more)
        mine.discard(os.getpid())
        return mine

    def kill_all_but_hold(self) -> None:
        """SIGKILL every process of the node (containers, shims, what its daemons left) but the holder
        of its mount namespace, until none is left."""
        hold = self.procs.get("hold")
        for _ in range(50):
            pids = self._processes() - ({hold.pid} if hold is not None else set())
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)

    def stop(self) -> None:
        """Stop the kubelet (nothing restarts a pod), kube-proxy and containerd, then kill what is left
        in the node's namespaces (containers, shims): the mount namespace goes with its last process."""
        for name in ("kubelet", "kube-proxy", "containerd"):
            proc = self.procs.pop(name, None)
            if proc is not None:
                stop_session(proc, grace=20.0)
        self.kill_all_but_hold()
        hold = self.procs.pop("hold", None)
        if hold is not None:
            stop_session(hold, grace=10.0)


class Cluster:
    """The control plane in the underlay namespace and ``nodes`` nodes; a context manager."""

    def __init__(
        self,
        peers: Path,
        image_archives: list[Path],
        netplugin_archive: Path,
        *,
        nodes: int = 2,
        bridge_nodes: int = 0,
        max_pods: int | None = None,
        coredns: bool = True,
        root: Path | None = None,
        log: Callable[[str], None] = _log_default,
    ) -> None:
        """``bridge_nodes``: how many of the last nodes run the CNI v1.10 bridge instead of netplugin;
        ``max_pods``: the kubelets' maxPods (default: the kubelet's, 110); ``coredns``: deploy it."""
        self.peers = peers
        self.image_archives = image_archives
        self.netplugin_archive = netplugin_archive
        self.tag = secrets.token_hex(3)
        self.underlay = f"np{self.tag}u"
        self.root = root or Path(tempfile.mkdtemp(prefix=f"netplugin-conformance-{self.tag}-"))
        os.chmod(self.root, 0o755)
        self.log = log
        self.max_pods = max_pods
        self.coredns = coredns
        self.nodes = [Node(self, i) for i in range(1, nodes + 1)]
        for node in self.nodes[nodes - bridge_nodes :]:
            node.network = BRIDGE_NETWORK
        self.plane = ControlPlane(
            self.root / "plane", peers, san_ips=(KUBERNETES_IP,), for_kubelets=True, address=API_ADDRESS,
            all_controllers=True,
        )  # fmt: skip
        self._netns: list[str] = []
        self._home_netns: int | None = None
        self.admin_kubeconfig = self.root / "admin.kubeconfig"
        self.timings: dict[str, float] = {}

    # --- namespaces ----------------------------------------------------------------------------------

    def add_netns(self, name: str) -> None:
        ip("netns", "add", name)
        self._netns.append(name)
        ip("-n", name, "link", "set", "lo", "up")
        self.sysctl(name, "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0")

    @staticmethod
    def sysctl(netns: str, *settings: str) -> None:
        done = subprocess.run(
            ["ip", "netns", "exec", netns, "sysctl", "-qw", *settings], capture_output=True, text=True, timeout=20
        )
        if done.returncode != 0:
            raise RuntimeError(f"sysctl {settings} in {netns}: {done.stderr}")

    def _make_underlay(self) -> None:
        u = self.underlay
        self.add_netns(u)
        ip("-n", u, "link", "add", "br0", "type", "bridge")
        ip("-n", u, "link", "set", "br0", "up")
        ip("-n", u, "addr", "add", f"{API_ADDRESS}/{UNDERLAY_V4.prefixlen}", "dev", "br0")
        ip("-n", u, "addr", "add", f"{UNDERLAY_V6.network_address + 1}/{UNDERLAY_V6.prefixlen}", "dev", "br0")
        # This process (the main thread; nothing else runs yet) moves onto the node network: what it
        # starts from now on (the control plane, e2e.test) is there too.
        self._home_netns = os.open("/proc/self/ns/net", os.O_RDONLY)
        fd = os.open(f"/var/run/netns/{u}", os.O_RDONLY)
        try:
            setns(fd)
        finally:
            os.close(fd)

    # --- bring-up ------------------------------------------------------------------------------------

    def __enter__(self) -> Cluster:
        try:
            self.up()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _timed(self, what: str, start: float) -> None:
        self.timings[what] = round(time.monotonic() - start, 1)
        self.log(f"cluster: {what} in {self.timings[what]:g} s")

    def up(self) -> None:
        start = time.monotonic()
        self._make_underlay()
        self.plane.start()
        self.plane.write_kubeconfig(self.admin_kubeconfig, cert="admin")
        self._timed("control plane up", start)
        for node in self.nodes:
            t = time.monotonic()
            node.make_netns()
            node.make_mountns()
            node.start_containerd()
            for archive in [*self.image_archives, self.netplugin_archive]:
                node.import_image(archive)
            node.start_kubelet()
            self._timed(f"{node.name}: containerd, images, kubelet started", t)
        t = time.monotonic()
        for node in self.nodes:
            node.pod_cidrs = self.wait_pod_cidrs(node)
            # kube-proxy once its Node exists (it reads the node's addresses from it): the daemon of
            # netplugin's DaemonSet reaches the API server through the kubernetes Service, as any pod
            node.start_kube_proxy()
            for cidr in node.pod_cidrs:
                via = node.ipv4 if ipaddress.ip_network(cidr).version == 4 else node.ipv6
                ip("route", "add", cidr, "via", via)
            if node.network == BRIDGE_NETWORK:
                node.install_bridge_network()
            # before netplugin runs, containerd's CNI status fails, and the kubelet says so
            self.log(f"cluster: {node.name} registered, pod CIDRs {node.pod_cidrs}: {self.ready_condition(node)}")
        self._timed("nodes registered", t)
        t = time.monotonic()
        self.deploy_netplugin()
        self.wait_nodes_ready()
        self.wait_system_pods_ready()
        self._timed("netplugin's DaemonSet running and every Node Ready", t)
        if self.coredns:
            t = time.monotonic()
            self.deploy_coredns()
            self.wait_system_pods_ready()
            self._timed("CoreDNS ready", t)
        self.timings["cluster up"] = round(time.monotonic() - start, 1)

    def kubectl(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = [str(self.peers / "kubectl"), f"--kubeconfig={self.admin_kubeconfig}", *args]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if check and done.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {done.stderr[-3000:]}")
        return done

    def wait_pod_cidrs(self, node: Node) -> list[str]:
        def allocated() -> list[str]:
            node.check_alive("containerd", "kubelet")
            with contextlib.suppress(ApiError):
                obj = self.plane.request("GET", f"/api/v1/nodes/{node.name}")
                return list(obj["spec"].get("podCIDRs") or [])
            return []

        return list(self.plane.wait_for(f"Node {node.name} registered with podCIDRs", allocated, UP_WITHIN))

    def ready_condition(self, node: Node) -> dict[str, Any]:
        obj = self.plane.request("GET", f"/api/v1/nodes/{node.name}")
        conditions = obj.get("status", {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == "Ready"), {})

    # --- netplugin, as a user deploys it -------------------------------------------------------------

    def netplugin_overlay(self, digest: str) -> Path:
        """A kustomization over the shipped etc/kubernetes: the image's digest and the pod CIDRs set,
        the two things its comments tell a user to set; nothing else changed."""
        d = self.root / "deploy"
        d.mkdir()
        [cm] = [doc for doc in yaml.safe_load_all((REPO / "etc/kubernetes/configmap.yaml").read_text()) if doc]
        text = cm["data"]["netplugin.yaml"]
        cidrs = ", ".join(f'"{c}"' for c in CLUSTER_CIDRS)
        changed, n = re.subn(r"(?m)^cluster_cidrs: .*$", f"cluster_cidrs: [{cidrs}]", text)
        if n != 1:
            raise RuntimeError("the shipped ConfigMap's netplugin.yaml has no cluster_cidrs line to set")
        patch = {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": cm["metadata"]["name"], "namespace": cm["metadata"]["namespace"]},
                 "data": {"netplugin.yaml": changed}}  # fmt: skip
        (d / "configmap-patch.yaml").write_text(yaml.safe_dump(patch))
        patches = [{"path": "configmap-patch.yaml"}]
        if any(node.network == BRIDGE_NETWORK for node in self.nodes):
            # not part of a user's deployment: the cluster's nodes whose network is the reference
            (d / "daemonset-patch.yaml").write_text(yaml.safe_dump(self._off_bridge_nodes()))
            patches.append({"path": "daemonset-patch.yaml"})
        kustomization = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [os.path.relpath(REPO / "etc" / "kubernetes", d)],
            "images": [{"name": NETPLUGIN_IMAGE, "digest": digest}],
            "patches": patches,
        }
        (d / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        return d

    @staticmethod
    def _off_bridge_nodes() -> dict[str, Any]:
        """A patch keeping the shipped DaemonSet off the nodes whose network is the CNI bridge."""
        [ds] = [d for d in yaml.safe_load_all((REPO / "etc/kubernetes/daemonset.yaml").read_text()) if d]
        term = {"matchExpressions": [{"key": NETWORK_LABEL, "operator": "NotIn", "values": [BRIDGE_NETWORK]}]}
        return {
            "apiVersion": ds["apiVersion"], "kind": ds["kind"],
            "metadata": {"name": ds["metadata"]["name"], "namespace": ds["metadata"]["namespace"]},
            "spec": {"template": {"spec": {"affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}}}},
        }  # fmt: skip

    def deploy_netplugin(self) -> None:
        digests = {node.name: node.name_by_digest(f"{NETPLUGIN_IMAGE}:{self.netplugin_tag}") for node in self.nodes}
        if len(set(digests.values())) != 1:
            raise RuntimeError(f"the netplugin image differs between the nodes: {digests}")
        overlay = self.netplugin_overlay(next(iter(digests.values())))
        self.log(f"cluster: kubectl apply -k {overlay} (etc/kubernetes, image {NETPLUGIN_IMAGE}@{digests})")
        out = self.kubectl("apply", "-k", str(overlay)).stdout
        self.log("\n".join(f"  {line}" for line in out.splitlines()))

    @property
    def netplugin_tag(self) -> str:
        [ref] = archive_refs(self.netplugin_archive)
        return ref.rsplit(":", 1)[1]

    def wait_nodes_ready(self) -> None:
        def ready() -> bool:
            for node in self.nodes:
                node.check_alive("containerd", "kube-proxy", "kubelet")
            nodes = self.plane.objects("Node")
            ok = [
                n for n in nodes
                if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions") or [])
                and not (n["spec"].get("taints") or [])
            ]  # fmt: skip
            return len(ok) == len(self.nodes)

        self.plane.wait_for("every Node Ready and untainted", ready, UP_WITHIN)

    # --- CoreDNS -------------------------------------------------------------------------------------

    def deploy_coredns(self) -> None:
        text = (Path(__file__).with_name("coredns.yaml")).read_text()
        text = text.replace("@DNS_IP@", DNS_IP).replace("@DOMAIN@", CLUSTER_DOMAIN)
        path = self.root / "coredns.yaml"
        path.write_text(text)
        self.kubectl("apply", "-f", str(path))

    def wait_system_pods_ready(self) -> None:
        def ready() -> bool:
            pods = self.plane.objects("Pod", "kube-system")
            return bool(pods) and all(
                any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or [])
                for p in pods
            )

        self.plane.wait_for("every kube-system Pod Ready", ready, UP_WITHIN)

    # --- looking -------------------------------------------------------------------------------------

    def describe(self) -> str:
        """What the cluster runs (for the log): nodes, kube-system pods."""
        return self.kubectl("get", "nodes,pods", "-A", "-o", "wide", check=False).stdout

    def collect_logs(self, dest: Path) -> None:
        """Every component's log into ``dest`` (the report dir): the control plane's and each node's."""
        dest.mkdir(parents=True, exist_ok=True)
        for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"):
            src = self.plane.root / f"{name}.log"
            if src.exists():
                shutil.copy(src, dest / f"{name}.log")
        for node in self.nodes:
            for name in ("containerd", "kube-proxy", "kubelet"):
                src = node.root / f"{name}.log"
                if src.exists():
                    shutil.copy(src, dest / f"{node.name}-{name}.log")
            pods = node.root / "layers" / "var-log" / "upper" / "pods"
            if pods.is_dir():
                shutil.copytree(pods, dest / f"{node.name}-pods", dirs_exist_ok=True, symlinks=True)

    # --- teardown ------------------------------------------------------------------------------------

    def close(self) -> None:
        for node in reversed(self.nodes):
            with contextlib.suppress(Exception):
                node.stop()
        self.plane.close()
        if self._home_netns is not None:
            setns(self._home_netns)
            os.close(self._home_netns)
            self._home_netns = None
        for name in reversed(self._netns):
            if netns_exists(name):
                ip("netns", "del", name, check=False)
        self._netns.clear()
        shutil.rmtree(self.root, ignore_errors=True)
