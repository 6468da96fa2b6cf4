"""The network plugin contract's types: what a plugin is, gets and answers (implementations live elsewhere).

The contract itself is written once, in ``docs/plugin-contract.md`` (mirrored for plugin authors in
``exec_plugins/README.md``): the exec dir's layout and trust, each action's argv, environment,
stdin, exit status and output (the status and setup documents), time limits, the opt-in
``repair`` and ``node`` actions, chains, and built-in plugins. This module holds what code needs
of it: :class:`Plugin` (a built-in implements it; an exec plugin is wrapped in one), the
:class:`CallContext` each call gets, the :class:`PodNetworkStatus` a plugin answers, the
:class:`Action` names and :data:`REPAIR_KINDS`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from netplugin.core.defaults import DEFAULT_KILL_GRACE, DEFAULT_MAX_OUTPUT
from netplugin.core.names import PodRef
from netplugin.core.node import NodeInfo
from netplugin.core.plaindata import dataclass, field

if TYPE_CHECKING:
    from netplugin.core.config import Config

__all__ = [
    "NOOP_NAME",
    "REPAIR_KINDS",
    "Action",
    "CallContext",
    "Plugin",
    "PluginFactory",
    "PodNetworkStatus",
    "RepairKind",
]

NOOP_NAME = "kubernetes.io/no-op"

class RepairKind(enum.StrEnum):
    """What a repair put back: node-level objects the daemon keeps itself (routes, egress and
    hostPort tables) and pod-level ones a member's ``repair`` reports as ``KIND: what``."""

    ROUTE = "route"
    EGRESS = "egress"
    HOSTPORT = "hostport"
    BRIDGE = "bridge"
    PORT = "port"
    QDISC = "qdisc"
    OTHER = "other"


#: every repair kind's name (a member's ``KIND:`` outside it counts as ``other``)
REPAIR_KINDS = frozenset(k.value for k in RepairKind)


class Action(enum.Enum):
    INIT = "init"
    SETUP = "setup"
    TEARDOWN = "teardown"
    STATUS = "status"
    REPAIR = "repair"
    NODE = "node"


@dataclass(frozen=True, slots=True)
class PodNetworkStatus:
    """What ``status`` reports: the pod's IP address, and with dual stack one per family."""

    ip: str
    #: every address, ``ip`` first, at most one per family (Kubernetes' podIPs); () means ``(ip,)``
    ips: tuple[str, ...] = ()
    #: the host-side interface the plugin created for the pod (reported by ``setup``, for later members)
    host_interface: str | None = None
    #: the MAC address of the pod's interface, when the plugin's ``setup`` knows it (``aa:bb:...``,
    #: lower case): the CNI result needs it, and reading it again means entering the netns once more.
    #: Part of the setup document only (``"mac"``), not of the status document.
    mac: str | None = None

    def __post_init__(self) -> None:
        if not self.ips:
            object.__setattr__(self, "ips", (self.ip,))

    def to_dict(self) -> dict[str, Any]:
        """The status document; ``ips`` only when there is more than the one address ``ip``."""
        out: dict[str, Any] = {"apiVersion": "v1beta1", "kind": "PodNetworkStatus", "ip": self.ip}
        if len(self.ips) > 1:
            out["ips"] = list(self.ips)
        if self.host_interface:
            out["hostInterface"] = self.host_interface
        return out


@dataclass(frozen=True)
class CallContext:
    """Everything a plugin gets for one call besides the pod triple."""

    netns: str = ""
    pod: Mapping[str, Any] | None = None
    timeout: float = 30.0
    #: the environment an exec plugin would get, minus the per-call NETPLUGIN_* variables;
    #: built-in plugins read their settings (for example NETPLUGIN_BRIDGE_SUBNET) from here
    env: Mapping[str, str] = field(default_factory=dict)
    state_dir: str = ""
    kill_grace: float = DEFAULT_KILL_GRACE
    max_output: int = DEFAULT_MAX_OUTPUT
    #: the node this call runs on (its NETPLUGIN_NODE_* variables are in ``env`` too)
    node: NodeInfo | None = None


@runtime_checkable
class Plugin(Protocol):
    """A network plugin. Methods raise :class:`~netplugin.core.errors.PluginError` subclasses on failure."""

    name: str

    def version(self) -> str:
        """Identifies the plugin's code; ``init`` runs again when it changes."""
        ...

    def version_key(self) -> tuple[int, ...] | None:
        """A cheap identity of the plugin's code (a stat, no hashing), or None when it has none: an init
        marker whose key matches is current without calling :meth:`version`."""
        ...

    def init(self, ctx: CallContext) -> frozenset[str] | None:
        """Prepare the node; may return the pod actions it handles (its mask; None: all)."""
        ...

    def setup(self, pod: PodRef, ctx: CallContext) -> PodNetworkStatus | None:
        """Set the pod up; may return its setup document (status, host interface; else None)."""
        ...

    def teardown(self, pod: PodRef, ctx: CallContext) -> None: ...

    def status(self, pod: PodRef, ctx: CallContext) -> PodNetworkStatus | None: ...

    def repair(self, pod: PodRef, ctx: CallContext) -> tuple[str, ...]:
        """Put back what it made for the pod and the kernel lost; one ``KIND: what`` line per thing."""
        ...

    def node(self, ctx: CallContext) -> tuple[str, ...]:
        """Make its node-level state (no one pod's) what must exist; one ``KIND: what`` line per change."""
        ...


PluginFactory = Callable[["Config"], Plugin]
