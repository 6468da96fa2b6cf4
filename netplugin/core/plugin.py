"""The network plugin contract, exec plugins, and built-in plugins.

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
    (:mod:`netplugin.core.trust`).

Actions and argv (exactly)
    ``NAME init``
    ``NAME setup    <namespace> <pod-name> <infra-container-id>``
    ``NAME teardown <namespace> <pod-name> <infra-container-id>``
    ``NAME status   <namespace> <pod-name> <infra-container-id>``

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
    netplugin made (:mod:`netplugin.core.calls`).
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
    action fails (a daemon must detach with ``setsid``).
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

Time limits
    Every action has a time limit (defaults: setup and teardown 30 s, init and
    status 10 s). At the limit the plugin's whole process tree gets SIGTERM,
    then after a grace (2 s) SIGKILL; the action fails with a timeout error.

Chains (config ``plugins: [a, b, c]``; ``plugin: a`` is a chain of one)
    Every member is selected and validated up front (one bad member invalidates the chain, and
    the error names every bad one) and gets its own ``init`` (once per boot and version).
    ``setup`` runs the members in order; when member k fails or times out, ``teardown`` runs on
    k, then k-1 ... 1 (members after k never run), and the error names member k and any
    rollback failure. ``teardown`` runs every member in reverse order, goes on past failures and
    reports all of them. ``status`` is the first member's, in order, that reports an address.
    The time limit of an action covers the whole chain: each member gets what is left of it.
    A member's ``init`` may declare the pod actions it handles, ``{"actions": ["setup",
    "teardown"]}``; it is never called for the others. A ``setup`` may print its status document
    with ``hostInterface`` added; later members get what earlier ones reported in
    ``NETPLUGIN_PREV_RESULT`` (JSON), ``NETPLUGIN_PREV_IPS`` and ``NETPLUGIN_PREV_HOST_INTERFACE``,
    with ``NETPLUGIN_CHAIN`` and ``NETPLUGIN_CHAIN_INDEX`` (:mod:`netplugin.core.chaining`).
    The pod record keeps each member's progress, so gc finishes an interrupted chain's rollback
    for exactly the members that ran.

Built-in plugins
    Plugins written in Python implement :class:`Plugin` and are registered by
    name with ``netplugin.plugins.register_builtin``; they are found before the
    exec dir.
    ``kubernetes.io/no-op`` (selected when no name is given) succeeds at
    everything and reports no status.
"""

from __future__ import annotations

import enum
import json
import os
import signal as _signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from netplugin.core import calls
from netplugin.core.chaining import CHAIN_ENV, host_interface, parse_actions
from netplugin.core.errors import PluginFailed, PluginOutputError, PluginTimeout
from netplugin.core.names import PodRef
from netplugin.core.node import NodeInfo

if TYPE_CHECKING:
    from netplugin.core.config import Config
    from netplugin.core.invoke import Completed, Runner

__all__ = [
    "NOOP_NAME",
    "Action",
    "CallContext",
    "ExecPlugin",
    "Plugin",
    "PluginFactory",
    "PodNetworkStatus",
    "parse_status",
]

NOOP_NAME = "kubernetes.io/no-op"
_SAFE_ENV = ("PATH", "LANG", "LC_ALL", "TZ")
_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_TAIL = 2048
_OWN_ENV = frozenset(
    {
        "NETPLUGIN_CONFIG",
        "NETPLUGIN_OUTPUT",
        "NETPLUGIN_VERBOSE",
        "NETPLUGIN_ACTION",
        "NETPLUGIN_PLUGIN",
        "NETPLUGIN_POD_NAMESPACE",
        "NETPLUGIN_POD_NAME",
        "NETPLUGIN_INFRA_ID",
        "NETPLUGIN_NETNS",
        "NETPLUGIN_CALL_ID",
        # set from the host at every call; an outer value must never leak in
        "NETPLUGIN_NODE_NAME",
        "NETPLUGIN_NODE_POD_CIDRS",
        "NETPLUGIN_NODE_INTERNAL_IPS",
        *CHAIN_ENV,
    }
)


class Action(enum.Enum):
    INIT = "init"
    SETUP = "setup"
    TEARDOWN = "teardown"
    STATUS = "status"


@dataclass(frozen=True, slots=True)
class PodNetworkStatus:
    """What ``status`` reports: the pod's IP address, and with dual stack one per family."""

    ip: str
    #: every address, ``ip`` first, at most one per family (Kubernetes' podIPs); () means ``(ip,)``
    ips: tuple[str, ...] = ()
    #: the host-side interface the plugin created for the pod (reported by ``setup``, for later members)
    host_interface: str | None = None

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
    kill_grace: float = 2.0
    max_output: int = 1 << 20
    #: the node this call runs on (its NETPLUGIN_NODE_* variables are in ``env`` too)
    node: NodeInfo | None = None


@runtime_checkable
class Plugin(Protocol):
    """A network plugin. Methods raise :class:`~netplugin.core.errors.PluginError` subclasses on failure."""

    name: str

    def version(self) -> str:
        """Identifies the plugin's code; ``init`` runs again when it changes."""
        ...

    def init(self, ctx: CallContext) -> frozenset[str] | None:
        """Prepare the node; may return the pod actions it handles (its mask; None: all)."""
        ...

    def setup(self, pod: PodRef, ctx: CallContext) -> PodNetworkStatus | None:
        """Wire the pod; may return what it set up (IPs, host interface) for later chain members."""
        ...

    def teardown(self, pod: PodRef, ctx: CallContext) -> None: ...

    def status(self, pod: PodRef, ctx: CallContext) -> PodNetworkStatus | None: ...


# --- status parsing --------------------------------------------------------------------------------


def parse_status(stdout: bytes, *, plugin: str, pod: str = "", action: str = "status") -> PodNetworkStatus | None:
    """Parse a ``status`` action's stdout (or a ``setup``'s). Empty output means "no information" (None).

    Raises :class:`PluginOutputError` naming the offending value.
    """
    text_bytes = stdout.strip()
    if not text_bytes:
        return None

    def bad(msg: str) -> PluginOutputError:
        where = f" for pod {pod}" if pod else ""
        return PluginOutputError(
            f"network plugin {plugin!r} {action}{where}: {msg}",
            plugin=plugin,
            action=action,
            stdout_tail=text_bytes[-_TAIL:].decode("utf-8", "replace"),
        )

    try:
        doc = json.loads(text_bytes)
    except (ValueError, RecursionError) as e:
        raise bad(f"output is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise bad(f"output must be a JSON object, got {type(doc).__name__}")
    kind = doc.get("kind", "")
    if kind not in ("", "PodNetworkStatus"):
        raise bad(f"invalid 'kind' {kind!r} (expected 'PodNetworkStatus')")
    version = doc.get("apiVersion", "")
    if version not in ("", "v1beta1"):
        raise bad(f"unknown 'apiVersion' {version!r} (expected 'v1beta1')")
    ips = _status_ips(doc.get("ips"), bad)
    hif = host_interface(doc.get("hostInterface"), plugin=plugin, action=action, out=text_bytes)
    if "ip" not in doc:
        if not ips:
            raise bad("no 'ip' in status")
        return PodNetworkStatus(ip=ips[0], ips=ips, host_interface=hif)
    ip = _status_ip(doc["ip"], "'ip'", bad)
    if ips and ips[0] != ip:
        raise bad(f"invalid 'ip' {doc['ip']!r}: must be the first of 'ips' {list(ips)!r}")
    return PodNetworkStatus(ip=ip, ips=ips, host_interface=hif)


def _status_ip(value: Any, what: str, bad: Callable[[str], PluginOutputError]) -> str:
    """One address of a status document, in canonical form."""
    if not isinstance(value, str):
        raise bad(f"invalid {what} {value!r}: must be a string")
    import ipaddress

    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise bad(f"invalid {what} {value!r}: not an IPv4 or IPv6 address") from None


def _status_ips(value: Any, bad: Callable[[str], PluginOutputError]) -> tuple[str, ...]:
    """The optional ``ips`` list: addresses, at most one per family."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise bad(f"invalid 'ips' {value!r}: must be a list of addresses")
    out = tuple(_status_ip(v, "address in 'ips'", bad) for v in value)
    families = [":" in ip for ip in out]
    if len(set(families)) != len(families):
        raise bad(f"invalid 'ips' {value!r}: at most one IPv4 and one IPv6 address")
    return out


# --- environment -------------------------------------------------------------------------------------


def base_env(config: Config, parent: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment common to every call: inherited (or the safe few), the config's env, and ours."""
    parent = os.environ if parent is None else parent
    env = dict(parent) if config.inherit_env else {k: parent[k] for k in _SAFE_ENV if k in parent}
    # Without PATH a bash plugin falls back to bash's built-in default, which includes ".".
    env.setdefault("PATH", _DEFAULT_PATH)
    # netplugin's own settings and per-call variables from an outer call are not the plugin's
    # business, and a stale value could mislead it; plugin settings (NETPLUGIN_BRIDGE_*) pass.
    from netplugin.core.config import ENV_VARS

    for k in [k for k in env if k in ENV_VARS or k in _OWN_ENV]:
        del env[k]
    env.update(config.env)
    env["NETPLUGIN_STATE_DIR"] = config.state_dir
    return env


def call_env(ctx: CallContext, plugin: str, action: Action, pod: PodRef | None) -> dict[str, str]:
    env = dict(ctx.env)
    env["NETPLUGIN_ACTION"] = action.value
    env["NETPLUGIN_PLUGIN"] = plugin
    if pod is not None:
        env["NETPLUGIN_POD_NAMESPACE"] = pod.namespace
        env["NETPLUGIN_POD_NAME"] = pod.name
        env["NETPLUGIN_INFRA_ID"] = pod.infra_id
        env["NETPLUGIN_NETNS"] = ctx.netns
    return env


# --- exec plugins ------------------------------------------------------------------------------------


def _tail(data: bytes) -> str:
    return data[-_TAIL:].decode("utf-8", "replace").strip()


def _describe_exit(done: Completed) -> str:
    if done.signal is not None:
        try:
            name = _signal.Signals(done.signal).name
        except ValueError:
            name = str(done.signal)
        return f"killed by signal {name}"
    return f"exit status {done.returncode}"


class ExecPlugin:
    """A plugin that is an executable, run once per action.

    Before every call the executable's path is walked and checked again (ownership and mode of
    every directory on it, see :mod:`.discovery`), so a daemon that selected it long ago never
    runs a file that was swapped since: a binary is executed through the very descriptor that
    passed the check; a script (whose interpreter reads it by path, so that ``$0`` stays its
    path) only when the path still names that inode, in directories nobody but root can change.
    """

    def __init__(
        self,
        name: str,
        path: str,
        runner: Runner | None = None,
        *,
        check_permissions: bool = True,
        exec_dir: str | None = None,
    ) -> None:
        self.name = name
        self.path = path
        self.check_permissions = check_permissions
        self.exec_dir = exec_dir
        # An injected runner (the tests' seam) executes nothing, so there is no file to open.
        self._validate = runner is None
        if runner is None:
            from netplugin.core.invoke import run

            runner = run
        self._runner: Runner = runner
        self._version: tuple[tuple[int, ...], str] | None = None

    def __repr__(self) -> str:
        return f"ExecPlugin({self.name!r}, {self.path!r})"

    def version_key(self) -> tuple[int, ...]:
        """A cheap identity of the executable's current content (any write changes ctime)."""
        st = os.stat(self.path)
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def version(self) -> str:
        """sha256 of the executable's content."""
        import hashlib  # lazily: the init marker usually matches on version_key() alone

        key = self.version_key()
        if self._version is None or self._version[0] != key:
            h = hashlib.sha256()
            with open(self.path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            self._version = (key, "sha256:" + h.hexdigest())
        return self._version[1]

    def _run(self, action: Action, pod: PodRef | None, ctx: CallContext) -> Completed:
        from netplugin.core._launch import Launch, call_token
        from netplugin.core.invoke import SpawnError

        argv = [self.path, action.value]
        if pod is not None:
            argv += [pod.namespace, pod.name, pod.infra_id]
        stdin = json.dumps(ctx.pod, separators=(",", ":")).encode() if ctx.pod is not None else None
        env = call_env(ctx, self.name, action, pod)
        if ctx.state_dir:
            env[calls.ENV] = call_token(ctx.state_dir, env)
        launch = Launch(
            self.name,
            self.path,
            action.value,
            check_permissions=self.check_permissions,
            exec_dir=self.exec_dir,
            validate=self._validate,
        )
        with launch:
            try:
                done = self._runner(
                    argv,
                    env=env,
                    stdin=stdin,
                    timeout=ctx.timeout,
                    max_output=ctx.max_output,
                    kill_grace=ctx.kill_grace,
                    **launch.kwargs,
                )
            except SpawnError as e:
                raise launch.failed(e) from e
        context: dict[str, Any] = {
            "plugin": self.name,
            "action": action.value,
            "stderr_tail": _tail(done.stderr),
            "stdout_tail": _tail(done.stdout),
        }
        if pod is not None:
            context["pod"] = str(pod)
        if done.timed_out:
            raise PluginTimeout(timeout=ctx.timeout, **context)
        if done.returncode != 0:
            raise PluginFailed(
                f"network plugin {self.name!r} {action.value} failed: {_describe_exit(done)}",
                exit_status=done.returncode if done.signal is None else None,
                signal=done.signal,
                **context,
            )
        if done.leftover:
            raise PluginFailed(
                f"network plugin {self.name!r} {action.value} left {done.leftover} process(es) running "
                "after it exited (they were killed)",
                exit_status=0,
                **context,
            )
        return done

    def init(self, ctx: CallContext) -> frozenset[str] | None:
        return parse_actions(self._run(Action.INIT, None, ctx).stdout, plugin=self.name)

    def setup(self, pod: PodRef, ctx: CallContext) -> PodNetworkStatus | None:
        out = self._run(Action.SETUP, pod, ctx).stdout
        if not out.lstrip().startswith(b"{"):
            return None  # progress text of a plugin that reports nothing (the kubelet logged it)
        return parse_status(out, plugin=self.name, pod=str(pod), action="setup")

    def teardown(self, pod: PodRef, ctx: CallContext) -> None:
        self._run(Action.TEARDOWN, pod, ctx)

    def status(self, pod: PodRef, ctx: CallContext) -> PodNetworkStatus | None:
        done = self._run(Action.STATUS, pod, ctx)
        if done.stdout_truncated:
            raise PluginOutputError(
                f"network plugin {self.name!r} status for pod {pod}: output larger than {ctx.max_output} bytes",
                plugin=self.name,
                action="status",
            )
        return parse_status(done.stdout, plugin=self.name, pod=str(pod))


# --- built-in plugins ----------------------------------------------------------------------------------


PluginFactory = Callable[["Config"], Plugin]
