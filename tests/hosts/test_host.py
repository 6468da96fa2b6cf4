"""netplugin.hosts: where pod objects come from (StaticHost manifests, FakeHost, NullHost)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from netplugin.core.config import Config
from netplugin.core.errors import HostError
from netplugin.hosts import make_host
from netplugin.hosts.base import ClusterHost, Host, NullHost
from netplugin.hosts.kube import KubeHost
from netplugin.hosts.kubeconfig import KubeSettings
from netplugin.hosts.static import MAX_MANIFEST_BYTES, StaticHost, load_manifest
from tests.support.fakehost import FakeHost

WEB_YAML = """\
apiVersion: v1
kind: Pod
metadata:
  name: web-0
  namespace: shop
  labels: {app: web}
spec:
  containers: [{name: web, image: nginx}]
"""

DB_JSON = json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "db-0", "namespace": "shop"}})


@pytest.fixture
def pods(tmp_path: Path) -> Path:
    d = tmp_path / "pods"
    d.mkdir()
    return d


@pytest.mark.parametrize(
    ("filename", "content", "ns", "name"),
    [
        ("web.yaml", WEB_YAML, "shop", "web-0"),
        ("web.yml", WEB_YAML, "shop", "web-0"),
        ("db.json", DB_JSON, "shop", "db-0"),
        ("plain.yaml", "kind: Pod\nmetadata: {name: plain}\n", "default", "plain"),  # namespace defaults
        ("nokind.yaml", "metadata: {name: nokind, namespace: x}\n", "x", "nokind"),  # kind defaults to Pod
    ],
)
def test_static_host_finds_pods_by_namespace_and_name(
    pods: Path, filename: str, content: str, ns: str, name: str
) -> None:
    (pods / filename).write_text(content)
    host = StaticHost(str(pods))
    pod = host.get_pod_by_name(ns, name)
    assert pod is not None
    assert pod["metadata"]["name"] == name
    assert pod["metadata"]["namespace"] == ns


def test_static_host_matches_both_namespace_and_name(pods: Path) -> None:
    (pods / "web.yaml").write_text(WEB_YAML)
    (pods / "db.json").write_text(DB_JSON)
    host = StaticHost(str(pods))
    assert host.get_pod_by_name("shop", "web-0")["metadata"]["labels"] == {"app": "web"}  # type: ignore[index]
    assert host.get_pod_by_name("shop", "db-0")["metadata"]["name"] == "db-0"  # type: ignore[index]
    assert host.get_pod_by_name("default", "web-0") is None
    assert host.get_pod_by_name("shop", "web-1") is None


def test_static_host_ignores_files_without_a_manifest_suffix(pods: Path) -> None:
    (pods / "web.yaml.bak").write_text("not: [yaml")
    (pods / "notes.txt").write_text(WEB_YAML)
    assert StaticHost(str(pods)).get_pod_by_name("shop", "web-0") is None


def test_unreadable_manifest_is_said_rather_than_skipped(pods: Path) -> None:
    (pods / "sub.yaml").mkdir()
    with pytest.raises(HostError) as info:
        StaticHost(str(pods)).get_pod_by_name("shop", "web-0")
    assert str(pods / "sub.yaml") in info.value.message


def test_static_host_reads_changes_without_restart(pods: Path) -> None:
    host = StaticHost(str(pods))
    assert host.get_pod_by_name("shop", "web-0") is None
    (pods / "web.yaml").write_text(WEB_YAML)
    assert host.get_pod_by_name("shop", "web-0") is not None


def test_missing_dir_knows_no_pods(tmp_path: Path) -> None:
    host = StaticHost(str(tmp_path / "missing"))
    assert host.get_pod_by_name("default", "web-0") is None
    assert host.list_pods() == []
    assert host.kube_client() is None


def test_unreadable_dir_is_a_host_error(tmp_path: Path) -> None:
    f = tmp_path / "a-file"
    f.write_text("")
    with pytest.raises(HostError) as info:
        StaticHost(str(f)).get_pod_by_name("default", "web-0")
    assert str(f) in info.value.message


def test_broken_manifest_of_another_pod_does_not_hide_a_good_one(pods: Path) -> None:
    (pods / "a-broken.yaml").write_text("metadata: {name: [unclosed\n")
    (pods / "web.yaml").write_text(WEB_YAML)
    (pods / "z-broken.json").write_text("{")
    pod = StaticHost(str(pods)).get_pod_by_name("shop", "web-0")
    assert pod is not None and pod["metadata"]["name"] == "web-0"


def test_broken_manifest_that_may_be_the_pods_is_a_host_error_naming_the_file(pods: Path) -> None:
    broken = pods / "broken.yaml"
    broken.write_text("metadata: {name: other, labels: [unclosed\n")
    (pods / "web.yaml").write_text(WEB_YAML)
    with pytest.raises(HostError) as info:
        StaticHost(str(pods)).get_pod_by_name("shop", "other")
    assert str(broken) in info.value.message
    assert "shop/other not found" in info.value.message


def test_broken_manifest_never_blocks_a_pod_it_does_not_name(pods: Path) -> None:
    # issue 13: one broken file used to fail the setup of every pod without a manifest
    (pods / "broken.yaml").write_text("metadata: {name: other, labels: [unclosed\n")
    (pods / "deep.yaml").write_text("[" * 100_000)  # segfaulted libyaml's composer
    (pods / "deep.json").write_text("[" * 100_000)  # RecursionError: exit 70
    (pods / "bomb.yaml").write_text(
        'a: &a ["x","x","x","x","x","x","x","x","x"]\n'
        + "".join(f"b{i}: &b{i} [" + ",".join([f"*{'a' if i == 0 else f'b{i - 1}'}"] * 9) + "]\n" for i in range(8))
    )
    (pods / "dup.yaml").write_text("kind: Pod\nmetadata: {name: dup}\nmetadata: {name: web-1}\n")
    host = StaticHost(str(pods))
    assert host.get_pod_by_name("shop", "nowhere") is None
    (pods / "web.yaml").write_text(WEB_YAML)
    pod = host.get_pod_by_name("shop", "web-0")
    assert pod is not None and pod["metadata"]["name"] == "web-0"
    with pytest.raises(HostError, match="duplicate key 'metadata'"):
        host.get_pod_by_name("default", "web-1")


def test_fifo_or_oversized_manifest_never_blocks_a_lookup(pods: Path) -> None:
    os.mkfifo(pods / "fifo.yaml")  # nobody writes: open() alone would block for ever
    (pods / "big.yaml").write_text("kind: Pod\nmetadata: {name: big}\n# " + "x" * MAX_MANIFEST_BYTES + "\n")
    (pods / "web.yaml").write_text(WEB_YAML)
    host = StaticHost(str(pods))
    assert host.get_pod_by_name("shop", "web-0") is not None
    with pytest.raises(HostError) as info:
        host.get_pod_by_name("default", "big")  # cannot be read: might be anyone's, so said
    assert "fifo.yaml: it is not a regular file" in info.value.message
    assert f"big.yaml: it is larger than the limit of {MAX_MANIFEST_BYTES} bytes" in info.value.message


@pytest.mark.parametrize(
    ("filename", "content", "words"),
    [
        ("bad.yaml", "metadata: {name: [x\n", "is not valid YAML"),
        ("bad.json", "{'single': 'quotes'}", "is not valid JSON"),
        ("list.yaml", "- a\n", "expected a Pod object, got list"),
        ("empty.yaml", "", "expected a Pod object, got NoneType"),
        ("svc.yaml", "kind: Service\nmetadata: {name: s}\n", "kind must be 'Pod', got 'Service'"),
        ("noname.yaml", "kind: Pod\nmetadata: {namespace: x}\n", "metadata.name is missing"),
        ("numname.yaml", "kind: Pod\nmetadata: {name: 3}\n", "metadata.name is missing or not a string"),
        ("nometa.yaml", "kind: Pod\n", "metadata.name is missing"),
        ("badns.yaml", "kind: Pod\nmetadata: {name: a, namespace: ''}\n", "metadata.namespace must be"),
        ("unsafe.yaml", "kind: !!python/object/apply:os.system ['true']\n", "is not valid YAML"),
        ("deep.yaml", "[" * 100_000, "nested more than 100 levels deep"),
        ("deep.json", "[" * 100_000, "nested more than 100 levels deep"),
        ("dup.json", '{"kind": "Pod", "kind": "Pod"}', "duplicate key 'kind'"),
        ("dup.yaml", "kind: Pod\nmetadata: {name: a}\nkind: Pod\n", "duplicate key 'kind' (first on line 1) (line 3"),
    ],
)
def test_load_manifest_errors_name_the_file(pods: Path, filename: str, content: str, words: str) -> None:
    p = pods / filename
    p.write_text(content)
    with pytest.raises(HostError) as info:
        load_manifest(str(p))
    assert str(p) in info.value.message
    assert words in info.value.message


def test_load_manifest_missing_file(tmp_path: Path) -> None:
    with pytest.raises(HostError, match="cannot read pod manifest"):
        load_manifest(str(tmp_path / "gone.yaml"))


def test_list_pods(pods: Path) -> None:
    (pods / "web.yaml").write_text(WEB_YAML)
    (pods / "db.json").write_text(DB_JSON)
    assert sorted(p["metadata"]["name"] for p in StaticHost(str(pods)).list_pods()) == ["db-0", "web-0"]


# --- FakeHost and NullHost ----------------------------------------------------------------------------------


def test_fake_host_returns_pods_and_records_lookups() -> None:
    pod = {"kind": "Pod", "metadata": {"namespace": "shop", "name": "web-0"}}
    client = object()
    host = FakeHost({("shop", "web-0"): pod}, client=client)
    host.add({"kind": "Pod", "metadata": {"name": "plain"}})
    assert host.get_pod_by_name("shop", "web-0") is pod
    assert host.get_pod_by_name("default", "plain") is not None
    assert host.get_pod_by_name("shop", "nope") is None
    assert host.lookups == [("shop", "web-0"), ("default", "plain"), ("shop", "nope")]
    assert host.kube_client() is client


def test_null_host_knows_nothing() -> None:
    host = NullHost()
    assert host.get_pod_by_name("default", "web-0") is None
    assert host.kube_client() is None


@pytest.mark.parametrize("host", [NullHost(), FakeHost(), StaticHost("/nonexistent")], ids=lambda h: type(h).__name__)
def test_hosts_satisfy_the_protocol(host: Any) -> None:
    assert isinstance(host, Host)


@pytest.mark.parametrize(("kind", "cls"), [("none", NullHost), ("static", StaticHost)])
def test_make_host(kind: str, cls: type, tmp_path: Path) -> None:
    host = make_host(Config(host=kind, pods_dir=str(tmp_path)))
    assert type(host) is cls
    if isinstance(host, StaticHost):
        assert host.directory == str(tmp_path)


def test_make_host_kube() -> None:
    host = make_host(Config(host="kube", kubeconfig="/nonexistent/kubeconfig"))
    assert type(host).__name__ == "KubeHost"
    assert isinstance(host, Host)


# --- nodes (issue 11): this node and the cluster's, from each kind of host ---------------------------

NODE2_YAML = """\
kind: Node
metadata: {name: node-2}
spec: {podCIDRs: [10.206.130.0/24, "fd6e:7031:1a00:8002::/64"]}
status:
  addresses:
    - {type: Hostname, address: node-2}
    - {type: InternalIP, address: 10.206.0.12}
"""


def test_static_host_nodes_from_files(tmp_path: Path) -> None:
    from netplugin.core.node import NodeInfo

    nodes = tmp_path / "nodes"
    nodes.mkdir()
    (nodes / "node-2.yaml").write_text(NODE2_YAML)
    (nodes / "node-1.json").write_text(
        json.dumps({"kind": "Node", "metadata": {"name": "node-1"}, "spec": {"podCIDR": "10.206.129.0/24"}})
    )
    (nodes / "README").write_text("not a manifest")
    host = StaticHost(str(tmp_path / "pods"), nodes_dir=str(nodes), node_name="node-1")
    assert host.list_nodes() == [
        NodeInfo("node-1", ("10.206.129.0/24",)),
        NodeInfo("node-2", ("10.206.130.0/24", "fd6e:7031:1a00:8002::/64"), ("10.206.0.12",)),
    ]
    assert host.node_info() == NodeInfo("node-1", ("10.206.129.0/24",))
    assert StaticHost(str(tmp_path), nodes_dir=str(nodes), node_name="node-9").node_info() == NodeInfo("node-9")
    assert StaticHost(str(tmp_path), nodes_dir=str(tmp_path / "absent")).list_nodes() == []


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("kind: Pod\nmetadata: {name: x}\n", ["node manifest", "kind must be 'Node'"]),
        ("kind: Node\nmetadata: {name: x}\nspec: {podCIDRs: [10.0.0.1/8]}\n", ["spec.podCIDRs[0]", "not a network"]),
        ("kind: Node\nmetadata: [\n", ["node manifest", "not valid YAML"]),
    ],
)
def test_static_host_broken_node_file_is_an_error(tmp_path: Path, text: str, words: list[str]) -> None:
    (tmp_path / "bad.yaml").write_text(text)
    with pytest.raises(HostError) as info:
        StaticHost(str(tmp_path), nodes_dir=str(tmp_path)).list_nodes()
    for w in [*words, str(tmp_path / "bad.yaml")]:
        assert w in info.value.message


def test_static_host_same_node_twice_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(NODE2_YAML)
    (tmp_path / "b.yaml").write_text(NODE2_YAML)
    with pytest.raises(HostError, match="node 'node-2' is described twice"):
        StaticHost(str(tmp_path), nodes_dir=str(tmp_path)).list_nodes()


def test_null_and_fake_hosts_know_the_node(monkeypatch: pytest.MonkeyPatch) -> None:
    from netplugin.core.node import NodeInfo

    monkeypatch.setenv("NODE_NAME", "from-env")
    assert NullHost().node_info() == NodeInfo("from-env") and NullHost().list_nodes() == []
    assert NullHost("cfg").node_name == "cfg"
    me = NodeInfo("fake-node", ("10.206.129.0/24",), ("10.206.0.11",))
    fake = FakeHost(nodes=[NodeInfo("b"), me])
    assert fake.node_info() == me and [n.name for n in fake.list_nodes()] == ["b", "fake-node"]
    assert isinstance(fake, Host)


def test_make_host_passes_the_node_settings(tmp_path: Path) -> None:
    host = make_host(Config(host="static", pods_dir=str(tmp_path), nodes_dir=str(tmp_path), node_name="n7"))
    assert isinstance(host, StaticHost) and host.nodes_dir == str(tmp_path) and host.node_name == "n7"
    assert make_host(Config(host="none", node_name="n8")).node_name == "n8"


# --- kubeconfigs are bounded the same way (issue 13) --------------------------------------------------------


def test_hostile_kubeconfigs_are_host_errors(tmp_path: Path) -> None:
    from netplugin.hosts.kubeconfig import load_kubeconfig

    deep = tmp_path / "deep"
    deep.write_text("clusters: " + "[" * 100_000 + "\n")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # a plain open() would wait for a writer for ever
    dup = tmp_path / "dup"
    dup.write_text("current-context: a\ncurrent-context: b\n")
    for path, words in ((deep, "nested more than 100"), (fifo, "not a regular file"), (dup, "duplicate key")):
        with pytest.raises(HostError) as info:
            load_kubeconfig(str(path))
        assert str(path) in info.value.message and words in info.value.message


@pytest.mark.parametrize(
    ("make", "cluster"),
    [
        pytest.param(lambda d: NullHost(), False, id="null"),
        pytest.param(lambda d: StaticHost(str(d)), False, id="static"),
        pytest.param(lambda d: FakeHost(), False, id="fake"),
        pytest.param(
            lambda d: KubeHost(settings=KubeSettings(server="http://127.0.0.1:1", source="t"), proxies={}, environ={}),
            True,
            id="kube",
        ),
    ],
)
def test_only_a_watching_host_is_a_cluster_host(tmp_path: Path, make: Callable[[Path], Host], cluster: bool) -> None:
    """The daemon's node keeper watches through ClusterHost's declared members, and polls every other Host."""
    from netplugin.agent.nodekeeper import NodeKeeper

    host = make(tmp_path)
    assert isinstance(host, Host)
    assert isinstance(host, ClusterHost) is cluster
    keeper = NodeKeeper(Config(node_routes=False), host)
    assert keeper.watching is cluster and (keeper.cluster is host) is cluster
