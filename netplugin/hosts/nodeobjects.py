"""Node objects -> :class:`~netplugin.core.node.NodeInfo`, each parsed and each refusal logged once per revision.

The daemon reads every Node of the cluster after every Node event (heartbeats included): a
cluster of 5,000 nodes with a few hundred broken ones would otherwise log each broken one on
every pass (thousands of lines within seconds) and parse every unchanged object again.
:class:`NodeParser` remembers, per node name, the revision it last parsed and the outcome, logs
a refusal when it appears or changes, and says "resolved" when the node becomes good or goes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from netplugin.core.errors import HostError
from netplugin.core.node import NodeInfo

__all__ = ["NodeParser"]

log = logging.getLogger("netplugin.nodes")


class NodeParser:
    """Parses Node objects with a cache keyed by (name, resourceVersion); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # name -> (resourceVersion, NodeInfo or the refusal's message)
        self._cache: dict[str, tuple[str, NodeInfo | str]] = {}

    def parse(self, objs: Iterable[Mapping[str, Any]]) -> list[NodeInfo]:
        """The good nodes of ``objs`` sorted by name; the bad ones are logged when new and left out."""
        out: list[NodeInfo] = []
        seen: set[str] = set()
        with self._lock:
            for obj in objs:
                meta = obj.get("metadata")
                name = meta.get("name") if isinstance(meta, Mapping) else None
                rv = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
                key = name if isinstance(name, str) else ""
                cached = self._cache.get(key) if isinstance(rv, str) and rv and key else None
                if cached is not None and cached[0] == rv and key not in seen:
                    outcome = cached[1]
                else:
                    outcome = self._parse_one(obj, key, rv, cached)
                seen.add(key)
                if isinstance(outcome, NodeInfo):
                    out.append(outcome)
            for name in set(self._cache) - seen:
                _, outcome = self._cache.pop(name)
                if isinstance(outcome, str):
                    log.info("resolved: node %s is gone (it was ignored: %s)", name, outcome)
        return sorted(out, key=lambda n: n.name)

    def _parse_one(
        self, obj: Mapping[str, Any], key: str, rv: object, cached: tuple[str, NodeInfo | str] | None
    ) -> NodeInfo | str:
        try:
            outcome: NodeInfo | str = NodeInfo.from_node(obj)
        except HostError as e:
            outcome = e.message
        before = cached[1] if cached is not None else self._cache.get(key, ("", None))[1]
        if isinstance(outcome, str) and outcome != before:
            log.warning("ignoring a node: %s", outcome)
        elif isinstance(outcome, NodeInfo) and isinstance(before, str):
            log.info("resolved: node %s can be read again", key)
        if key:
            self._cache[key] = (rv if isinstance(rv, str) else "", outcome)
        return outcome

    def problems(self) -> list[tuple[str, str]]:
        """(node name, why it is ignored) for every node that did not parse, as of the last :meth:`parse`."""
        with self._lock:
            return sorted((name, o) for name, (_, o) in self._cache.items() if isinstance(o, str))
