"""The plugin manager: selection, init-once, per-pod serialisation, rollback.

Policy lives here; mechanism in ``invoke``, ``discovery`` and ``locks``. Guarantees, across every
netplugin process on the node (CLI, daemon, CNI shim):

* the plugins of the chain (``plugins:``, or the chain of one ``plugin:``) are selected by
  name: built-ins first, then the exec dir; no name selects ``kubernetes.io/no-op``; a missing
  or invalid member is an error that lists every problem found while looking, for every member;
* ``init`` runs exactly once per boot and per version of each member before its first other
  action (a marker under the run dir, written under a file lock: :mod:`.initonce`), keeping its action mask;
* pod actions run across the chain as :mod:`netplugin.manager.chain` says; a teardown runs the
  chain recorded with the pod, whatever the config says now;
* two actions on the same pod never overlap; different pods run in parallel (a flock'd file each);
* a failed setup is followed by a best-effort teardown (``rollback_on_failure``);
* a pod is recorded durably before its setup, forgotten after a teardown succeeded (``gc``: the rest).
"""

from __future__ import annotations

# Imports inside this module's functions are kept for the per-call import set
# (tests/frontends/fastpath.py): each keeps a module off the calls that do not need it
# (BENCHMARKS.md rows B-i and B: the CLI's cold start and per-pod run without a daemon).
import functools
import os
import threading
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Literal

from netplugin.core.config import Config
from netplugin.core.discovery import Candidate, scan
from netplugin.core.errors import (
    ChainInvalid,
    HostError,
    InvalidArgument,
    NetpluginError,
    PluginError,
    PluginInvalid,
    PluginNotFound,
)
from netplugin.core.execplugin.environ import base_env
from netplugin.core.execplugin.exec_plugin import ExecPlugin
from netplugin.core.hostports import pod_host_ports
from netplugin.core.names import PodRef, validate_plugin_name
from netplugin.core.netns import netns_problem
from netplugin.core.node import NodeInfo, node_name
from netplugin.core.plaindata import dataclass, field
from netplugin.core.plugin import NOOP_NAME, Action, CallContext, Plugin, PodNetworkStatus
from netplugin.hosts import Host, make_host
from netplugin.manager.chain import ChainRun, Member, Recorder, attach_failures, fresh_states, recorded_members
from netplugin.manager.initonce import InitOnce
from netplugin.manager.reporting import Hooks, Reporting
from netplugin.plugins import BUILTINS
from netplugin.plugins.bounded import BoundedPlugin
from netplugin.store.locks import PodLock, pod_locked, stock_pod_locks
from netplugin.store.records import MemberState, PodRecord

if TYPE_CHECKING:
    from netplugin.core.discovery import Candidate as _Found
    from netplugin.core.execplugin.invoke import Runner
    from netplugin.store.state import StateStore

__all__ = ["CallOptions", "Manager"]


@dataclass(frozen=True)
class CallOptions:
    """Settings of one pod action that the config does not give (the CNI shim's per-call ones).

    ``netns``: the netns path as the runtime gave it (instead of ``netns_template``); ``env``: added
    to the plugin's environment for this action only. Neither is a setting of init (its marker), so
    pods set up through the CNI shim, the CLI and the daemon share one init.
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
    """Runs plugin actions with netplugin's guarantees; tells its :class:`Hooks` of its work. Thread-safe."""

    def __init__(
        self,
        config: Config,
        host: Host | None = None,
        *,
        runner: Runner | None = None,
        state: StateStore | Literal[False] | None = None,
        environ: dict[str, str] | None = None,
        hooks: Hooks | None = None,
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
        self._plugins: tuple[Plugin, ...] | None = None
        self._select_lock = threading.Lock()
        #: whom this manager tells of its work (the daemon's metrics and log)
        self.hooks = hooks if hooks is not None else Hooks()
        self._reporting = Reporting(config, self.hooks.on_action)
        #: each member's init, once per boot (its marker), and the action mask it declared
        self.inits = InitOnce(config, lambda node: self._context(Action.INIT, None, node=node))

    # --- selection ------------------------------------------------------------------------------

    def candidates(self) -> list[Candidate]:
        """Built-in plugins, then every exec-dir candidate (valid or not). A missing exec dir holds no
        candidates (the built-ins are still listed; the CLI warns); an unreadable one raises DiscoveryError."""
        out = [Candidate(name, "(built-in)", builtin=True) for name in sorted(BUILTINS)]
        if not os.path.lexists(self.config.plugin_dir):
            return out
        out += scan(self.config.plugin_dir, check_permissions=self.config.check_permissions, reserved=BUILTINS)
        return out

    def select(self, name: str | None, found: list[_Found] | None = None) -> Plugin:
        """The plugin called ``name`` (None or "" selects the no-op plugin); ``found``: a scan to reuse."""
        name = name or NOOP_NAME
        validate_plugin_name(name)
        if name in BUILTINS:
            builtin = BUILTINS[name](self.config)
            # In-process actions get their time limit as exec plugins do (the no-op cannot hang).
            return builtin if name == NOOP_NAME else BoundedPlugin(builtin)
        if found is None:
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

    def select_chain(self, names: tuple[str, ...]) -> tuple[Plugin, ...]:
        """Every member of the chain ``names`` (() is the no-op plugin), each validated.

        A chain of one raises that plugin's own error; a longer one, :class:`ChainInvalid` naming
        every bad member and why.
        """
        if len(names) <= 1:
            return (self.select(names[0] if names else None),)
        found: list[_Found] | None = None
        if any(n not in BUILTINS for n in names):
            found = scan(self.config.plugin_dir, check_permissions=self.config.check_permissions, reserved=BUILTINS)
        out: list[Plugin] = []
        problems: list[str] = []
        for n in names:
            try:
                out.append(self.select(n, found))
            except NetpluginError as e:
                problems.append(f"member {n!r}: {e.message}")
        if problems:
            raise ChainInvalid(list(names), problems)
        return tuple(out)

    @property
    def plugins(self) -> tuple[Plugin, ...]:
        """The configured chain's plugins, selected once per Manager."""
        with self._select_lock:
            if self._plugins is None:
                self._plugins = self.select_chain(self.config.chain)
            return self._plugins

    @property
    def plugin(self) -> Plugin:
        """The chain's first plugin (the only one of a chain of one)."""
        return self.plugins[0]

    @property
    def chain_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.plugins)

    def members(self) -> tuple[Member, ...]:
        """The chain with each member's action mask (known once its init ran or was found done)."""
        return tuple(self.member(p) for p in self.plugins)

    def member(self, plugin: Plugin) -> Member:
        """``plugin`` with its action mask (all actions unless its init declared fewer)."""
        return Member(plugin, self.inits.handles(plugin.name))

    def recorded_plugin(self, name: str) -> Plugin:
        """The plugin a pod record names: the configured member, else the one installed by that name now."""
        try:
            return next(p for p in self.plugins if p.name == name)
        except (NetpluginError, StopIteration):  # not configured now, or the chain is bad: select it alone
            return self.select(name)

    def rescan(self) -> Plugin:
        """Forget the selected chain and select again (the daemon does this on SIGHUP)."""
        with self._select_lock:
            self._plugins = None
            self.inits.forget()  # SIGHUP also means "check init again", marker and all
        return self.plugin

    # --- the node -------------------------------------------------------------------------------------

    def node(self, *, strict: bool = True) -> NodeInfo:
        """This node, as the host knows it (name, pod CIDRs, InternalIPs).

        ``strict=False`` (teardown, status: they must work while the API is away) turns a
        host that cannot answer into a node known by name only.
        """
        try:
            return self.host.node_info()
        except HostError:
            if strict:
                raise
            return NodeInfo(self.host.node_name or node_name(self.config.node_name))

    # --- init once ------------------------------------------------------------------------------------

    def init_done(self) -> bool:
        """Whether init already ran this boot for the first member's version and settings (nothing runs)."""
        return self.inits.done(self.plugin, self.node(strict=False))

    def init(self, *, force: bool = False, node: NodeInfo | None = None) -> bool:
        """Run each member's init unless it already ran this boot for its version. True if any ran.

        ``node`` is this node as the caller already looked it up (else it is looked up here).
        """
        return any(self.init_members(force=force, node=node).values())

    def init_members(self, *, force: bool = False, node: NodeInfo | None = None) -> dict[str, bool]:
        """Each member's init, in chain order: name -> whether it ran now."""
        node = node if node is not None else self.node()
        return {p.name: self.inits.run(p, node, force=force) for p in self.plugins}

    def init_member(self, plugin: Plugin, *, force: bool = False, node: NodeInfo | None = None) -> bool:
        """Run one plugin's init unless it already ran this boot for this version. True if it ran."""
        return self.inits.run(plugin, node if node is not None else self.node(), force=force)

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
        env = {**self._env, **node.env(), **(call.env if call is not None else {})}
        return CallContext(
            netns=netns,
            pod=pod_obj,
            timeout=c.timeout_for(action.value),
            env={**env, **pod_host_ports(env, pod_obj)} if action is Action.SETUP else env,
            state_dir=c.state_dir,
            kill_grace=c.kill_grace,
            max_output=c.max_output,
            node=node,
        )

    def node_context(self, node: NodeInfo) -> CallContext:
        """The context of a member's ``node`` action (no pod: :func:`netplugin.manager.repair.keep_node`)."""
        return self._context(Action.NODE, None, node=node)

    def recorded_run(
        self,
        rec: PodRecord,
        *,
        node: NodeInfo,
        pod_obj: dict[str, Any] | None = None,
        members: tuple[Member, ...] | None = None,
        record: Recorder | None = None,
        claims_in: str | None = None,
    ) -> ChainRun:
        """A run of the chain ``rec`` names, on the pod as it was set up (its netns, its members' progress).

        The caller holds the pod's lock and runs the action it wants (gc a teardown, the repairer a
        repair). ``members``: the recorded members as the caller selected them (default: each by
        :meth:`recorded_plugin`); ``record`` persists their progress; ``claims_in`` is the state dir
        of the IP claims.
        """
        ref = rec.ref
        return ChainRun(
            members if members is not None else recorded_members(rec.chain, self.recorded_plugin, self.member),
            ref,
            lambda a: self._context(a, ref, pod_obj, node=node),
            list(rec.chain),
            netns=rec.netns,
            record=record,
            observe=self.hooks.observe,
            claims_in=claims_in,
        )

    def _lookup(self, pod: PodRef, action: Action) -> dict[str, Any] | None:
        try:
            return self.host.get_pod_by_name(pod.namespace, pod.name)
        except HostError:
            if action is Action.SETUP:
                raise
            # Teardown and status must work while the API is away: the plugin owns its resources.
            return None

    def stock(self) -> None:
        """Spare inodes for pod records and lock files, made ahead of the pods (the daemon at start)."""
        if self.state is not None:
            self.state.stock()
        stock_pod_locks(self.config.run_dir)

    def pod_lock(self, pod: PodRef, *, live: bool = False) -> AbstractContextManager[PodLock]:
        """Serialise every action on one pod, across threads and processes (see :func:`pod_locked`)."""
        return pod_locked(self.config.run_dir, pod, live=live)

    def _run(
        self,
        action: Action,
        pod: PodRef,
        pod_obj: dict[str, Any] | None,
        call: CallOptions | None,
        node: NodeInfo,
        states: list[MemberState] | None = None,
        members: tuple[Member, ...] | None = None,
    ) -> ChainRun:
        """One pod action across ``members`` (default: the configured chain) with contexts and metrics."""
        members = members or self.members()
        netns = self._context(action, pod, None, call, node=node).netns
        if states is None or [m.plugin for m in states] != [m.name for m in members]:
            states = fresh_states(members)  # no record, or one of another chain: nothing to pass on
        return ChainRun(
            members,
            pod,
            lambda a: self._context(a, pod, pod_obj, call, node=node),
            list(states),
            netns=netns,
            observe=self.hooks.observe,
            claims_in=self.config.state_dir if self.state is not None else None,
        )

    def setup(self, pod: PodRef, call: CallOptions | None = None) -> PodNetworkStatus | None:
        """Set up the pod's network. Returns its status when the state store wants it recorded.

        Before anything runs, a netns that is this process's or the node's own (or a FIFO or
        device) is refused: InvalidArgument ``netns`` (see :func:`netns_problem`).
        """
        return self._reporting.run(Action.SETUP, pod, lambda: self._setup(pod, call))

    def _setup(self, pod: PodRef, call: CallOptions | None) -> PodNetworkStatus | None:
        netns = call.netns if call is not None and call.netns is not None else self.config.netns_path(pod.infra_id)
        problem = netns_problem(netns)
        if problem is not None:
            raise InvalidArgument("netns", netns, problem)
        node = self.node()
        self.init(node=node)
        with self.pod_lock(pod, live=True):
            pod_obj = self._lookup(pod, Action.SETUP)
            run = self._run(Action.SETUP, pod, pod_obj, call, node)
            state = self.state
            if state is not None:
                begun = False
                also = call.durable_with if call is not None else ()

                def record(states: tuple[MemberState, ...]) -> None:
                    # The first write is the record's begin: durable before the first member runs, in
                    # one group commit with the caller's files (the CNI attachment record).
                    nonlocal begun
                    if begun:
                        state.progress(pod, states)
                        return
                    first = states[0]
                    state.begin(
                        pod, first.plugin, first.version, run.netns, pod_obj=pod_obj, members=states, durable_with=also
                    )
                    begun = True

                run.record = record
            try:
                reported = run.setup()
            except NetpluginError as e:
                self._rollback(run, e)
                raise
            if state is not None and not begun:
                record(tuple(run.states))  # no member handles setup: the pod is still recorded
            status = reported  # a member that gives its status with setup spares the status call
            status_error: PluginError | None = None
            want = call is not None and call.want_status
            if status is None and (want or (state is not None and state.record_status)):
                # one more exec on the pod-start path, for the record's IP (and the caller's)
                try:
                    status = run.status()
                except PluginError as e:
                    status, status_error = None, e  # setup succeeded; a status failure must not undo it
            if state is not None:
                state.complete(pod, status.ip if status else None, members=tuple(run.states))
            if want and status_error is not None:
                raise status_error  # the caller asked for the status: it gets the failure
            return status

    def _rollback(self, run: ChainRun, err: NetpluginError) -> None:
        """Tear down, in reverse, the members whose setup started; report every failure on ``err``."""
        if not self.config.rollback_on_failure:
            return
        failures = run.rollback()
        if failures:
            attach_failures(err, failures, chain=run.names)
            if self.state is not None:  # the record (and its members' progress) stays: gc retries what is left
                self.state.mark_rollback_failed(run.pod, err.details["rollback_error"])
            return
        err.details["rolled_back"] = True
        if self.state is not None:
            self.state.remove(run.pod)

    def teardown(self, pod: PodRef, call: CallOptions | None = None) -> None:
        """Tear down the pod's network (also when netplugin has no record of it)."""
        self._reporting.run(Action.TEARDOWN, pod, lambda: self._teardown(pod, call))

    def _teardown(self, pod: PodRef, call: CallOptions | None) -> None:
        node = self.node(strict=False)
        init_error: NetpluginError | None = None
        try:
            self.init(node=node)
        except NetpluginError as e:  # best effort: what the pod holds may still be freed (by its own chain)
            init_error = e
        with self.pod_lock(pod):
            try:
                self._teardown_locked(pod, node, call)
            except NetpluginError as e:
                if init_error is not None:
                    e.details["init_error"] = init_error.message
                raise

    def _teardown_locked(self, pod: PodRef, node: NodeInfo, call: CallOptions | None = None) -> None:
        pod_obj = self._lookup(pod, Action.TEARDOWN)
        rec = None
        if self.state is not None:
            rec = self.state.begin_teardown(pod)  # the record as marked: no second read
        # the members that set the pod up, whatever the config says now (no record: the configured chain)
        members = recorded_members(rec.chain, self.recorded_plugin, self.member) if rec is not None else None
        run = self._run(Action.TEARDOWN, pod, pod_obj, call, node, list(rec.chain) if rec else None, members)
        if rec is not None and self.state is not None:
            run.record = functools.partial(self.state.progress, pod)
        run.teardown()
        if self.state is not None:
            self.state.remove(pod)

    def status(self, pod: PodRef, call: CallOptions | None = None) -> PodNetworkStatus | None:
        """The pod's network status, as its chain answers it (None: no member knows an IP)."""
        return self._reporting.run(Action.STATUS, pod, lambda: self._status(pod, call))

    def _status(self, pod: PodRef, call: CallOptions | None) -> PodNetworkStatus | None:
        node = self.node(strict=False)
        self.init(node=node)
        with self.pod_lock(pod) as hold:
            pod_obj = self._lookup(pod, Action.STATUS)
            rec = self._record_quietly(pod)
            hold.live = rec is not None
            run = self._run(Action.STATUS, pod, pod_obj, call, node, list(rec.chain) if rec is not None else None)
            result = run.status()
            if self.state is not None and result is not None:
                self.state.observe_ip(pod, result.ip)  # records the IP without an exec at setup
            return result

    def _record_quietly(self, pod: PodRef) -> PodRecord | None:
        """The pod's record for a read-only action (status): a corrupt one counts as none."""
        if self.state is None or len(self.plugins) < 2:
            return None  # a chain of one has nothing to pass on: no read on the status path
        try:
            return self.state.get(pod)
        except NetpluginError:
            return None
