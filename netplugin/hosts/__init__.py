"""Hosts: where pods (and, for plugins that want one, a kube client) come from.

* :mod:`.base`   the :class:`Host` protocol, :class:`ClusterHost`, :class:`NullHost`;
* :mod:`.static` pod manifests in a directory, for nodes without an API server;
* :mod:`.kube`   a real API server (settings from :mod:`.kubeconfig`), imported only when chosen.
"""

from __future__ import annotations

# Imports inside this module's functions are kept for the per-call import set
# (tests/frontends/fastpath.py): each keeps a module off the calls that do not need it
# (BENCHMARKS.md rows B-i and B: the CLI's cold start and per-pod run without a daemon).
from typing import TYPE_CHECKING

from netplugin.hosts.base import ClusterHost, Host, NullHost
from netplugin.hosts.static import StaticHost

if TYPE_CHECKING:
    from netplugin.core.config import Config

__all__ = ["ClusterHost", "Host", "NullHost", "StaticHost", "make_host"]


def make_host(config: Config) -> Host:
    """The Host the config asks for."""
    if config.host == "none":
        return NullHost(config.node_name)
    if config.host == "kube":
        from netplugin.hosts.kube import KubeHost

        host: Host = KubeHost(kubeconfig=config.kubeconfig, timeout=config.kube_timeout, node_name=config.node_name)
        return host
    return StaticHost(config.pods_dir, nodes_dir=config.nodes_dir, node_name=config.node_name)
