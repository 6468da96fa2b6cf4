"""A private containerd (Debian's 1.6, or 2.x from the peer build) that tests drive as the kubelet does, over CRI v1.

Nothing is installed here: CI's ``scripts/install-deps.sh --test`` installs ``containerd``,
``runc``, ``busybox-static`` and the Python ``grpcio``/``grpcio-tools``. :func:`unavailable_reason`
says what is missing, and the suite skips with that reason on a machine without them.

One :class:`Containerd` per test session, all under one temp dir: its own config, root, state,
gRPC/ttrpc/debug sockets and runc root, never the system service. Its CRI plugin's ``bin_dir``
holds the ``loopback`` plugin (the CRI plugin runs it first for every sandbox) and the shim under
test; ``conf_dir`` holds the one conflist of the current test (``max_conf_num = 1``).
``sandbox_image`` is a pause image built here from busybox-static (its entrypoint sleeps) and
imported with ``ctr -n k8s.io images import``: no registry is needed.

Facts this relies on (containerd 1.6.20, Debian 12):

* ``restrict_oom_score_adj = true``: the CRI plugin asks runc for ``oomScoreAdj: -998`` on a
  sandbox, which fails without CAP_SYS_RESOURCE ("can't get final child's PID from pipe").
* The CRI plugin reloads ``conf_dir`` within about a second of a change; ``Status(verbose)``
  ``info["cniconfig"]`` lists the networks loaded now, so :meth:`Containerd.use_network` waits on it.
* Network namespaces are ``/var/run/netns/cni-<uuid>`` and shim sockets ``/run/containerd/s/<hash>``
  whatever the config says; ``containerd-shim-runc-v2`` processes outlive containerd, so
  :meth:`Containerd.close` finds them by the ``-address <our socket>`` in their argv and kills only those.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

PAUSE_IMAGE = "localhost/netplugin-test-pause:1"
BUSYBOX = "/bin/busybox"
CNI_PLUGIN_DIRS = ("/usr/lib/cni", "/opt/cni/bin")
PROTO = Path(__file__).with_name("cri_v1_subset.proto")
NETNS_DIR = "/var/run/netns"


def _run(argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def loopback_plugin() -> str | None:
    for d in CNI_PLUGIN_DIRS:
        path = os.path.join(d, "loopback")
        if os.access(path, os.X_OK):
            return path
    return None


@functools.cache
def unavailable_reason() -> str | None:
    """Why the containerd suite cannot run on this machine, or None."""
    if os.geteuid() != 0:
        return "containerd tests need root"
    for tool in ("containerd", "ctr", "containerd-shim-runc-v2", "runc", "ip"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (scripts/install-deps.sh --test installs it)"
    if not os.path.isfile(BUSYBOX):
        return f"{BUSYBOX} is missing (apt-get install busybox-static)"
    if loopback_plugin() is None:
        return f"the CNI loopback plugin is not in {' or '.join(CNI_PLUGIN_DIRS)} (containernetworking-plugins)"
    for mod in ("grpc", "grpc_tools"):
        try:
            importlib.import_module(mod)
        except ImportError:
            return f"python module {mod} is missing (pip install grpcio grpcio-tools)"
    return None


# --- CRI v1 stubs ------------------------------------------------------------------------------------


def cri_modules(out_dir: Path) -> tuple[ModuleType, ModuleType]:
    """Compile ``cri_v1_subset.proto`` into ``out_dir`` and import (messages, service stubs)."""
    from grpc_tools import protoc

    out_dir.mkdir(parents=True, exist_ok=True)
    argv = ["protoc", f"-I{PROTO.parent}", f"--python_out={out_dir}", f"--grpc_python_out={out_dir}", str(PROTO)]
    if protoc.main(argv) != 0:
        raise RuntimeError(f"protoc failed on {PROTO}")
    sys.path.insert(0, str(out_dir))
    try:
        pb = importlib.import_module("cri_v1_subset_pb2")
        pbg = importlib.import_module("cri_v1_subset_pb2_grpc")
    finally:
        sys.path.remove(str(out_dir))
    return pb, pbg


# --- the pause image ---------------------------------------------------------------------------------


def _tar_member(t: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 0
    t.addfile(info, io.BytesIO(data))


def pause_archive(ref: str, path: Path) -> None:
    """A docker-archive image ``ref``: busybox-static whose entrypoint sleeps for ever."""
    image_archive(ref, path, ["/bin/sleep", "2147483647"], ("sh", "sleep"))


def image_archive(
    ref: str, path: Path, entrypoint: list[str], applets: tuple[str, ...], files: dict[str, bytes] | None = None
) -> None:
    """A docker-archive image ``ref`` of busybox-static, its ``applets`` linked in /bin, and ``files``."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w", format=tarfile.PAX_FORMAT) as t:
        dirs = {"bin"} | {os.path.dirname(name) for name in files or {}}
        for name in sorted(d for d in dirs if d):
            d = tarfile.TarInfo(name)
            d.type, d.mode = tarfile.DIRTYPE, 0o755
            t.addfile(d)
        _tar_member(t, "bin/busybox", Path(BUSYBOX).read_bytes(), 0o755)
        for applet in applets:
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            t.addfile(link)
        for name, data in (files or {}).items():
            _tar_member(t, name, data)
    layer_bytes = layer.getvalue()
    diff_id = hashlib.sha256(layer_bytes).hexdigest()
    config = {
        "architecture": "amd64" if os.uname().machine == "x86_64" else os.uname().machine,
        "os": "linux",
        "config": {"Entrypoint": entrypoint, "Env": ["PATH=/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_id}"]},
    }
    config_bytes = json.dumps(config).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    manifest = [{"Config": config_name, "RepoTags": [ref], "Layers": [f"{diff_id}/layer.tar"]}]
    with tarfile.open(path, "w") as t:
        _tar_member(t, config_name, config_bytes)
        _tar_member(t, f"{diff_id}/layer.tar", layer_bytes)
        _tar_member(t, "manifest.json", json.dumps(manifest).encode())


# --- containerd --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PortMap:
    """A pod's hostPort as the kubelet hands it to the runtime (CRI PortMapping)."""

    host_port: int
    container_port: int
    protocol: str = "tcp"
    host_ip: str = ""


def config_v3(r: Path, socket: Path, bin_dir: Path, conf_dir: Path) -> str:
    """containerd 2's config (version 3): the CRI plugin is split into images and runtime plugins."""
    images, runtime = 'plugins."io.containerd.cri.v1.images"', 'plugins."io.containerd.cri.v1.runtime"'
    return f"""version = 3
root = "{r}/root"
state = "{r}/state"
# as for 1.6, and NRI, whose socket (/var/run/nri) is the machine's
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.nri.v1.nri"]
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{socket}.ttrpc"
[debug]
  address = "{r}/debug.sock"
[{images}.pinned_images]
  sandbox = "{PAUSE_IMAGE}"
[{runtime}]
  restrict_oom_score_adj = true
  [{runtime}.cni]
    bin_dirs = ["{bin_dir}"]
    conf_dir = "{conf_dir}"
    max_conf_num = 1
  [{runtime}.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
  [{runtime}.containerd.runtimes.runc.options]
    Root = "{r}/runc"
[plugins."io.containerd.grpc.v1.cri"]
  stream_server_port = "0"
"""


@dataclass
class Sandbox:
    """One pod sandbox as the CRI reports it."""

    id: str
    namespace: str
    name: str
    uid: str
    attempt: int
    ip: str
    netns: str
    state: int

    @property
    def netns_name(self) -> str:
        return os.path.basename(self.netns)


@dataclass
class Containerd:
    """A private containerd serving CRI v1 on ``<root>/containerd.sock``."""

    root: Path
    #: the executable the CRI plugin runs as the netplugin-cni CNI plugin, copied into the bin dir;
    #: None when something else (scripts/install.sh) puts it there
    shim: Path | None
    proc: subprocess.Popen[bytes] | None = None
    netns_seen: set[str] = field(default_factory=set)
    #: the CRI plugin's CNI dirs (default: under root), e.g. where an installer put the shim and conflist
    cni_bin_dir: Path | None = None
    cni_conf_dir: Path | None = None
    #: run containerd in this network namespace (/var/run/netns/NAME), as a node of a simulated cluster
    netns: str | None = None
    #: containerd 2 from this peer dir (scripts/build-peers.sh: containerd, ctr, containerd-shim-runc-v2,
    #: cni/loopback); None: Debian's containerd 1.6 from PATH
    peers: Path | None = None

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)
        self.socket = self.root / "containerd.sock"
        self.bin_dir = self.cni_bin_dir or self.root / "cni-bin"
        self.conf_dir = self.cni_conf_dir or self.root / "net.d"
        self.log_path = self.root / "containerd.log"
        for d in (self.bin_dir, self.conf_dir):
            d.mkdir(parents=True, exist_ok=True)
        self._stub: Any = None
        self.pb: Any = None

    # --- life cycle ----------------------------------------------------------------------------------

    @property
    def major(self) -> int:
        """containerd's major version: 2 for the peer build, 1 for Debian's 1.6."""
        return 2 if self.peers is not None else 1

    def _tool(self, name: str) -> str:
        return str(self.peers / name) if self.peers is not None else name

    def config_text(self) -> str:
        if self.peers is not None:
            return config_v3(self.root, self.socket, self.bin_dir, self.conf_dir)
        r = self.root
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        return f"""version = 2
root = "{r}/root"
state = "{r}/state"
# plugins that would touch /opt, or probe for filesystems this machine does not have
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{self.socket}.ttrpc"
[debug]
  address = "{r}/debug.sock"
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  stream_server_port = "0"
  [{cri}.cni]
    bin_dir = "{self.bin_dir}"
    conf_dir = "{self.conf_dir}"
    max_conf_num = 1
  [{cri}.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
  [{cri}.containerd.runtimes.runc.options]
    Root = "{r}/runc"
"""

    def start(self) -> None:
        loopback = self.peers / "cni" / "loopback" if self.peers is not None else loopback_plugin()
        shutil.copy2(loopback or "", self.bin_dir / "loopback")
        if self.shim is not None:
            shutil.copy2(self.shim, self.bin_dir / "netplugin-cni")
        config = self.root / "config.toml"
        config.write_text(self.config_text())
        self.pb, pbg = cri_modules(self.root / "cri-stubs")
        with open(self.log_path, "ab") as log:
            # Its own session: a Ctrl-C of pytest must not reach it before close() runs.
            # nsenter, not `ip netns exec`: that would give containerd a mount namespace of its own,
            # and the pods' netns mounts it makes would be invisible to everyone else.
            inside = ["nsenter", f"--net={NETNS_DIR}/{self.netns}"] if self.netns else []
            # The CNI plugins it runs inherit this: no NETPLUGIN_* settings of the developer's shell.
            env = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_")}
            if self.peers is not None:
                # containerd finds its shim on PATH: the one built with it, not Debian's 1.6 one.
                env["PATH"] = f"{self.peers}:{env.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
            self.proc = subprocess.Popen(
                [*inside, self._tool("containerd"), "--config", str(config)],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        import grpc

        self._channel = grpc.insecure_channel(f"unix://{self.socket}")
        self._stub = pbg.RuntimeServiceStub(self._channel)
        deadline = time.monotonic() + 30
        while True:
            try:
                self._stub.Version(self.pb.VersionRequest(version="v1"), timeout=2)
                break
            except grpc.RpcError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"containerd did not start; its log:\n{self.log_tail()}") from None
                time.sleep(0.05)
        archive = self.root / "pause.tar"
        pause_archive(PAUSE_IMAGE, archive)
        self.import_image(archive)

    def import_image(self, archive: Path) -> None:
        """Give the CRI plugin an image (docker-archive): no registry is reachable."""
        done = _run(
            [self._tool("ctr"), "--address", str(self.socket), "-n", "k8s.io", "images", "import", str(archive)]
        )
        if done.returncode != 0:
            raise RuntimeError(f"ctr images import failed: {done.stderr}")

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def shim_pids(self) -> list[int]:
        """containerd-shim-runc-v2 processes serving this containerd (found by ``-address <socket>``)."""
        pids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if not argv or not argv[0].endswith(b"containerd-shim-runc-v2"):
                continue
            for i, arg in enumerate(argv[:-1]):
                if arg == b"-address" and argv[i + 1] == str(self.socket).encode():
                    pids.append(int(entry))
        return pids

    def close(self) -> None:
        """Remove every sandbox, stop containerd and its shims, remove what they left."""
        if self._stub is not None and self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(Exception):
                for sb in self.list_sandboxes():
                    self.stop_remove(sb, check=False)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        for pid in self.shim_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for name in sorted(self.netns_seen):
            if os.path.exists(os.path.join(NETNS_DIR, name)):
                _run(["ip", "netns", "delete", name])
        # Mounts of sandboxes that were never removed (a crash mid-test): rootfs, shm.
        prefix = str(self.root) + "/"
        with open("/proc/self/mounts") as f:
            mounts = [line.split()[1] for line in f if line.split()[1].startswith(prefix)]
        for m in sorted(mounts, key=len, reverse=True):
            _run(["umount", "-l", m])
        if getattr(self, "_channel", None) is not None:
            self._channel.close()

    # --- CRI ---------------------------------------------------------------------------------------

    def cni_networks(self) -> list[str]:
        """The names of the CNI networks the CRI plugin has loaded now."""
        resp = self._stub.Status(self.pb.StatusRequest(verbose=True), timeout=10)
        info = json.loads(resp.info.get("cniconfig", "{}"))
        return [n["Config"]["Name"] for n in info.get("Networks") or []]

    def use_network(self, conflist: dict[str, Any]) -> None:
        """Make ``conflist`` the only network config and wait until the CRI plugin loaded it."""
        for old in self.conf_dir.iterdir():
            old.unlink()
        tmp = self.conf_dir / ".new.tmp"
        tmp.write_text(json.dumps(conflist, indent=1))
        tmp.rename(self.conf_dir / f"10-{conflist['name']}.conflist")
        self.wait_network(conflist["name"])

    def wait_network(self, name: str, timeout: float = 15) -> None:
        """Wait until the CRI plugin has loaded network ``name`` (from whatever put it in the conf dir)."""
        deadline = time.monotonic() + timeout
        while name not in self.cni_networks():
            if time.monotonic() > deadline:
                raise RuntimeError(f"containerd did not load network {name}:\n{self.log_tail()}")
            time.sleep(0.1)

    def run_pod(
        self,
        namespace: str,
        name: str,
        uid: str,
        attempt: int = 0,
        annotations: dict[str, str] | None = None,
        *,
        host_network: bool = False,
        ports: Sequence[PortMap] = (),
    ) -> Sandbox:
        """RunPodSandbox, then PodSandboxStatus. Raises grpc.RpcError as the kubelet would see it."""
        sid = self.run_pod_sandbox(namespace, name, uid, attempt, annotations, host_network=host_network, ports=ports)
        return self.status(sid)

    def run_pod_sandbox(
        self,
        namespace: str,
        name: str,
        uid: str,
        attempt: int = 0,
        annotations: dict[str, str] | None = None,
        *,
        host_network: bool = False,
        ports: Sequence[PortMap] = (),
        cgroup_parent: str = "",
    ) -> str:
        """RunPodSandbox alone (the call the kubelet waits for); the sandbox id. ``ports``: the hostPorts."""
        pb = self.pb
        meta = pb.PodSandboxMetadata(name=name, uid=uid, namespace=namespace, attempt=attempt)
        linux = pb.LinuxPodSandboxConfig(cgroup_parent=cgroup_parent)
        if host_network:
            linux = pb.LinuxPodSandboxConfig(
                security_context=pb.LinuxSandboxSecurityContext(namespace_options=pb.NamespaceOption(network=pb.NODE))
            )
        config = pb.PodSandboxConfig(
            metadata=meta,
            hostname="" if host_network else name,  # the node's own UTS namespace: no hostname of its own
            log_directory=str(self.root / "pod-logs" / f"{namespace}_{name}_{uid}"),
            labels={"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": namespace},
            annotations=annotations or {},
            linux=linux,
            port_mappings=[
                pb.PortMapping(protocol=pb.Protocol.Value(p.protocol.upper()), container_port=p.container_port,
                               host_port=p.host_port, host_ip=p.host_ip)
                for p in ports
            ],
        )
        resp = self._stub.RunPodSandbox(pb.RunPodSandboxRequest(config=config), timeout=120)
        return str(resp.pod_sandbox_id)

    def status(self, sandbox_id: str) -> Sandbox:
        resp = self._stub.PodSandboxStatus(
            self.pb.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id, verbose=True), timeout=30
        )
        st = resp.status
        info = json.loads(resp.info["info"]) if "info" in resp.info else {}
        namespaces = (((info.get("runtimeSpec") or {}).get("linux") or {}).get("namespaces")) or []
        netns = next((ns.get("path", "") for ns in namespaces if ns.get("type") == "network"), "")
        if netns:
            self.netns_seen.add(os.path.basename(netns))
        m = st.metadata
        return Sandbox(st.id, m.namespace, m.name, m.uid, m.attempt, st.network.ip, netns, st.state)

    def list_sandboxes(self) -> list[str]:
        return [item.id for item in self._stub.ListPodSandbox(self.pb.ListPodSandboxRequest(), timeout=30).items]

    def stop(self, sandbox_id: str) -> None:
        self._stub.StopPodSandbox(self.pb.StopPodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=120)

    def remove(self, sandbox_id: str) -> None:
        self._stub.RemovePodSandbox(self.pb.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=120)

    def stop_remove(self, sandbox_id: str, *, check: bool = True) -> None:
        try:
            self.stop(sandbox_id)
            self.remove(sandbox_id)
        except Exception:
            if check:
                raise
