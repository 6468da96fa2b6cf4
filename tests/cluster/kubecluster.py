"""The simulated cluster's nodes against a real control plane (:mod:`kubeplane`) instead of simcluster's API server.

The nodes are the same network namespaces on the same underlay as
:class:`netplugin.frontends.lab.simcluster.cluster.SimCluster`, each with its own ``netplugin serve``
(``host: kube``); what changes is the API:

* kube-apiserver, etcd and kube-controller-manager run on the machine's loopback. The node
  namespaces cannot reach that loopback, so a relay of this process listens inside the underlay
  namespace (``10.206.0.1``) and splices each connection to the API server's port: TLS passes
  through untouched (the serving certificate names 127.0.0.1 and the relay's address).
* Nodes are registered without ``podCIDRs``: kube-controller-manager allocates them, and the node
  keeps what it was given.
* Each daemon authenticates with a ServiceAccount token of ``kube-system/netplugin``, which the
  shipped ``etc/kubernetes`` objects (applied as shipped) bind to the shipped ClusterRole.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from netplugin.frontends.lab.simcluster.apiobjects import make_node
from netplugin.frontends.lab.simcluster.cluster import UNDERLAY_V4, SimCluster, SimNode
from netplugin.frontends.lab.simcluster.nsexec import socket_in_netns
from netplugin.frontends.lab.simcluster.sessions import stop_session
from tests.support.kubeplane import CLUSTER_CIDRS, ApiError, ControlPlane

__all__ = ["SA_USER", "KubeCluster", "Relay", "apply_shipped_rbac"]

REPO = Path(__file__).resolve().parents[2]
#: the shipped identity (etc/kubernetes/serviceaccount.yaml) as the API server names it
SA_NAMESPACE, SA_NAME = "kube-system", "netplugin"
SA_USER = f"system:serviceaccount:{SA_NAMESPACE}:{SA_NAME}"
#: the shipped manifests the daemon's identity and rights come from, applied as shipped
RBAC_MANIFESTS = ("serviceaccount.yaml", "rbac.yaml")


def apply_shipped_rbac(plane: ControlPlane) -> list[str]:
    """Create every object of the shipped ServiceAccount and RBAC manifests; their kinds."""
    kinds = []
    for name in RBAC_MANIFESTS:
        for doc in yaml.safe_load_all((REPO / "etc" / "kubernetes" / name).read_text()):
            if doc:
                plane.apply(doc)
                kinds.append(str(doc["kind"]))
    return kinds


class Relay:
    """A TCP relay: a listener inside netns ``netns`` at ``address``, each connection spliced to ``target``."""

    def __init__(self, netns: str, address: tuple[str, int], target: tuple[str, int]) -> None:
        self.target = target
        self.sock = socket_in_netns(netns, socket.AF_INET, address)
        self.sock.listen(64)
        self.port = int(self.sock.getsockname()[1])
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
            with contextlib.suppress(OSError):
                src.shutdown(socket.SHUT_RD)

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


class KubeCluster(SimCluster):
    """A :class:`SimCluster` whose API server, Node CIDRs and daemon credentials are Kubernetes' own."""

    def __init__(self, plane: ControlPlane, **kw: Any) -> None:
        super().__init__(**kw)
        self.plane = plane
        self.relay: Relay | None = None
        self.kube_proxies: list[subprocess.Popen[bytes]] = []

    def _start_api(self) -> None:
        u = self.underlay
        self.relay = Relay(u, (str(UNDERLAY_V4.network_address + 1), 0), ("127.0.0.1", self.plane.port))
        # SimCluster's methods speak to self.api: apply, delete, objects; the control plane has them.
        self.api = self.plane  # type: ignore[assignment]
        token = self.plane.service_account_token(SA_NAMESPACE, SA_NAME)
        self.token_file = self.root / "token"
        self.token_file.write_text(token)
        self.token_file.chmod(0o600)

    @property
    def api_url(self) -> str:
        assert self.relay is not None
        return f"https://{UNDERLAY_V4.network_address + 1}:{self.relay.port}"

    def close(self) -> None:
        for proc in self.kube_proxies:
            stop_session(proc)
        self.api = None
        super().close()
        if self.relay is not None:
            self.relay.close()
            self.relay = None

    def register(self, node: SimNode) -> None:
        """The Node without podCIDRs; kube-controller-manager allocates them, and the node keeps those."""
        obj = make_node(node.name, [], list(node.internal_ips))
        with contextlib.suppress(ApiError):
            self.plane.apply(obj)
        node.pod_cidrs = tuple(self.wait_pod_cidrs(node.name))
        self._write_config(node, rewrite=True)

    def wait_pod_cidrs(self, name: str, timeout: float = 30.0) -> list[str]:
        def allocated() -> list[str]:
            with contextlib.suppress(ApiError):
                return list(self.plane.request("GET", f"/api/v1/nodes/{name}")["spec"].get("podCIDRs") or [])
            return []

        cidrs: list[str] = self.plane.wait_for(f"podCIDRs of Node {name}", allocated, timeout)
        return cidrs

    def _write_config(self, node: SimNode, *, rewrite: bool = False) -> None:
        if not rewrite:
            super()._write_config(node)
        self.plane.write_kubeconfig(node.root / "kubeconfig", token_file=self.token_file, server=self.api_url)
        config = json.loads(node.config_path.read_text())
        if rewrite and self.node_subnets is False:
            config["env"]["NETPLUGIN_BRIDGE_SUBNET"] = node.pod_cidrs[0]
        node.config_path.write_text(json.dumps(config, indent=1) + "\n")

    def start_kube_proxy(self, node: SimNode) -> subprocess.Popen[bytes]:
        """kube-proxy (nftables mode) in ``node``'s namespace, as ``system:kube-proxy``, through the relay."""
        kubeconfig = self.plane.write_kubeconfig(
            node.root / "kube-proxy.kubeconfig", cert="kube-proxy", server=self.api_url
        )
        argv = [
            "ip", "netns", "exec", node.netns, str(self.plane.peers / "kube-proxy"), f"--kubeconfig={kubeconfig}",
            "--proxy-mode=nftables", f"--hostname-override={node.name}", f"--cluster-cidr={','.join(CLUSTER_CIDRS)}",
            # the conntrack sysctls are the machine's: leave them alone
            "--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0s",
            "--conntrack-tcp-timeout-close-wait=0s",
            # the node's own loopback (each node is a netns of its own)
            "--metrics-bind-address=127.0.0.1:10249", "--healthz-bind-address=127.0.0.1:10256",
        ]  # fmt: skip
        with open(node.root / "kube-proxy.log", "ab") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        self.kube_proxies.append(proc)
        # Ready once its nftables table exists in the node's namespace.
        deadline = time.monotonic() + 60
        while self.exec_in(node.netns, ["nft", "list", "table", "ip", "kube-proxy"]).returncode != 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                log = (node.root / "kube-proxy.log").read_text(errors="replace")[-2000:]
                raise AssertionError(f"kube-proxy on {node.name} did not start:\n{log}")
            time.sleep(0.2)
        return proc

    def wait_gone(self, kind: str, name: str, namespace: str | None = None, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while any(o["metadata"]["name"] == name for o in self.plane.objects(kind, namespace)):
            if time.monotonic() > deadline:
                raise AssertionError(f"{kind} {name} still in the API after {timeout} s")
            time.sleep(0.05)
