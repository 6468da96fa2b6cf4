"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager and,
for kubelets, kube-scheduler.

The binaries come from ``scripts/build-peers.sh`` (:mod:`gopeers`); etcd is the embedded server of
``tests/peers/kube/etcd``. Everything listens on 127.0.0.1 at free ports and lives under one
directory: openssl makes the CA, the serving certificate, the client certificates (admin,
controller-manager, scheduler, kube-proxy, and one per kubelet: :meth:`ControlPlane.node_kubeconfig`)
and the service-account signing key. kube-controller-manager runs the ``nodeipam`` controller with
``--allocate-node-cidrs``: it, not the test, gives each Node its ``podCIDRs`` (one per family of
:data:`CLUSTER_CIDRS`), and the ``serviceaccount`` controllers; a plane for kubelets adds the
controllers real Nodes and Pods need (:data:`KUBELET_CONTROLLERS`) and kube-scheduler.

:class:`ControlPlane` talks to the API as the admin (a client certificate in ``system:masters``);
:meth:`ControlPlane.service_account_kubeconfig` writes a kubeconfig whose user is a ServiceAccount
token from the TokenRequest API, as a DaemonSet pod would hold one.
"""

from __future__ import annotations

import contextlib
import json
import random
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from netplugin.frontends.lab.simcluster.sessions import stop_session
from tests.support.waits import WITHIN, wait_for

__all__ = [
    "CLUSTER_CIDRS",
    "KUBELET_CONTROLLERS",
    "KUBE_PEERS",
    "SERVICE_CIDR",
    "ApiError",
    "ControlPlane",
]

#: the peers this needs (paths under the peer dir); with ``for_kubelets`` kube-scheduler too
KUBE_PEERS = ("etcd", "kube-apiserver", "kube-controller-manager")
#: the controllers that Nodes registered by kubelets and their Pods need besides node IPAM: the
#: lifecycle controller lifts the not-ready taint once a kubelet reports Ready (the scheduler
#: places nothing before), the root CA publisher writes the ``kube-root-ca.crt`` ConfigMap that
#: every Pod's service-account volume projects; and what runs a Deployment as a user's would: its
#: controller, the ReplicaSets' controller, and the garbage collector that removes a deleted
#: Deployment's ReplicaSets and Pods
KUBELET_CONTROLLERS = (
    "node-lifecycle-controller",
    "root-ca-certificate-publisher-controller",
    "deployment-controller",
    "replicaset-controller",
    "garbage-collector-controller",
)
#: the simulated cluster's pod CIDRs (tests/cluster, README's table): the controller-manager
#: carves a /24 and a /64 per Node out of them
CLUSTER_CIDRS = ("10.206.128.0/17", "fd6e:7031:1a00:8000::/49")
#: Services' cluster IPs (README's table: 10.206.64.0/20, inside the simulated cluster's /16)
SERVICE_CIDR = "10.206.64.0/20"

T = TypeVar("T")


class ApiError(Exception):
    """A request the API server refused: its HTTP status and Status body."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:500]}")
        self.status = status
        self.body = body


#: Fixed listening ports come from below the kernel's ephemeral range (``ip_local_port_range``, 32768
#: up by default) and below kube-proxy's NodePort range: a port the kernel hands out by ``bind(0)``
#: may, between this check and the server's own bind, become the local port of some process's
#: outgoing connection (the API server's own connections to etcd among them), and the server then
#: fails with "address already in use". No connection is ever given a port from this range.
_LISTEN_PORTS = range(20000, 30000)
_handed_out: set[int] = set()


def free_port() -> int:
    """A loopback TCP port nothing listens on, not handed out before by this process."""
    for port in random.sample(_LISTEN_PORTS, len(_LISTEN_PORTS)):
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free loopback port in {_LISTEN_PORTS.start}-{_LISTEN_PORTS.stop - 1}")


def _openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)}: {done.stderr}")


def make_cert(d: Path, name: str, subject: str, ext: list[str] | None = None) -> None:
    """``d/name.crt`` and ``.key`` for ``subject``, signed by the CA in ``d`` (``ext``: openssl's -extfile)."""
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", subject,
             "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d)  # fmt: skip
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "2", "-out", f"{name}.crt", *(ext or []), cwd=d)  # fmt: skip


def make_pki(d: Path, san_ips: tuple[str, ...] = ()) -> None:
    """CA, serving cert for 127.0.0.1 (and ``san_ips``), the components' client certs, SA key pair."""
    d.mkdir(parents=True, exist_ok=True)
    ips = ",".join(f"IP:{a}" for a in ("127.0.0.1", *san_ips))
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
             "-subj", "/CN=netplugin-test-ca", "-keyout", "ca.key", "-out", "ca.crt", cwd=d)  # fmt: skip
    names = ",".join(
        f"DNS:{n}"
        for n in (
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        )
    )
    (d / "san.ext").write_text(f"subjectAltName={ips},{names}\n")
    # the identities Kubernetes' default RBAC binds to the components' roles
    # (kubelet-client: the API server's own identity towards the kubelets, for pods/exec, log and proxy)
    subjects = {"apiserver": "/CN=kube-apiserver", "admin": "/O=system:masters/CN=netplugin-test-admin",
                "kcm": "/CN=system:kube-controller-manager", "kube-scheduler": "/CN=system:kube-scheduler",
                "kube-proxy": "/CN=system:kube-proxy",
                "kubelet-client": "/O=system:masters/CN=kube-apiserver-kubelet-client"}  # fmt: skip
    for name, subject in subjects.items():
        make_cert(d, name, subject, ["-extfile", "san.ext"] if name == "apiserver" else None)
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=d)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)


class ControlPlane:
    """etcd, kube-apiserver, kube-controller-manager (and kube-scheduler) under ``root``, from ``peers``."""

    def __init__(
        self,
        root: Path,
        peers: Path,
        *,
        san_ips: tuple[str, ...] = (),
        for_kubelets: bool = False,
        address: str = "127.0.0.1",
        all_controllers: bool = False,
    ) -> None:
        """``san_ips``: addresses besides 127.0.0.1 its certificate names (where a relay exposes it);
        ``for_kubelets``: also kube-scheduler and :data:`KUBELET_CONTROLLERS`; ``address``: where the
        API server listens and what it advertises: any but loopback makes it the real endpoint of the
        ``kubernetes`` Service (port 6443), as in a real cluster; ``all_controllers``: every controller
        kube-controller-manager runs by default (``--controllers=*``: namespace, endpoints, endpoint
        slices, garbage collector... as a real cluster's), not only those the tests above need."""
        self.root, self.peers, self.san_ips = root, peers, san_ips
        self.for_kubelets = for_kubelets
        self.address, self.all_controllers = address, all_controllers
        self.pki = root / "pki"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.port = free_port() if address == "127.0.0.1" else 6443
        self.url = f"https://{address}:{self.port}"
        self.audit_log = root / "audit.log"
        self._ctx: ssl.SSLContext | None = None

    # --- life cycle ----------------------------------------------------------------------------------

    def __enter__(self) -> ControlPlane:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.root / f"{name}.log", "wb")  # noqa: SIM115 -- the child writes it until close()
        # Its own session: a Ctrl-C of pytest must not stop it before close() runs.
        self.procs[name] = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()

    def log_tail(self, name: str, lines: int = 30) -> str:
        try:
            return "\n".join((self.root / f"{name}.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def start(self) -> None:
        make_pki(self.pki, (*self.san_ips, *([] if self.address == "127.0.0.1" else [self.address])))
        p, etcd_port = self.pki, free_port()
        self._spawn("etcd", [str(self.peers / "etcd"), f"--data-dir={self.root / 'etcd'}",
                             f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
                             f"--listen-peer-urls=http://127.0.0.1:{free_port()}"])  # fmt: skip
        self._spawn("kube-apiserver", [
            str(self.peers / "kube-apiserver"), f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            f"--bind-address={self.address}", f"--advertise-address={self.address}", f"--secure-port={self.port}",
            # no kubernetes Service endpoints when on loopback: a loopback address may not be one
            *(["--endpoint-reconciler-type=none"] if self.address == "127.0.0.1" else []),
            # pods/exec, log and proxy reach each kubelet at its Node's InternalIP (the default tries
            # the Hostname first, which no resolver here knows), with a client certificate of this CA
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            f"--kubelet-client-certificate={p / 'kubelet-client.crt'}",
            f"--kubelet-client-key={p / 'kubelet-client.key'}",
            # a network agent's DaemonSet (netplugin's) runs privileged
            "--allow-privileged=true",
            f"--tls-cert-file={p / 'apiserver.crt'}", f"--tls-private-key-file={p / 'apiserver.key'}",
            f"--client-ca-file={p / 'ca.crt'}", f"--service-account-key-file={p / 'sa.pub'}",
            f"--service-account-signing-key-file={p / 'sa.key'}",
            "--service-account-issuer=https://kubernetes.default.svc", "--authorization-mode=Node,RBAC",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--enable-priority-and-fairness=false",
            "--profiling=false", "--v=1",
            f"--audit-policy-file={self._audit_policy()}", f"--audit-log-path={self.audit_log}",
        ])  # fmt: skip
        self.wait_ready(120.0)
        controllers = ["node-ipam-controller", "serviceaccount-controller", "serviceaccount-token-controller"]
        if self.for_kubelets:
            controllers += KUBELET_CONTROLLERS
        kubeconfig = self.write_kubeconfig(self.root / "kcm.kubeconfig", cert="kcm")
        self._spawn("kube-controller-manager", [
            str(self.peers / "kube-controller-manager"), f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1", "--secure-port=0", "--leader-elect=false",
            # each controller as its own ServiceAccount, with the rights Kubernetes' default RBAC gives it
            "--use-service-account-credentials",
            f"--controllers={'*' if self.all_controllers else ','.join(controllers)}",
            "--allocate-node-cidrs", f"--cluster-cidr={','.join(CLUSTER_CIDRS)}",
            "--node-cidr-mask-size-ipv4=24", "--node-cidr-mask-size-ipv6=64",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--service-account-private-key-file={p / 'sa.key'}", f"--root-ca-file={p / 'ca.crt'}",
        ])  # fmt: skip
        if self.for_kubelets:
            kubeconfig = self.write_kubeconfig(self.root / "scheduler.kubeconfig", cert="kube-scheduler")
            # no serving port (it would need its own certificate): nothing here scrapes it
            self._spawn("kube-scheduler", [
                str(self.peers / "kube-scheduler"), f"--kubeconfig={kubeconfig}", "--leader-elect=false",
                "--bind-address=127.0.0.1", "--secure-port=0",
            ])  # fmt: skip

    def _audit_policy(self) -> Path:
        """Every request of a ServiceAccount, by verb and resource (what least privilege is judged on)."""
        path = self.root / "audit-policy.json"
        rules = [
            {"level": "Metadata", "userGroups": ["system:serviceaccounts"]},
            {"level": "None"},
        ]
        doc = {"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"], "rules": rules}
        path.write_text(json.dumps(doc))
        return path

    def audit(self, user: str) -> list[dict[str, Any]]:
        """The audit events of ``user`` so far, one per request (a watch is logged when its response starts)."""
        if not self.audit_log.exists():
            return []
        lines = self.audit_log.read_text().split("\n")
        # The last line is complete only once its newline is written: read it next time.
        events = [json.loads(line) for line in lines[:-1] if line.strip()]
        mine = {e["auditID"]: e for e in events if e.get("user", {}).get("username") == user}
        return list(mine.values())

    def wait_ready(self, timeout: float) -> None:
        def ready() -> bool:
            with contextlib.suppress(OSError, ApiError):
                if self.request("GET", "/readyz") == "ok":
                    return True
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited ({proc.returncode}):\n{self.log_tail(name)}")
            return False

        wait_for(ready, "kube-apiserver ready", timeout, detail=lambda: self.log_tail("kube-apiserver"), interval=0.5)

    def close(self) -> None:
        for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
            proc = self.procs.get(name)
            if proc is not None:
                stop_session(proc)

    # --- the API, as the admin -----------------------------------------------------------------------

    def _ssl(self) -> ssl.SSLContext:
        if self._ctx is None:
            ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
            ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
            self._ctx = ctx
        return self._ctx

    def request(self, method: str, path: str, body: Any = None, *, token: str | None = None) -> Any:
        """One API call (as the admin, or as ``token``'s identity); the decoded JSON (or text)."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        req.add_header("Accept", "application/json")
        ctx = self._ssl()
        if token is not None:
            req.add_header("Authorization", f"Bearer {token}")
            ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        try:
            with urllib.request.urlopen(req, timeout=30, context=ctx) as resp:
                text = resp.read().decode()
        except urllib.error.HTTPError as e:
            raise ApiError(e.code, e.read().decode(errors="replace")) from None
        try:
            return json.loads(text)
        except ValueError:
            return text

    def watch(self, path: str, timeout: float = 30) -> Watch:
        """A watch of ``path`` (a collection, with its query), open when this returns: what changes
        after the call is in its events. Each read waits at most ``timeout`` seconds."""
        sep = "&" if "?" in path else "?"
        req = urllib.request.Request(f"{self.url}{path}{sep}watch=1", headers={"Accept": "application/json"})
        return Watch(urllib.request.urlopen(req, timeout=timeout, context=self._ssl()))

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create ``obj`` (a dict as in a manifest) at its collection's path."""
        result: dict[str, Any] = self.request("POST", collection_path(obj), obj)
        return result

    def delete(self, kind: str, name: str, namespace: str | None = None) -> None:
        """Delete at once (grace 0: no kubelet here confirms a pod's end)."""
        path = f"{collection_path({'kind': kind, 'metadata': {'namespace': namespace}})}/{name}"
        self.request("DELETE", path, {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0})

    def objects(self, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.request(
            "GET", collection_path({"kind": kind, "metadata": {"namespace": namespace}})
        )["items"]
        return items

    def wait_for(self, what: str, check: Callable[[], T], timeout: float = WITHIN) -> T:
        """:func:`tests.waits.wait_for`, with the controller manager's log tail: it makes what is waited for."""
        return wait_for(check, what, timeout, detail=lambda: self.log_tail("kube-controller-manager"), interval=0.2)

    def service_account_token(self, namespace: str, name: str, seconds: int = 3600) -> str:
        """A token for ServiceAccount ``namespace/name`` from the TokenRequest API."""
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": seconds},
        }
        path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token"
        return str(self.request("POST", path, body)["status"]["token"])

    def write_kubeconfig(
        self, path: Path, *, cert: str | None = None, token_file: Path | None = None, server: str | None = None
    ) -> Path:
        """A kubeconfig for this API server (or ``server``, a relay): a client certificate of the PKI, or a token."""
        user: dict[str, str] = {}
        if cert is not None:
            user = {"client-certificate": str(self.pki / f"{cert}.crt"), "client-key": str(self.pki / f"{cert}.key")}
        if token_file is not None:
            user = {"tokenFile": str(token_file)}
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "test",
                    "cluster": {"server": server or self.url, "certificate-authority": str(self.pki / "ca.crt")},
                }
            ],
            "users": [{"name": "test", "user": user}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
            "current-context": "test",
        }
        path.write_text(json.dumps(doc, indent=1))
        return path

    def node_kubeconfig(self, path: Path, node: str, *, server: str | None = None) -> Path:
        """A kubelet's kubeconfig: a client certificate of ``system:node:<node>`` in ``system:nodes``, the
        identity to which the Node authorizer gives a node's rights (its Node, its Pods, their tokens)."""
        make_cert(self.pki, f"kubelet-{node}", f"/O=system:nodes/CN=system:node:{node}")
        return self.write_kubeconfig(path, cert=f"kubelet-{node}", server=server)


#: kind -> (API group path, plural, namespaced)
KINDS = {
    "Node": ("/api/v1", "nodes", False),
    "Pod": ("/api/v1", "pods", True),
    "Service": ("/api/v1", "services", True),
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "Namespace": ("/api/v1", "namespaces", False),
    "ConfigMap": ("/api/v1", "configmaps", True),
    "Deployment": ("/apis/apps/v1", "deployments", True),
    "EndpointSlice": ("/apis/discovery.k8s.io/v1", "endpointslices", True),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
}


class Watch:
    """An open watch: its events, each stamped with the ``time.monotonic()`` of its arrival; a context
    manager (closing ends the stream). The API server may end a watch at any time: the iteration ends."""

    def __init__(self, response: Any) -> None:
        self._response = response

    def __iter__(self) -> Iterator[tuple[float, dict[str, Any]]]:
        for line in self._response:
            yield time.monotonic(), json.loads(line)

    def close(self) -> None:
        self._response.close()

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def collection_path(obj: dict[str, Any]) -> str:
    base, plural, namespaced = KINDS[obj["kind"]]
    namespace = (obj.get("metadata") or {}).get("namespace")
    if namespaced and namespace:
        return f"{base}/namespaces/{namespace}/{plural}"
    return f"{base}/{plural}"
