"""The plugin manager: selection, init-once, per-pod serialisation, rollback.

Policy lives here; mechanism (processes, files, locks) lives in ``invoke``,
``discovery`` and ``locks``. Guarantees, across every netplugin process on the
node (CLI, daemon, CNI shim):

* the plugin is selected by name: built-ins first, then the exec dir; no name
  selects ``kubernetes.io/no-op``; a missing or invalid plugin is an error that
  lists every problem found while looking;
* ``init`` runs exactly once per boot and per version of the plugin before its
  first other action (a marker under the run dir, written under a file lock);
* two actions on the same pod never overlap; different pods run in parallel
  (one flock'd file per pod under the run dir);
* a failed setup is followed by a best-effort teardown (``rollback_on_failure``);
* every pod is recorded durably under the state dir before its setup runs, and forgotten only
  after a teardown succeeded (:mod:`netplugin.store.state`; ``netplugin gc`` repairs the rest).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from netplugin.core.config import Config
from netplugin.core.dirs import ensure_dir
from netplugin.core.discovery import Candidate, scan
from netplugin.core.errors import (
    HostError,
    InvalidArgument,
    NetpluginError,
    PluginError,
    PluginInvalid,
    PluginNotFound,
)
from netplugin.core.execplugin.environ import base_env
from netplugin.core.execplugin.plugin import ExecPlugin
from netplugin.core.fileio import atomic_write, read_small
from netplugin.core.names import PodRef, escape_plugin_name, validate_plugin_name
from netplugin.core.netns import netns_problem
from netplugin.core.node import NodeInfo, node_name
from netplugin.core.plugin import NOOP_NAME, Action, CallContext, Plugin, PodNetworkStatus
from netplugin.core.procs import boot_id
from netplugin.hosts import Host, make_host
from netplugin.plugins import BUILTINS
from netplugin.plugins.bounded import BoundedPlugin
from netplugin.store.locks import flocked, pod_lock_path

if TYPE_CHECKING:
    from netplugin.core.execplugin.invoke import Runner
    from netplugin.store.state import StateStore

__all__ = ["CallOptions", "Manager"]


@dataclass(frozen=True)
class CallOptions:
    """Settings of one pod action that the config does not give (the CNI shim's per-call ones).

    ``netns``: the network namespace path as the runtime gave it (instead of ``netns_template``);
    ``env``: variables added to the plugin's environment for this action only;
    ``want_status``: see the field. Neither ``netns`` nor ``env`` counts
    as a setting of init (its marker), so pods set up through the CNI shim, the CLI and the
    daemon share one init.
    """

    netns: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    #: setup also asks the plugin's status (under the same lock, recorded with the setup) and
    #: returns it, or raises its failure after recording the setup
    want_status: bool = False
    #: files the caller wrote for this setup (the CNI attachment record) that the setup's intent
    #: record makes durable in its one group commit (not synced by the caller)
    durable_with: tuple[str, ...] = ()


class Manager:
    """Runs plugin actions with netplugin's guarantees. Thread-safe."""

    def __init__(
        self,
        config: Config,
        host: Host | None = None,
        *,
        runner: Runner | None = None,
        state: StateStore | Literal[False] | None = None,
        environ: dict[str, str] | None = None,
    ) -> None:
        self.config = config
        self.host = host if host is not None else make_host(config)
        self.runner = runner
        # None: durable pod records under config.state_dir (the default); False: keep no records.
        if state is None:
            from netplugin.store.state import StateStore

            state = StateStore.from_config(config)
        self.state: StateStore | None = state if state is not False else None
        self._env = base_env(config, environ)
        self._plugin: Plugin | None = None
        self._select_lock = threading.Lock()

    # --- selection ------------------------------------------------------------------------------

    def candidates(self) -> list[Candidate]:
        """Built-in plugins, then every exec-dir candidate (valid or not).

        A missing exec dir holds no candidates (the built-ins are still listed; the CLI warns);
        one that exists but cannot be read raises DiscoveryError.
        """
        out = [Candidate(name, "(built-in)", builtin=True) for name in sorted(BUILTINS)]
        if not os.path.lexists(self.config.plugin_dir):
            return out
        out += scan(self.config.plugin_dir, check_permissions=self.config.check_permissions, reserved=BUILTINS)
        return out

    def select(self, name: str | None) -> Plugin:
        """The plugin called ``name`` (None or "" selects the no-op plugin)."""
        name = name or NOOP_NAME
        validate_plugin_name(name)
        if name in BUILTINS:
            builtin = BUILTINS[name](self.config)
            # In-process actions get their time limit as exec plugins do (the no-op cannot hang).
            return builtin if name == NOOP_NAME else BoundedPlugin(builtin)
        found = scan(self.config.plugin_dir, check_permissions=self.config.check_permissions, reserved=BUILTINS)
        for cand in found:
            if cand.name == name:
                if cand.problem:
                    raise PluginInvalid(name, cand.problem, path=cand.path)
                return ExecPlugin(
                    name,
                    cand.path,
                    runner=self.runner,
                    check_permissions=self.config.check_permissions,
                    exec_dir=self.config.plugin_dir,
                )
        raise PluginNotFound(
            name,
            available=sorted([*BUILTINS, *(c.name for c in found if c.valid)]),
            problems=[f"{c.name}: {c.problem}" for c in found if c.problem],
        )

    @property
    def plugin(self) -> Plugin:
        """The configured plugin, selected once per Manager."""
        with self._select_lock:
            if self._plugin is None:
                self._plugin = self.select(self.config.plugin)
            return self._plugin

    def rescan(self) -> Plugin:
        """Forget the selected plugin and select again (the daemon does this on SIGHUP)."""
        with self._select_lock:
            self._plugin = None
        return self.plugin

    # --- init once --------------------------------------------------------------------------------

    def _marker_path(self, plugin: Plugin) -> str:
        return os.path.join(self.config.run_dir, "init", escape_plugin_name(plugin.name) + ".json")

    def _settings(self, node: NodeInfo) -> dict[str, str]:
        """What init prepares for: the config's env and the node (its pod CIDRs may set a bridge's address)."""
        return {**self.config.env, **node.env()}

    def _marker_ok(self, path: str, boot: str, plugin: Plugin, node: NodeInfo) -> bool:
        try:
            marker = json.loads(read_small(path))  # O_NOFOLLOW: a planted link is no marker
        except FileNotFoundError:
            return False
        except (NetpluginError, ValueError):
            return False  # unreadable or torn marker: run init again, which must be idempotent anyway
        if not isinstance(marker, dict) or marker.get("boot_id") != boot:
            return False
        if marker.get("settings") != self._settings(node):
            return False  # init prepares for these settings (a bridge name, a subnet): new ones, new init
        key = getattr(plugin, "version_key", None)
        if key is not None and marker.get("version_key") == list(key()):
            return True  # unchanged file: skip hashing it
        return bool(marker.get("version") == plugin.version())

    def init_done(self) -> bool:
        """Whether init already ran this boot for this plugin's version and settings (nothing runs)."""
        plugin = self.plugin
        return self._marker_ok(self._marker_path(plugin), boot_id(), plugin, self.node(strict=False))

    def init(self, *, force: bool = False, node: NodeInfo | None = None) -> bool:
        """Run the plugin's init unless it already ran this boot for this version. True if it ran.

        ``node`` is this node as the caller already looked it up (else it is looked up here).
        """
        plugin = self.plugin
        path = self._marker_path(plugin)
        boot = boot_id()
        node = node if node is not None else self.node()
        # Before the marker is read: a symlinked or foreign init/ must not vouch for an init.
        ensure_dir(os.path.dirname(path), base=self.config.run_dir)
        if not force and self._marker_ok(path, boot, plugin, node):
            return False
        with flocked(path[: -len(".json")] + ".lock", base=self.config.run_dir):
            if not force and self._marker_ok(path, boot, plugin, node):
                return False  # another process ran it while we waited
            plugin.init(self._context(Action.INIT, None, node=node))
            key = getattr(plugin, "version_key", None)
            marker: dict[str, Any] = {
                "plugin": plugin.name,
                "boot_id": boot,
                "version": plugin.version(),
                "version_key": list(key()) if key is not None else None,
                "settings": self._settings(node),
                "time": time.time(),
                "pid": os.getpid(),
            }
            atomic_write(path, json.dumps(marker).encode(), mode=0o644)
        return True

    # --- the node -------------------------------------------------------------------------------------

    def node(self, *, strict: bool = True) -> NodeInfo:
        """This node, as the host knows it (name, pod CIDRs, InternalIPs).

        ``strict=False`` (teardown, status: they must work while the API is away) turns a
        host that cannot answer into a node known by name only.
        """
        lookup = getattr(self.host, "node_info", None)
        if lookup is None:  # a Host written before hosts knew nodes
            return NodeInfo(node_name(self.config.node_name))
        try:
            info: NodeInfo = lookup()
        except HostError:
            if strict:
                raise
            return NodeInfo(getattr(self.host, "node_name", None) or node_name(self.config.node_name))
        return info

    # --- pod actions ------------------------------------------------------------------------------------

    def _context(
        self,
        action: Action,
        pod: PodRef | None,
        pod_obj: dict[str, Any] | None = None,
        call: CallOptions | None = None,
        *,
        node: NodeInfo,
    ) -> CallContext:
        c = self.config
        if pod is None:
            netns = ""
        elif call is not None and call.netns is not None:
            netns = call.netns
        else:
            netns = c.netns_path(pod.infra_id)
        return CallContext(
            netns=netns,
            pod=pod_obj,
            timeout=c.timeout_for(action.value),
            env={**self._env, **node.env(), **(call.env if call is not None else {})},
            state_dir=c.state_dir,
            kill_grace=c.kill_grace,
            max_output=c.max_output,
            node=node,
        )

    def _lookup(self, pod: PodRef, action: Action) -> dict[str, Any] | None:
        try:
            return self.host.get_pod_by_name(pod.namespace, pod.name)
        except HostError:
            if action is Action.SETUP:
                raise
            # Teardown and status must work while the API is away: the plugin owns its resources.
            return None

    @contextmanager
    def pod_lock(self, pod: PodRef) -> Iterator[None]:
        """Serialise every action on one pod, across threads and processes."""
        with flocked(pod_lock_path(self.config.run_dir, pod), base=self.config.run_dir):
            yield

    def setup(self, pod: PodRef, call: CallOptions | None = None) -> PodNetworkStatus | None:
        """Set up the pod's network. Returns its status when the state store wants it recorded.

        Before anything runs, a netns that is this process's or the node's own (or a FIFO or
        device) is refused: InvalidArgument ``netns`` (see :func:`netns_problem`).
        """
        netns = call.netns if call is not None and call.netns is not None else self.config.netns_path(pod.infra_id)
        problem = netns_problem(netns)
        if problem is not None:
            raise InvalidArgument("netns", netns, problem)
        plugin = self.plugin
        node = self.node()
        self.init(node=node)
        with self.pod_lock(pod):
            pod_obj = self._lookup(pod, Action.SETUP)
            ctx = self._context(Action.SETUP, pod, pod_obj, call, node=node)
            if self.state is not None:
                also = call.durable_with if call is not None else ()
                self.state.begin(pod, plugin.name, plugin.version(), ctx.netns, pod_obj=pod_obj, durable_with=also)
            try:
                reported = plugin.setup(pod, ctx)
            except NetpluginError as e:
                self._rollback(plugin, pod, pod_obj, e, node, call)
                raise
            status = reported  # a plugin that gives its status with setup needs no status call
            status_error: PluginError | None = None
            want = call is not None and call.want_status
            if status is None and (want or (self.state is not None and self.state.record_status)):
                # one more exec on the pod-start path, for the record's IP (and the caller's)
                try:
                    status = plugin.status(pod, self._context(Action.STATUS, pod, pod_obj, call, node=node))
                except PluginError as e:
                    status, status_error = None, e  # setup succeeded; a status failure must not undo it
            if self.state is not None:
                self.state.complete(pod, status.ip if status else None)
            if want and status_error is not None:
                raise status_error  # the caller asked for the status: it gets the failure
            return status

    def _rollback(
        self,
        plugin: Plugin,
        pod: PodRef,
        pod_obj: dict[str, Any] | None,
        err: NetpluginError,
        node: NodeInfo,
        call: CallOptions | None = None,
    ) -> None:
        if not self.config.rollback_on_failure:
            return
        try:
            plugin.teardown(pod, self._context(Action.TEARDOWN, pod, pod_obj, call, node=node))
        except NetpluginError as te:
            err.details["rollback_error"] = te.message
            return
        err.details["rolled_back"] = True
        if self.state is not None:
            self.state.remove(pod)

    def teardown(self, pod: PodRef, call: CallOptions | None = None) -> None:
        """Tear down the pod's network (also when netplugin has no record of it)."""
        plugin = self.plugin
        node = self.node(strict=False)
        init_error: PluginError | None = None
        try:
            self.init(node=node)
        except PluginError as e:
            # Teardown is best effort: a plugin whose init fails may still free what the pod holds,
            # and a teardown that can never succeed would be retried by the runtime for ever.
            init_error = e
        with self.pod_lock(pod):
            try:
                self._teardown_locked(plugin, pod, node, call)
            except NetpluginError as e:
                if init_error is not None:
                    e.details["init_error"] = init_error.message
                raise

    def _teardown_locked(self, plugin: Plugin, pod: PodRef, node: NodeInfo, call: CallOptions | None = None) -> None:
        pod_obj = self._lookup(pod, Action.TEARDOWN)
        if self.state is not None:
            self.state.mark_teardown(pod)
        plugin.teardown(pod, self._context(Action.TEARDOWN, pod, pod_obj, call, node=node))
        if self.state is not None:
            self.state.remove(pod)

    def status(self, pod: PodRef, call: CallOptions | None = None) -> PodNetworkStatus | None:
        plugin = self.plugin
        node = self.node(strict=False)
        self.init(node=node)
        with self.pod_lock(pod):
            pod_obj = self._lookup(pod, Action.STATUS)
            result = plugin.status(pod, self._context(Action.STATUS, pod, pod_obj, call, node=node))
            if self.state is not None and result is not None:
                self.state.observe_ip(pod, result.ip)  # records the IP without an exec at setup
            return result
