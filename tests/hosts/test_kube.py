"""KubeHost against a real local API server (http.server in a thread, real-shaped Pod and Status JSON).

No mocks: every case goes over a real socket (plain HTTP, or TLS with certificates made by openssl),
through the same code the CLI runs.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from netplugin.core.errors import HostError
from netplugin.frontends.lab.simcluster.apiobjects import status as status_json
from netplugin.hosts.kube import KubeHost
from netplugin.hosts.kubeconfig import KubeSettings, load_kubeconfig, resolve_settings

REPO = Path(__file__).resolve().parents[2]
NS, NAME = "team-a", "web-0"
POD_PATH = f"/api/v1/namespaces/{NS}/pods/{NAME}"
TOKEN = "eyJhbGciOiJSUzI1NiJ9.test-token-7f3a"


# --- real-shaped API objects ---------------------------------------------------------------------


def pod_json(namespace: str = NS, name: str = NAME) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": "6f1c2d9e-3b4a-4c5d-9e8f-0a1b2c3d4e5f",
            "resourceVersion": "482131",
            "creationTimestamp": "2024-05-02T09:14:07Z",
            "labels": {"app": "web", "pod-template-hash": "7d4b9c8f5"},
            "annotations": {"netplugin.io/bandwidth": "10M", "kubernetes.io/config.source": "api"},
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web", "uid": "0b2f", "controller": True}
            ],
        },
        "spec": {
            "nodeName": "node-1",
            "serviceAccountName": "default",
            "restartPolicy": "Always",
            "dnsPolicy": "ClusterFirst",
            "containers": [{"name": "web", "image": "nginx:1.25", "ports": [{"containerPort": 80, "protocol": "TCP"}]}],
        },
        "status": {
            "phase": "Pending",
            "hostIP": "192.168.1.10",
            "qosClass": "BestEffort",
            "conditions": [{"type": "PodScheduled", "status": "True"}],
        },
    }


FORBIDDEN_MSG = (
    f'pods "{NAME}" is forbidden: User "system:serviceaccount:kube-system:default" '
    f'cannot get resource "pods" in API group "" in the namespace "{NS}"'
)


# --- the server ----------------------------------------------------------------------------------


@dataclass
class Reply:
    status: int = 200
    body: bytes | dict[str, Any] | list[Any] = b""
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0  # before the status line
    trickle: float = 0.0  # seconds between single body bytes


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    client_cn: str | None


class ApiServer:
    """A tiny API server: routes by raw path; unknown pod paths get a real NotFound Status."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.routes: dict[str, Reply] = {}
        self.requests: list[Seen] = []
        self.stop = threading.Event()
        api = self

        class Handler(BaseHTTPRequestHandler):
            timeout = 10

            def do_GET(self) -> None:
                cn = None
                if isinstance(self.connection, ssl.SSLSocket):
                    cert = self.connection.getpeercert()
                    if cert:
                        cn = dict(x[0] for x in cert["subject"]).get("commonName")
                api.requests.append(Seen(self.path, {k.lower(): v for k, v in self.headers.items()}, cn))
                reply = api.routes.get(self.path)
                if reply is None:
                    name = self.path.rsplit("/", 1)[-1]
                    reply = Reply(404, status_json(404, "NotFound", f'pods "{name}" not found', {"kind": "pods"}))
                if reply.delay and api.stop.wait(reply.delay):
                    return
                body = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
                self.send_response(reply.status)
                headers = {"Content-Type": "application/json", "Content-Length": str(len(body)), **reply.headers}
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                if reply.trickle:
                    for i in range(len(body)):
                        self.wfile.write(body[i : i + 1])
                        self.wfile.flush()
                        if api.stop.wait(reply.trickle):
                            return
                else:
                    self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            block_on_close = False  # a deliberately slow handler must not hold up teardown

            def get_request(self) -> tuple[socket.socket, Any]:
                sock, addr = self.socket.accept()
                if tls is not None:
                    # Handshake in the handler thread: a client that aborts it must not stall accept().
                    sock = tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                return sock, addr

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # clients that time out or reject our certificate break the pipe on purpose

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def api() -> Iterator[ApiServer]:
    server = ApiServer()
    server.routes[POD_PATH] = Reply(200, pod_json())
    yield server
    server.close()


def host_for(server: ApiServer, **kw: Any) -> KubeHost:
    settings = KubeSettings(server=server.url, source="test settings", token=TOKEN)
    return KubeHost(settings=settings, proxies={}, environ={}, **kw)


def write_kubeconfig(
    path: Path, server: str, user: dict[str, Any], cluster_extra: dict[str, Any] | None = None
) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "ctx",
        "clusters": [{"name": "c", "cluster": {"server": server, **(cluster_extra or {})}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u", "namespace": NS}}],
    }
    path.write_text(json.dumps(doc))  # JSON is YAML; load_yaml reads it
    return path


# --- outcomes ------------------------------------------------------------------------------------


def test_found_pod_comes_through_whole(api: ApiServer) -> None:
    pod = host_for(api).get_pod_by_name(NS, NAME)
    assert pod is not None
    assert pod["metadata"]["labels"] == {"app": "web", "pod-template-hash": "7d4b9c8f5"}
    assert pod["metadata"]["annotations"]["netplugin.io/bandwidth"] == "10M"
    assert pod["metadata"]["uid"] == "6f1c2d9e-3b4a-4c5d-9e8f-0a1b2c3d4e5f"
    assert pod["status"]["hostIP"] == "192.168.1.10"
    [seen] = api.requests
    assert seen.path == POD_PATH
    assert seen.headers["authorization"] == f"Bearer {TOKEN}"
    assert seen.headers["accept"] == "application/json"


def test_not_found_is_none(api: ApiServer) -> None:
    host = host_for(api)
    assert host.get_pod_by_name(NS, "gone-1") is None
    assert host.last_error is None
    assert api.requests[-1].path == f"/api/v1/namespaces/{NS}/pods/gone-1"


def test_namespace_and_name_are_url_escaped(api: ApiServer) -> None:
    # Validation upstream forbids these; the client must still not let them reroute the request.
    assert host_for(api).get_pod_by_name("a/b", "x?y=1#z") is None
    assert api.requests[-1].path == "/api/v1/namespaces/a%2Fb/pods/x%3Fy%3D1%23z"


ERROR_CASES = [
    pytest.param(
        Reply(401, status_json(401, "Unauthorized", "Unauthorized")),
        401,
        ["HTTP 401", "Unauthorized", "check the credentials"],
        id="401-unauthorized",
    ),
    pytest.param(
        Reply(403, status_json(403, "Forbidden", FORBIDDEN_MSG, {"name": NAME, "kind": "pods"})),
        403,
        ["HTTP 403", 'is forbidden: User "system:serviceaccount:kube-system:default"', 'get resource "pods"'],
        id="403-forbidden",
    ),
    pytest.param(
        Reply(500, status_json(500, "InternalError", "Internal error occurred: etcdserver: request timed out")),
        500,
        ["HTTP 500", "etcdserver: request timed out"],
        id="500-status",
    ),
    pytest.param(
        Reply(503, b"upstream connect error or disconnect/reset", {"Content-Type": "text/plain"}),
        503,
        ["HTTP 503", "upstream connect error"],
        id="503-plain-text",
    ),
    pytest.param(
        Reply(200, b"<html><body>Welcome to nginx!</body></html>", {"Content-Type": "text/html"}),
        200,
        ["garbage", "not a JSON object", "Welcome to nginx"],
        id="200-garbage",
    ),
    pytest.param(Reply(200, b"[1, 2]"), 200, ["garbage"], id="200-json-array"),
    pytest.param(
        Reply(200, {"apiVersion": "v1", "kind": "Service", "metadata": {"name": NAME, "namespace": NS}}),
        200,
        ["kind 'Service'", "not a Pod"],
        id="200-wrong-kind",
    ),
    pytest.param(Reply(200, pod_json(NS, "web-1")), 200, ["team-a/web-1", "not the one asked for"], id="200-other-pod"),
    pytest.param(
        Reply(404, b"<html>404 page not found</html>", {"Content-Type": "text/html"}),
        404,
        ["HTTP 404 without a Kubernetes Status body", "a Kubernetes API server?"],
        id="404-not-kubernetes",
    ),
    pytest.param(Reply(418, b""), 418, ["HTTP 418", "(empty body)"], id="418-empty"),
]


@pytest.mark.parametrize(("reply", "status", "words"), ERROR_CASES)
def test_errors_name_status_url_and_reason(api: ApiServer, reply: Reply, status: int, words: list[str]) -> None:
    api.routes[POD_PATH] = reply
    host = host_for(api)
    with pytest.raises(HostError) as info:
        host.get_pod_by_name(NS, NAME)
    err = info.value
    msg = str(err)
    for word in words:
        assert word in msg
    assert err.status == status
    assert err.url == api.url + POD_PATH
    assert f"{api.url}{POD_PATH}" in msg
    assert f"pod {NS}/{NAME}" in msg
    assert TOKEN not in msg
    assert host.last_error is err


def test_redirect_is_not_followed_and_token_not_forwarded(api: ApiServer) -> None:
    api.routes[POD_PATH] = Reply(302, b"", {"Location": f"{api.url}/stolen"})
    with pytest.raises(HostError, match=r"HTTP 302 .*redirect to .*/stolen not followed") as info:
        host_for(api).get_pod_by_name(NS, NAME)
    assert info.value.status == 302
    assert [r.path for r in api.requests] == [POD_PATH]


@pytest.mark.parametrize(
    "reply",
    [
        pytest.param(Reply(200, pod_json(), delay=5.0), id="slow-headers"),
        # Each byte arrives well within the socket timeout: only the overall deadline catches this.
        pytest.param(Reply(200, pod_json(), trickle=0.05), id="trickled-body"),
    ],
)
def test_slow_server_times_out(api: ApiServer, reply: Reply) -> None:
    api.routes[POD_PATH] = reply
    host = host_for(api, timeout=0.3)
    started = time.monotonic()
    with pytest.raises(HostError, match=r"timed out after 0\.3s") as info:
        host.get_pod_by_name(NS, NAME)
    # Without the overall deadline the call would last the reply's 5 s (or the whole trickle).
    assert time.monotonic() - started < 3.0
    assert info.value.url == api.url + POD_PATH


def test_connection_refused() -> None:
    # Bound but not listening: connections are refused, and nobody else can take the port meanwhile.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        host = KubeHost(settings=KubeSettings(server=f"http://127.0.0.1:{port}", source="t"), proxies={})
        with pytest.raises(HostError, match="connection refused") as info:
            host.get_pod_by_name(NS, NAME)
    assert f"http://127.0.0.1:{port}{POD_PATH}" in str(info.value)


def test_oversized_body_is_refused(api: ApiServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("netplugin.hosts.kubehttp.MAX_BODY", 1000)
    big = pod_json()
    big["metadata"]["annotations"]["filler"] = "x" * 5000
    api.routes[POD_PATH] = Reply(200, big)
    with pytest.raises(HostError, match="larger than 1000 bytes"):
        host_for(api).get_pod_by_name(NS, NAME)


# --- fallback ------------------------------------------------------------------------------------


def test_fallback_turns_errors_into_unknown_and_records_them(api: ApiServer) -> None:
    api.routes[POD_PATH] = Reply(403, status_json(403, "Forbidden", FORBIDDEN_MSG))
    host = host_for(api, fallback_on_error=True)
    assert host.get_pod_by_name(NS, NAME) is None
    assert isinstance(host.last_error, HostError)
    assert host.last_error.status == 403
    assert "forbidden" in str(host.last_error)
    # The next good answer clears it: last_error describes the latest lookup.
    api.routes[POD_PATH] = Reply(200, pod_json())
    pod = host.get_pod_by_name(NS, NAME)
    assert pod is not None and pod["metadata"]["name"] == NAME
    assert host.last_error is None


def test_fallback_covers_configuration_errors(tmp_path: Path) -> None:
    host = KubeHost(environ={"HOME": str(tmp_path)}, fallback_on_error=True)
    assert host.get_pod_by_name(NS, NAME) is None
    assert host.last_error is not None
    assert "no Kubernetes API configuration" in str(host.last_error)
    # Without the switch the same situation is an error.
    with pytest.raises(HostError, match="no Kubernetes API configuration"):
        KubeHost(environ={"HOME": str(tmp_path)}).get_pod_by_name(NS, NAME)


def test_fallback_covers_connection_refused() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        host = KubeHost(
            settings=KubeSettings(server=f"http://127.0.0.1:{port}", source="t"),
            proxies={},
            fallback_on_error=True,
        )
        assert host.get_pod_by_name(NS, NAME) is None
    assert host.last_error is not None and "connection refused" in str(host.last_error)


# --- configuration sources -----------------------------------------------------------------------


def test_kubeconfig_token_user(api: ApiServer, tmp_path: Path) -> None:
    kc = write_kubeconfig(tmp_path / "config", api.url, {"token": TOKEN})
    host = KubeHost(str(kc), proxies={}, environ={})
    pod = host.get_pod_by_name(NS, NAME)
    assert pod is not None and pod["metadata"]["labels"]["app"] == "web"
    assert api.requests[-1].headers["authorization"] == f"Bearer {TOKEN}"
    assert host.settings.namespace == NS
    assert str(kc) in host.settings.source


def test_kubeconfig_token_file_is_relative_and_reread(api: ApiServer, tmp_path: Path) -> None:
    (tmp_path / "tok").write_text("first-token\n")
    kc = write_kubeconfig(tmp_path / "config", api.url, {"tokenFile": "tok", "token": "inline-loses"})
    host = KubeHost(str(kc), proxies={}, environ={})
    host.get_pod_by_name(NS, NAME)
    assert api.requests[-1].headers["authorization"] == "Bearer first-token"
    # The kubelet rotates projected tokens; the next request must use the new one.
    (tmp_path / "tok").write_text("second-token\n")
    host.get_pod_by_name(NS, NAME)
    assert api.requests[-1].headers["authorization"] == "Bearer second-token"


def test_kubeconfig_anonymous_and_basic(api: ApiServer, tmp_path: Path) -> None:
    anon = write_kubeconfig(tmp_path / "anon", api.url, {})
    KubeHost(str(anon), proxies={}, environ={}).get_pod_by_name(NS, NAME)
    assert "authorization" not in api.requests[-1].headers
    basic = write_kubeconfig(tmp_path / "basic", api.url, {"username": "admin", "password": "s3cret"})
    KubeHost(str(basic), proxies={}, environ={}).get_pod_by_name(NS, NAME)
    expected = base64.b64encode(b"admin:s3cret").decode()
    assert api.requests[-1].headers["authorization"] == f"Basic {expected}"


def test_kubeconfig_context_choice_and_merge(api: ApiServer, tmp_path: Path) -> None:
    # KUBECONFIG=a:b: a names the current context and its cluster; b adds a user and a second context.
    a = {
        "current-context": "first",
        "clusters": [{"name": "c", "cluster": {"server": api.url}}],
        "users": [{"name": "u1", "user": {"token": "token-one"}}],
        "contexts": [{"name": "first", "context": {"cluster": "c", "user": "u1"}}],
    }
    b = {
        "current-context": "second",  # ignored: the first file to set it wins
        "users": [{"name": "u1", "user": {"token": "shadowed"}}, {"name": "u2", "user": {"token": "token-two"}}],
        "contexts": [{"name": "second", "context": {"cluster": "c", "user": "u2"}}],
    }
    (tmp_path / "a").write_text(json.dumps(a))
    (tmp_path / "b").write_text(json.dumps(b))
    env = {"KUBECONFIG": f"{tmp_path / 'missing'}:{tmp_path / 'a'}:{tmp_path / 'b'}"}
    KubeHost(proxies={}, environ=env).get_pod_by_name(NS, NAME)
    assert api.requests[-1].headers["authorization"] == "Bearer token-one"
    KubeHost(proxies={}, environ=env, context="second").get_pod_by_name(NS, NAME)
    assert api.requests[-1].headers["authorization"] == "Bearer token-two"


def _sa_dir(tmp_path: Path, ca_pem: bytes | None = None) -> Path:
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text(TOKEN)
    (sa / "namespace").write_text("kube-system\n")
    (sa / "ca.crt").write_bytes(ca_pem or b"")
    return sa


@pytest.mark.parametrize(
    ("arg", "env_kubeconfig", "in_cluster", "home", "expected"),
    [
        pytest.param(True, True, True, True, "arg", id="argument-first"),
        pytest.param(False, True, True, True, "env", id="then-KUBECONFIG"),
        pytest.param(False, False, True, True, "sa", id="then-in-cluster"),
        pytest.param(False, False, False, True, "home", id="then-home"),
    ],
)
def test_resolution_order(
    tmp_path: Path, arg: bool, env_kubeconfig: bool, in_cluster: bool, home: bool, expected: str
) -> None:
    files = {}
    for which in ("arg", "env", "home"):
        files[which] = write_kubeconfig(tmp_path / f"kc-{which}", f"http://{which}.invalid:1", {})
    (tmp_path / ".kube").mkdir()
    shutil.copy(files["home"], tmp_path / ".kube" / "config")
    sa = _sa_dir(tmp_path)
    env = {"HOME": str(tmp_path)}
    if env_kubeconfig:
        env["KUBECONFIG"] = str(files["env"])
    if in_cluster:
        env.update(KUBERNETES_SERVICE_HOST="10.96.0.1", KUBERNETES_SERVICE_PORT="443")
    s = resolve_settings(str(files["arg"]) if arg else None, environ=env, service_account_dir=str(sa))
    server = {"arg": "http://arg.invalid:1", "env": "http://env.invalid:1", "home": "http://home.invalid:1"}
    server["sa"] = "https://10.96.0.1:443"
    assert s.server == server[expected]


def test_in_cluster_ipv6_service_host(tmp_path: Path) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "fd00:10:96::1", "KUBERNETES_SERVICE_PORT": "443"}
    s = resolve_settings(environ=env, service_account_dir=str(_sa_dir(tmp_path)))
    assert s.server == "https://[fd00:10:96::1]:443"
    assert s.namespace == "kube-system"
    assert s.token_file == str(tmp_path / "serviceaccount" / "token")


BAD_KUBECONFIGS = [
    pytest.param("clusters: [\n  - name: c\n   bad", ["not valid YAML"], id="not-yaml"),
    pytest.param("- a\n- b\n", ["expected a mapping"], id="not-a-mapping"),
    pytest.param({"clusters": []}, ["no current-context"], id="no-current-context"),
    pytest.param({"current-context": "nope", "contexts": []}, ["context 'nope' not found"], id="unknown-context"),
    pytest.param(
        {"current-context": "x", "contexts": [{"name": "x", "context": {"cluster": "gone"}}]},
        ["cluster 'gone' not found"],
        id="unknown-cluster",
    ),
    pytest.param({"server": None}, ["cluster server is missing"], id="no-server"),
    pytest.param({"server": "ftp://h/"}, ["must be an http:// or https:// URL"], id="bad-scheme"),
    pytest.param({"server": "https://admin:hunter2@h:6443"}, ["must not contain credentials"], id="creds-in-url"),
    pytest.param({"user": {"exec": {"command": "aws"}}}, ["exec credentials are not supported"], id="exec-user"),
    pytest.param({"user": {"auth-provider": {"name": "oidc"}}}, ["auth-provider credentials"], id="auth-provider"),
    pytest.param(
        {"user": {"client-certificate-data": "!!notbase64!!", "client-key-data": "QUJD"}},
        ["client-certificate-data is not valid base64"],
        id="bad-base64",
    ),
    pytest.param(
        {"user": {"client-certificate": "/x.crt"}}, ["needs both the certificate and the key"], id="cert-no-key"
    ),
    pytest.param(
        {"cluster": {"insecure-skip-tls-verify": True, "certificate-authority": "/ca"}},
        ["together with insecure-skip-tls-verify"],
        id="ca-and-insecure",
    ),
]


@pytest.mark.parametrize(("content", "words"), BAD_KUBECONFIGS)
def test_bad_kubeconfig_is_a_clear_error(tmp_path: Path, content: Any, words: list[str]) -> None:
    path = tmp_path / "config"
    if isinstance(content, str):
        path.write_text(content)
    elif {"clusters", "contexts", "current-context"} & content.keys():
        path.write_text(json.dumps(content))
    else:
        cluster = {"server": "https://h:6443", **content.get("cluster", {})}
        if "server" in content:
            cluster["server"] = content["server"]
        write_kubeconfig(path, cluster.pop("server"), content.get("user", {}), cluster)
    host = KubeHost(str(path), environ={})
    with pytest.raises(HostError) as info:
        host.get_pod_by_name(NS, NAME)
    for word in words:
        assert word in str(info.value)
    assert str(path) in str(info.value)
    assert "hunter2" not in str(info.value)


def test_missing_kubeconfig_file(tmp_path: Path) -> None:
    with pytest.raises(HostError, match=r"cannot read kubeconfig .*nope: No such file"):
        load_kubeconfig(str(tmp_path / "nope"))
    with pytest.raises(HostError, match="KUBECONFIG names no existing file"):
        resolve_settings(environ={"KUBECONFIG": str(tmp_path / "nope")})


def test_in_cluster_needs_token_and_ca(tmp_path: Path) -> None:
    sa = _sa_dir(tmp_path)
    (sa / "ca.crt").unlink()
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    with pytest.raises(HostError, match=r"ca\.crt does not exist"):
        resolve_settings(environ=env, service_account_dir=str(sa))


def test_settings_repr_hides_secrets() -> None:
    s = KubeSettings(server="https://h", source="t", token=TOKEN, password="pw", client_key_data=b"KEY")
    assert TOKEN not in repr(s) and "pw" not in repr(s) and "KEY" not in repr(s)


def test_from_config_uses_kubeconfig_and_timeout(tmp_path: Path) -> None:
    from netplugin.core.config import Config

    host = KubeHost.from_config(Config(kubeconfig=str(tmp_path / "kc"), kube_timeout=0.7))
    assert host.kubeconfig == str(tmp_path / "kc")
    assert host.timeout == 0.7


# --- TLS, with certificates made by openssl ------------------------------------------------------


@dataclass
class Pki:
    dir: Path
    ca: Path
    server_crt: Path
    server_key: Path
    client_crt: Path
    client_key: Path
    other_ca: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    d = tmp_path_factory.mktemp("pki")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for ca in ("ca", "other-ca"):
        _openssl("req", "-x509", *ec, "-keyout", f"{ca}.key", "-out", f"{ca}.crt", "-days", "2",
                 "-subj", f"/CN={ca}", cwd=d)  # fmt: skip
    for leaf, ext in (
        ("server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"),
        ("client", "extendedKeyUsage=clientAuth\n"),
    ):
        cn = "kube-apiserver" if leaf == "server" else "system:node:np-test"
        _openssl("req", "-new", *ec, "-keyout", f"{leaf}.key", "-out", f"{leaf}.csr", "-subj", f"/CN={cn}", cwd=d)
        (d / f"{leaf}.ext").write_text(ext)
        _openssl("x509", "-req", "-in", f"{leaf}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{leaf}.crt", "-days", "2", "-extfile", f"{leaf}.ext", cwd=d)  # fmt: skip
    return Pki(d, d / "ca.crt", d / "server.crt", d / "server.key", d / "client.crt", d / "client.key",
               d / "other-ca.crt")  # fmt: skip


@pytest.fixture
def tls_api(pki: Pki) -> Iterator[ApiServer]:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki.server_crt, pki.server_key)
    ctx.load_verify_locations(pki.ca)
    ctx.verify_mode = ssl.CERT_OPTIONAL  # record a client certificate when one is offered
    server = ApiServer(tls=ctx)
    server.routes[POD_PATH] = Reply(200, pod_json())
    yield server
    server.close()


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def test_tls_with_ca_data_and_token(tls_api: ApiServer, pki: Pki, tmp_path: Path) -> None:
    kc = write_kubeconfig(tmp_path / "kc", tls_api.url, {"token": TOKEN}, {"certificate-authority-data": b64(pki.ca)})
    pod = KubeHost(str(kc), proxies={}, environ={}).get_pod_by_name(NS, NAME)
    assert pod is not None and pod["metadata"]["name"] == NAME
    assert tls_api.requests[-1].headers["authorization"] == f"Bearer {TOKEN}"
    assert tls_api.requests[-1].client_cn is None


def test_tls_client_certificate_data(
    tls_api: ApiServer, pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    user = {"client-certificate-data": b64(pki.client_crt), "client-key-data": b64(pki.client_key)}
    kc = write_kubeconfig(tmp_path / "kc", tls_api.url, user, {"certificate-authority-data": b64(pki.ca)})
    assert KubeHost(str(kc), proxies={}, environ={}).get_pod_by_name(NS, NAME) is not None
    assert tls_api.requests[-1].client_cn == "system:node:np-test"
    assert "authorization" not in tls_api.requests[-1].headers
    # The decoded key went to a private temp file that is gone once loaded.
    assert list(scratch.iterdir()) == []


def test_tls_client_certificate_files_relative_to_kubeconfig(tls_api: ApiServer, pki: Pki) -> None:
    kc_dir = pki.dir / "kc"
    kc_dir.mkdir(exist_ok=True)
    user = {"client-certificate": "../client.crt", "client-key": "../client.key"}
    kc = write_kubeconfig(kc_dir / "config", tls_api.url, user, {"certificate-authority": "../ca.crt"})
    assert KubeHost(str(kc), proxies={}, environ={}).get_pod_by_name(NS, NAME) is not None
    assert tls_api.requests[-1].client_cn == "system:node:np-test"


def test_tls_wrong_ca_is_refused(tls_api: ApiServer, pki: Pki, tmp_path: Path) -> None:
    kc = write_kubeconfig(tmp_path / "kc", tls_api.url, {"token": TOKEN}, {"certificate-authority": str(pki.other_ca)})
    with pytest.raises(HostError, match="TLS certificate verification failed") as info:
        KubeHost(str(kc), proxies={}, environ={}).get_pod_by_name(NS, NAME)
    assert tls_api.url in str(info.value)
    assert tls_api.requests == []  # the token never left


def test_tls_insecure_skip_verify(tls_api: ApiServer, tmp_path: Path) -> None:
    kc = write_kubeconfig(tmp_path / "kc", tls_api.url, {"token": TOKEN}, {"insecure-skip-tls-verify": True})
    assert KubeHost(str(kc), proxies={}, environ={}).get_pod_by_name(NS, NAME) is not None


def test_in_cluster_service_account(tls_api: ApiServer, pki: Pki, tmp_path: Path) -> None:
    sa = _sa_dir(tmp_path, pki.ca.read_bytes())
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(tls_api.port)}
    host = KubeHost(environ=env, service_account_dir=str(sa), proxies={})
    pod = host.get_pod_by_name(NS, NAME)
    assert pod is not None and pod["metadata"]["annotations"]["netplugin.io/bandwidth"] == "10M"
    assert tls_api.requests[-1].headers["authorization"] == f"Bearer {TOKEN}"
    assert host.settings.namespace == "kube-system"
    assert "in-cluster service account" in host.settings.source


# --- lightkube, only on request ------------------------------------------------------------------


def test_kube_client_is_a_working_lightkube_client(api: ApiServer, tmp_path: Path) -> None:
    pytest.importorskip("lightkube")
    from lightkube.resources.core_v1 import Pod

    kc = write_kubeconfig(tmp_path / "kc", api.url, {"token": TOKEN})
    host = KubeHost(str(kc), proxies={}, environ={})
    client = host.kube_client()
    assert client is host.kube_client()  # built once
    pod = client.get(Pod, name=NAME, namespace=NS)
    assert pod.metadata.labels == {"app": "web", "pod-template-hash": "7d4b9c8f5"}
    assert api.requests[-1].path == POD_PATH
    assert api.requests[-1].headers["authorization"] == f"Bearer {TOKEN}"


def test_kube_client_over_tls_with_client_cert_data(tls_api: ApiServer, pki: Pki, tmp_path: Path) -> None:
    pytest.importorskip("lightkube")
    from lightkube.resources.core_v1 import Pod

    user = {"client-certificate-data": b64(pki.client_crt), "client-key-data": b64(pki.client_key)}
    kc = write_kubeconfig(tmp_path / "kc", tls_api.url, user, {"certificate-authority-data": b64(pki.ca)})
    client = KubeHost(str(kc), proxies={}, environ={}).kube_client()
    assert client.get(Pod, name=NAME, namespace=NS).metadata.name == NAME
    assert tls_api.requests[-1].client_cn == "system:node:np-test"


def test_kube_client_without_lightkube(api: ApiServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "lightkube", None)  # makes "import lightkube" raise ImportError
    with pytest.raises(HostError, match=r"needs lightkube.*netplugin\[daemon\]"):
        host_for(api).kube_client()
    fallback = host_for(api, fallback_on_error=True)
    assert fallback.kube_client() is None
    assert fallback.last_error is not None and "lightkube" in str(fallback.last_error)


def test_cli_path_never_imports_lightkube(api: ApiServer, tmp_path: Path) -> None:
    kc = write_kubeconfig(tmp_path / "kc", api.url, {"token": TOKEN})
    script = textwrap.dedent(
        f"""
        import json, sys
        from netplugin.hosts.kube import KubeHost
        pod = KubeHost({str(kc)!r}, proxies={{}}).get_pod_by_name({NS!r}, {NAME!r})
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("lightkube", "httpx2", "httpx", "msgspec"))
        print(json.dumps({{"labels": pod["metadata"]["labels"], "heavy": heavy}}))
        """
    )
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env.update(PYTHONPATH=str(REPO), NO_PROXY="127.0.0.1")
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["labels"]["app"] == "web"
    assert result["heavy"] == []
    assert api.requests[-1].headers["authorization"] == f"Bearer {TOKEN}"
