"""What the host tests share: no proxy for 127.0.0.1, and the simulated API server the watch tests list and watch."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from netplugin.frontends.lab.simcluster.apiserver import ApiServer
from netplugin.hosts.kube import KubeHost
from netplugin.hosts.kubeconfig import KubeSettings


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    # A developer's or CI's proxy must never see 127.0.0.1 traffic (lightkube reads these too).
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


@pytest.fixture
def api() -> Iterator[ApiServer]:
    """The simulated API server (bookmarks every 0.2 s); test_kube.py has a scripted one of its own."""
    server = ApiServer(bookmark_interval=0.2)
    yield server
    server.close()


def host_for(api: ApiServer, node: str = "n1") -> KubeHost:
    """A KubeHost of ``node`` talking to ``api``, with no proxy and no environment."""
    return KubeHost(settings=KubeSettings(server=api.url, source="test"), proxies={}, environ={}, node_name=node)
