"""``nodes``: this node, the cluster's nodes, and the routes the daemon keeps to them."""

from __future__ import annotations

from typing import Any

from netplugin.agent.problems import NodeProblem
from netplugin.frontends.cli.context import LOCAL, State, pass_state
from netplugin.frontends.cli.options import command

__all__ = ["nodes"]


@command()
@pass_state
def nodes(st: State) -> None:
    """Show this node, the cluster's nodes, the routes the daemon keeps to them and what it cannot route.

    \b
    Examples:
      netplugin nodes
      netplugin nodes -o yaml
    """
    remote = st.daemon("health")
    if remote is not LOCAL:
        info = remote["node"]
    else:
        host = st.manager.host
        me = st.manager.node()
        cluster = host.list_nodes()
        info = {**me.to_dict(), "nodes": len(cluster), "daemon": None, "cluster": [n.to_dict() for n in cluster]}
    st.emit(info, _nodes_text(info))


def _nodes_text(info: dict[str, Any]) -> str:
    lines = [
        f"node {info['name']}: pod CIDRs {', '.join(info['pod_cidrs']) or '(none)'}; "
        f"InternalIPs {', '.join(info['internal_ips']) or '(none)'}",
        f"nodes in the cluster: {info.get('nodes') if info.get('nodes') is not None else '(not read yet)'}",
    ]
    if "daemon" in info:
        lines.append("no daemon runs: routes and egress are kept by `netplugin serve`")
        lines += [
            f"  {n['name']:<24} {', '.join(n['pod_cidrs']):<40} {', '.join(n['internal_ips'])}" for n in info["cluster"]
        ]
        return "\n".join(lines)
    if info.get("error"):
        lines.append(f"error: {info['error']}")
    if not info.get("routes_enabled"):
        lines.append("routes: off (node_routes: false)")
    routes = info.get("routes") or []
    lines.append(f"routes ({len(routes)}):")
    lines += [f"  {r['dst']:<28} via {r['via']:<28} {r['node']}" for r in routes]
    problems = info.get("problems") or []
    if problems:
        lines.append(f"problems ({len(problems)}):")
        lines += [f"  {NodeProblem.from_dict(p).text()}" for p in problems]
    return "\n".join(lines)
