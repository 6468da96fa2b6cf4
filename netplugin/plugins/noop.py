"""``kubernetes.io/no-op``: the kubelet's default plugin, which does nothing."""

from __future__ import annotations

from netplugin.core.names import PodRef
from netplugin.core.plugin import NOOP_NAME, CallContext, PodNetworkStatus

__all__ = ["NoopPlugin"]


class NoopPlugin:
    """``kubernetes.io/no-op``: succeeds at everything, reports no status."""

    name = NOOP_NAME

    def version(self) -> str:
        return "builtin:no-op:1"

    def version_key(self) -> None:
        return None

    def init(self, ctx: CallContext) -> None:
        return None

    def setup(self, pod: PodRef, ctx: CallContext) -> None:
        return None

    def teardown(self, pod: PodRef, ctx: CallContext) -> None:
        return None

    def status(self, pod: PodRef, ctx: CallContext) -> PodNetworkStatus | None:
        return None

    def repair(self, pod: PodRef, ctx: CallContext) -> tuple[str, ...]:
        return ()

    def node(self, ctx: CallContext) -> tuple[str, ...]:
        return ()
