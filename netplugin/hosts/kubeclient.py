"""The lightkube client of :meth:`netplugin.hosts.kube.KubeHost.kube_client` (for plugins that want one).

Its own module so that lightkube's costly import is paid only by the callers that build one.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from netplugin.core.errors import HostError
from netplugin.hosts.kubeconfig import KubeSettings

__all__ = ["lightkube_client"]


def lightkube_client(s: KubeSettings, timeout: float, proxies: Mapping[str, str] | None) -> Any:
    """A lightkube ``Client`` with the same settings as the stdlib transport. HostError when it cannot be built."""
    try:
        import httpx2
        from lightkube import Client
        from lightkube.config.kubeconfig import KubeConfig
        from lightkube.config.models import Cluster, User
    except ImportError as e:
        raise HostError(
            f"a Kubernetes client needs lightkube, which is not importable ({e}); "
            "install netplugin[daemon] (lightkube>=1.0,<2)"
        ) from e

    def b64(data: bytes | None) -> str | None:
        return base64.b64encode(data).decode("ascii") if data else None

    cluster = Cluster(
        server=s.server,
        certificate_auth=s.ca_file,
        certificate_auth_data=b64(s.ca_data),
        insecure=s.insecure,
    )
    # lightkube asserts a user exists even for anonymous access, hence User() rather than None.
    user = User(
        token=s.token,
        token_file=s.token_file,
        username=s.username,
        password=s.password,
        client_cert=s.client_cert_file,
        client_key=s.client_key_file,
        client_cert_data=b64(s.client_cert_data),
        client_key_data=b64(s.client_key_data),
    )
    config = KubeConfig.from_one(cluster=cluster, user=user, namespace=s.namespace)
    proxy = s.proxy_url
    if proxy is None and proxies:
        proxy = proxies.get("https") or proxies.get("http")
    try:
        return Client(
            config=config,
            timeout=httpx2.Timeout(timeout),
            trust_env=proxies is None,
            proxy=proxy,
        )
    except Exception as e:  # lightkube raises assorted types (ConfigError, KeyError, ssl errors)
        raise HostError(f"{s.source}: cannot build a lightkube client: {type(e).__name__}: {e}") from e
