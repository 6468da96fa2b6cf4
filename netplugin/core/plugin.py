"""The network plugin contract: what a plugin is, gets and answers (implementations live elsewhere).

The contract (mirrored for plugin authors in ``exec_plugins/README.md``)
=======================================================================

A network plugin wires a pod's infra container (its network namespace) to the
network. netplugin keeps the kubelet exec-plugin contract and adds to it.

Layout and names
    The exec dir (default ``/usr/libexec/kubernetes/kubelet-plugins/net/exec/``)
    holds one directory per plugin, ``NAME/``, with the executable ``NAME/NAME``.
    A vendored name ``vendor.example/NAME`` lives in ``vendor.example~NAME/NAME``:
    every ``~`` in a directory name stands for ``/``. A name is a Kubernetes
    qualified name. The executable, its directory, the exec dir, every
    directory and symbolic link on the executable's resolved path, and a
    script's ``#!`` interpreter must be owned by root (or by the user running
    netplugin) and must not be group- or world-writable (a sticky directory
    above the exec dir is accepted); this is checked again before every call,
    and a binary runs from the very descriptor that was checked
    (:mod:`netplugin.core.execplugin.trust`).

Actions and argv (exactly)
    ``NAME init``
    ``NAME setup    <namespace> <pod-name> <infra-container-id>``
    ``NAME teardown <namespace> <pod-name> <infra-container-id>``
    ``NAME status   <namespace> <pod-name> <infra-container-id>``
    ``NAME repair   <namespace> <pod-name> <infra-container-id>`` (only when ``init`` declares it)
    ``NAME node`` (only when ``init`` declares it)

    ``init`` runs once before the first other action, per boot and per version
    (content) of the executable, never twice concurrently. A failed ``setup`` is
    followed by a best-effort ``teardown`` of the same pod, so ``teardown`` must
    be idempotent: it must succeed when the pod's resources, or its network
    namespace, are already gone. Actions on one pod never overlap; actions on
    different pods run in parallel.

Environment
    ``NETPLUGIN_ACTION`` (the action), ``NETPLUGIN_PLUGIN`` (the plugin's name),
    ``NETPLUGIN_STATE_DIR`` (netplugin's state dir); for pod actions also
    ``NETPLUGIN_POD_NAMESPACE``, ``NETPLUGIN_POD_NAME``, ``NETPLUGIN_INFRA_ID``
    and ``NETPLUGIN_NETNS`` (the path of the infra container's network
    namespace, from ``netns_template``, default ``/var/run/netns/{infra_id}``).
    ``NETPLUGIN_CALL_ID`` is opaque: it proves a process belongs to a call
    netplugin made (:mod:`netplugin.core.execplugin.calls`).
    ``NETPLUGIN_HOST_PORTS`` (``setup`` of a pod with hostPorts): the pod's port
    mappings, ``PROTOCOL/HOSTPORT/CONTAINERPORT[/HOSTIP]`` separated by spaces,
    validated (:mod:`netplugin.core.hostports`), from the CNI ``portMappings``
    capability, else from the Pod's spec when the host knows the pod.
    The rest of netplugin's environment is inherited by default, as the kubelet
    did (plugins read their settings from it, and need ``PATH``);
    ``inherit_env: false`` passes only ``PATH``, ``LANG``, ``LC_ALL`` and
    ``TZ``. The config's ``env:`` mapping is added in both cases.

    Every action (``init`` too) also gets the node it runs on, from the host
    (a Kubernetes Node object, or a file of the static host):
    ``NETPLUGIN_NODE_NAME`` (the node's name), ``NETPLUGIN_NODE_POD_CIDRS``
    (its ``spec.podCIDRs``, comma-separated, in that order, at most one per
    family: ``10.244.1.0/24,fd00:10:244:1::/64``) and
    ``NETPLUGIN_NODE_INTERNAL_IPS`` (its ``InternalIP`` addresses,
    comma-separated, in ``status.addresses`` order). The three are always set;
    a value the host does not know (no Node object, no pod CIDR assigned yet) is
    the empty string. Built-in plugins get the same variables in
    ``CallContext.env`` and the parsed node as ``CallContext.node``.
    ``init`` runs again when they change.

Standard input
    For pod actions, the pod object (Kubernetes Pod JSON) when the host knows
    the pod; otherwise stdin is empty. A plugin need not read it.

Exit status and output
    Exit status 0 is success; any other status, or death by a signal, is
    failure. stdout and stderr are captured separately (each bounded, default
    1 MiB); a failure's error quotes the tail of stderr. A plugin must not
    leave processes running in its session: whatever is left when it exits,
    in any process group and whatever its environment, is killed and the
    action fails (a daemon must detach with ``setsid``; a child still on its
    way out of the session gets half a second, so ``setsid d & exit 0`` works).
    ``status`` prints nothing (success, no information) or one JSON document on
    stdout::

        {"apiVersion": "v1beta1", "kind": "PodNetworkStatus", "ip": "10.1.2.3"}

    ``kind`` may be absent or ``PodNetworkStatus``; ``apiVersion`` absent or
    ``v1beta1``; ``ip`` must be an IPv4 or IPv6 address; other keys are
    ignored. Only stdout is parsed: stderr never breaks status. A dual-stack
    pod reports every address in ``ips`` (Kubernetes' ``podIPs``): at most one
    per family, the primary first, and ``ip`` (which may then be left out)
    equal to the first::

        {"kind": "PodNetworkStatus", "ip": "10.1.2.3", "ips": ["10.1.2.3", "fd00::3"]}

The setup document (optional; one document for both uses below)
    ``setup`` may print, as its whole stdout, the same status document with
    ``"kind": "PodNetworkStatus"`` (required here: it is what marks the output as
    the document) and optionally ``"hostInterface"``, the host-side interface
    it created for the pod (a Linux interface name), and ``"mac"``, the MAC
    address of the pod's interface::

        {"kind": "PodNetworkStatus", "ip": "10.1.2.3", "ips": ["10.1.2.3"], "hostInterface": "veth1a2b3c",
         "mac": "0a:58:0a:01:02:03"}

    It serves two purposes. netplugin takes the pod's status from it and makes
    no ``status`` call after the setup (the CNI shim's ADD and the recorded IP
    would otherwise need one). And in a chain (below) it is what the member
    reports to the members after it. Output that is not this document (empty,
    progress text, other JSON, a document cut at the output limit) is ignored
    as before the extension, and ``status`` is asked when an IP is needed. A
    document whose status part is invalid is ignored the same way (the
    ``status`` call's error then says what is wrong). An invalid
    ``hostInterface`` fails the setup (and rolls it back): later members and
    every teardown would act on it, and nothing else reports it; before a later
    member gets it, netplugin checks that it is a veth whose peer is in the pod's
    netns (:mod:`netplugin.core.podlink`), else it is invalid; an address another
    live pod holds fails the setup (:mod:`netplugin.store.ipclaims`). ``mac`` (six
    colon-separated hex pairs, unicast) is the MAC a CNI ADD result reports, so
    netplugin need not enter the pod's netns to read it; any other ``mac`` is
    ignored and the MAC read from the interface.

Time limits
    Every action has a time limit (defaults: setup and teardown 30 s, init and
    status 10 s). At the limit the plugin's whole process tree gets SIGTERM,
    then after a grace (2 s) SIGKILL; the action fails with a timeout error.

Repair (opt-in: a member is called only when its ``init`` mask names ``"repair"``)
    The daemon calls ``repair`` on a ready pod when the kernel lost something the pod's
    members made on the node (a deleted bridge, a port that lost its master or hairpin, a
    deleted qdisc: :mod:`netplugin.agent.podrepair`). It gets what ``teardown``
    gets: the pod triple, ``NETPLUGIN_NETNS``, the environment of the call (the pod's
    recorded chain, with ``NETPLUGIN_PREV_*`` rebuilt from the pod record: its host
    interface and addresses) and the pod object on stdin when the host knows it. It must
    idempotently put back, on the node, what it made for that pod at ``setup`` and is now
    missing (the bridge with its addresses and MTU, the port's master and hairpin, its
    qdiscs or rules), and change nothing that is still right. It must not allocate or
    change addresses, create or replace the pod's interfaces (a host interface that is
    gone makes the pod broken: only a new setup can mend it), or touch other pods. It
    prints one line on stdout per thing it put back, ``KIND: what`` with ``KIND`` one of
    :data:`REPAIR_KINDS` (another word counts as ``other``); nothing when nothing was
    missing. Exit 0 is success, any other status a failure (logged; the pod stays as it
    is). Each member gets its own ``setup`` time limit, members run in chain order, and a
    failure does not stop the others. A member whose mask leaves ``repair`` out (every
    plugin written before it: an empty ``init`` output does not declare it) is not called
    and its part of the pod is reported as not repairable: re-running its ``setup`` on a
    live pod is not a repair, as it may re-address the pod or cut its connections, and the
    kubelet would not know.

Node state (opt-in: a member is called only when its ``init`` mask names ``"node"``)
    State a member keeps on the node for all its pods at once (the hostport member's nftables
    table, its base chains and the route_localnet guard) is not one pod's to repair. A member
    that keeps such state declares ``node`` and is called ``NAME node`` (no pod arguments; the
    environment of ``init``, under ``init``'s time limit): by the daemon at its start, whenever
    the kernel reports a change where such state lives (an nftables change) and at each of its
    periodic passes, and by every ``gc`` run. It must make the state what must exist for the
    member being configured, whether or not a pod holds anything: create what is missing (the
    table even with no pod record), put back each recorded pod's part that the kernel lost, and
    remove what no record of its own accounts for (rules of a pod it tore down); change nothing
    that is right, and serialise itself with its own ``setup`` and ``teardown`` (they run
    concurrently: one lock the three take), so that it never resurrects what a teardown just
    removed. It prints one ``KIND: what`` line per thing put back or removed, as ``repair``
    does (nothing when all was right); exit 0 is success. Its ``setup`` must not depend on it:
    a setup that finds the state gone creates it.

Chains (config ``plugins: [a, b, c]``; ``plugin: a`` is a chain of one)
    Every member is selected and validated up front (one bad member invalidates the chain, and
    the error names every bad one) and gets its own ``init`` (once per boot and version).
    ``setup`` runs the members in order; when member k fails or times out, ``teardown`` runs on
    k, then k-1 ... 1 (members after k never run), and the error names member k and any
    rollback failure. ``teardown`` runs every member in reverse order, goes on past failures and
    reports all of them. ``status`` is the first member's, in order, that reports an address.
    The time limit of ``setup`` and ``status`` covers the whole chain: each member gets what is
    left of it. In ``teardown`` and a rollback each member gets its own limit: one that hangs is
    killed and reported, and the members before it still run. A pod's ``teardown`` (and gc's)
    runs the chain recorded with the pod, whatever the config says now; a recorded member no
    longer installed fails that teardown (the others still run) and the record is kept.
    A member's ``init`` may declare the pod actions it handles, ``{"actions": ["setup",
    "teardown"]}``; it is never called for the others. The list may also declare
    ``"hostports"``: the member maps the pod's ``NETPLUGIN_HOST_PORTS``; a pod with hostPorts
    whose chain has no member declaring it fails its setup before any member runs (a ConfigError
    naming the missing hostport member: CNI error 7). What a member's ``setup`` reports in the
    setup document (above) passes along the chain, as CNI's ``prevResult`` does: later members
    get it in ``NETPLUGIN_PREV_RESULT`` (JSON), ``NETPLUGIN_PREV_IPS`` and
    ``NETPLUGIN_PREV_HOST_INTERFACE``, with ``NETPLUGIN_CHAIN`` and ``NETPLUGIN_CHAIN_INDEX``
    (:mod:`netplugin.core.chaining`), at setup and again at teardown (rebuilt from the pod
    record). The chain's status after a setup is the first address a member's setup document
    reported; only when no member reported one is ``status`` asked, member by member. The pod
    record keeps each member's progress, so gc finishes an interrupted chain's rollback for
    exactly the members that ran. Built-in plugins return the mask from ``init`` and the setup
    document, as a :class:`PodNetworkStatus`, from ``setup``, and read the same variables from
    ``CallContext.env``.

Built-in plugins
    Plugins written in Python implement :class:`Plugin` and are registered by
    name with ``netplugin.plugins.register_builtin``; they are found before the
    exec dir.
    ``kubernetes.io/no-op`` (selected when no name is given) succeeds at
    everything and reports no status.
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
]

NOOP_NAME = "kubernetes.io/no-op"

#: what a repair put back, by kind: node-level objects the daemon keeps itself (routes, egress and
#: hostPort tables) and pod-level ones a member's ``repair`` reports as ``KIND: what``
REPAIR_KINDS = ("route", "egress", "hostport", "bridge", "port", "qdisc", "other")


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
