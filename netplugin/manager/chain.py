"""Running one pod action across a plugin chain: order, rollback, deadlines, per-member progress.

The semantics are the contract's (``docs/plugin-contract.md``, "Chains"); this module is their
one implementation, for the manager and gc alike:

* ``setup`` runs the members that handle it in order, each with what is left of the action's
  time limit and the prev result of the members before it. When member k fails (or times out, or
  no time is left for it), :meth:`ChainRun.rollback` tears down k, then k-1 ... 1, in reverse;
  members after k never run. Rollback never stops at a failure: every failure is reported.
* ``teardown`` runs every member that handles it in reverse, goes on past failures and raises
  the first member's error with every failure attached (:func:`attach_failures`).
* In teardown and rollback each member gets its own action time limit: a member that hangs is
  killed at its limit and reported, and the members before it still run with their whole limit.
* ``status`` asks the members that handle it in order and returns the first status with an IP.

Progress goes to ``record`` (the pod record) as a tuple of :class:`MemberState`: before a member's
setup starts, and after a member's teardown succeeded, so that a kill anywhere leaves a record
from which gc tears down exactly the members that ran. ``observe`` gets each member call's
duration and outcome (the daemon's per-member histogram).
"""

from __future__ import annotations

# Imports inside this module's functions are kept for the per-call import set
# (tests/frontends/fastpath.py): each keeps a module off the calls that do not need it
# (BENCHMARKS.md rows B-i and B: the CLI's cold start and per-pod run without a daemon).
import time
from collections.abc import Callable, Sequence
from typing import cast

from netplugin.core import plaindata
from netplugin.core.chaining import ALL_POD_ACTIONS, DECLARES_HOST_PORTS, MemberResult, PrevResult
from netplugin.core.errors import NetpluginError, PluginInvalid, PluginOutputError, PluginTimeout
from netplugin.core.hostports import ENV_HOST_PORTS, unmapped
from netplugin.core.names import PodRef
from netplugin.core.plaindata import dataclass, field
from netplugin.core.plugin import Action, CallContext, Plugin, PodNetworkStatus
from netplugin.core.podlink import pod_veth_problem
from netplugin.store.ipclaims import claim_ips, release_ips
from netplugin.store.records import MEMBER_PENDING, MEMBER_SKIPPED, MEMBER_TORN_DOWN, READY, SETTING_UP, MemberState

__all__ = [
    "ChainRun",
    "Member",
    "Observer",
    "Recorder",
    "absent_member",
    "attach_failures",
    "fresh_states",
    "recorded_members",
]

#: (member name, action, seconds, outcome: "ok" | "error" | "timeout")
Observer = Callable[[str, str, float, str], None]
#: writes the members' progress to the pod record (durably) before the run goes on
Recorder = Callable[[tuple[MemberState, ...]], None]

# Below this, a member cannot even be started: it counts as timed out without running.
_MIN_LEFT = 0.001


@dataclass(frozen=True)
class Member:
    """A selected chain member and the pod actions it handles (its action mask)."""

    plugin: Plugin
    handles: frozenset[str] = ALL_POD_ACTIONS

    @property
    def name(self) -> str:
        return self.plugin.name


def attach_failures(err: NetpluginError, failures: Sequence[NetpluginError], *, chain: Sequence[str]) -> None:
    """Report ``failures`` (rollback or later teardown failures) on ``err``, each naming its member."""
    if not failures:
        return
    text = "; ".join(f.message for f in failures)
    err.details["rollback_error"] = text
    if len(chain) > 1:
        err.details["chain_failures"] = [f.to_dict() for f in failures]
    # Said in the text too: what the failed setup left is still there, and who finishes it.
    kept = "the pod's record is kept: netplugin gc retries it"
    err.message = f"{err.message}; and its rollback failed too: {text} ({kept})"
    err.args = (err.message,)


@dataclass
class ChainRun:
    """One pod action on one pod across ``members``.

    ``context(action)`` builds a member's call context without the chain's variables; ``states``
    is each member's progress (from the pod record, or fresh); ``record`` persists it.
    """

    members: Sequence[Member]
    pod: PodRef
    context: Callable[[Action], CallContext]
    states: list[MemberState]
    netns: str = ""
    record: Recorder | None = None
    observe: Observer | None = None
    #: the state dir whose IP claims (:mod:`netplugin.store.ipclaims`) the members' addresses take
    claims_in: str | None = None
    #: the members whose setup started in this run, in order (rollback tears down these)
    started: list[int] = field(default_factory=list)
    #: what each member's repair put back (its ``KIND: what`` lines), by member index
    repaired: dict[int, tuple[str, ...]] = field(default_factory=dict)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.members)

    def _prev(self, index: int) -> PrevResult:
        reports = [
            MemberResult(s.plugin, s.ips, s.host_interface) if s.ips or s.host_interface else None for s in self.states
        ]
        return PrevResult(self.names, self.netns).before(index, reports)

    def _save(self) -> None:
        if self.record is not None:
            self.record(tuple(self.states))

    def _call(self, index: int, action: Action, deadline: list[float]) -> PodNetworkStatus | None:
        """One member's action with what is left of the phase's limit; errors name the member.

        ``deadline`` is empty until the phase's first call, which gets the whole limit and sets it.
        """
        member = self.members[index]
        base = self.context(action)
        if not deadline:
            deadline.append(time.monotonic() + base.timeout)
            left = base.timeout
        else:
            left = deadline[0] - time.monotonic()
        if left < _MIN_LEFT:
            raise PluginTimeout(plugin=member.name, action=action.value, timeout=base.timeout, pod=str(self.pod))
        ctx = plaindata.replace(base, timeout=left, env={**base.env, **self._prev(index).env(index)})
        start = time.monotonic()
        outcome = "error"
        try:
            if action is Action.SETUP:
                result = member.plugin.setup(self.pod, ctx)
            elif action is Action.TEARDOWN:
                result = None
                member.plugin.teardown(self.pod, ctx)
            elif action is Action.REPAIR:
                result = None
                self.repaired[index] = member.plugin.repair(self.pod, ctx)
            else:
                result = member.plugin.status(self.pod, ctx)
            outcome = "ok"
            return result
        except PluginTimeout:
            outcome = "timeout"
            raise
        except NetpluginError as e:
            if len(self.members) > 1:
                e.details.setdefault("chain", list(self.names))
                e.details.setdefault("member", index + 1)
            raise
        finally:
            if self.observe is not None:
                self.observe(member.name, action.value, time.monotonic() - start, outcome)

    # --- setup and rollback ------------------------------------------------------------------------

    def setup(self) -> PodNetworkStatus | None:
        """Set the pod up member by member; on failure the error is raised without rollback.

        The caller rolls back (:meth:`rollback`) so that it decides about records first. Returns the
        first status with an address that a member's setup reported.
        """
        wanted = self.context(Action.SETUP).env.get(ENV_HOST_PORTS)
        if wanted and not any(DECLARES_HOST_PORTS in m.handles for m in self.members):
            from netplugin.plugins.hostport import HOSTPORT_MEMBERS  # the error's hint only: off the setup path

            raise unmapped(self.names, wanted, HOSTPORT_MEMBERS)  # before any member runs: nothing to roll back
        deadline: list[float] = []
        macs: dict[int, str] = {}  # not recorded: only this call's result needs the pod interface's MAC
        for i, m in enumerate(self.members):
            if "setup" not in m.handles:
                self.states[i] = plaindata.replace(self.states[i], state=MEMBER_SKIPPED)
        for i, m in enumerate(self.members):
            if "setup" not in m.handles:
                continue
            self.states[i] = plaindata.replace(self.states[i], state=SETTING_UP, ips=(), host_interface=None)
            self.started.append(i)
            self._save()  # durable before the member runs: from now on it may hold resources
            got = self._call(i, Action.SETUP, deadline)
            ips = got.ips if got is not None else ()
            hif = got.host_interface if got is not None else None
            if hif is not None and i < len(self.members) - 1:
                self._vouch(i, hif)  # later members act on it: it must be the pod's
            if ips and self.claims_in is not None:
                self._claim(i, ips, self.claims_in)
            if got is not None and got.mac:
                macs[i] = got.mac
            self.states[i] = plaindata.replace(self.states[i], state=READY, ips=ips, host_interface=hif)
        first = next((i for i, s in enumerate(self.states) if s.ips), None)
        if first is None:
            return None
        s = self.states[first]
        return PodNetworkStatus(s.ips[0], s.ips, s.host_interface, mac=macs.get(first))

    def _vouch(self, index: int, hif: str) -> None:
        """Pass ``hostInterface`` on only if it is a veth whose peer is in the pod's netns (not ``eth0``)."""
        problem = pod_veth_problem(hif, self.netns)
        if problem is not None:
            raise self._refused(index, f"invalid 'hostInterface' {hif!r}: {problem}")

    def _claim(self, index: int, ips: tuple[str, ...], state_dir: str) -> None:
        """Refuse an address another live pod holds (two pods, one IP: one gets the other's traffic)."""
        held = claim_ips(state_dir, self.pod, ips)
        if held is not None:
            raise self._refused(index, f"reported the address {held}, another live pod's")

    def _refused(self, index: int, why: str) -> PluginOutputError:
        """A member's setup document that netplugin does not pass on: its setup fails (and rolls back)."""
        name = self.members[index].name
        err = PluginOutputError(f"network plugin {name!r} setup: {why}", plugin=name, action="setup")
        if len(self.members) > 1:
            err.details.update(chain=list(self.names), member=index + 1)
        return err

    def rollback(self) -> list[NetpluginError]:
        """Tear down the members whose setup started, last first; returns every failure."""
        return self._teardown_members([i for i in reversed(self.started) if "teardown" in self.members[i].handles])

    def _teardown_members(self, order: list[int]) -> list[NetpluginError]:
        failures: list[NetpluginError] = []
        for n, i in enumerate(order):
            try:
                self._call(i, Action.TEARDOWN, [])  # its own limit: a hung member must not strand the rest
            except NetpluginError as e:
                failures.append(e)
                continue
            if self.claims_in is not None and self.states[i].ips:
                release_ips(self.claims_in, self.pod, self.states[i].ips)
            self.states[i] = plaindata.replace(self.states[i], state=MEMBER_TORN_DOWN)
            if n < len(order) - 1 or failures:
                self._save()  # after the last one, success removes the record: no write needed
        return failures

    # --- teardown and status -----------------------------------------------------------------------

    def teardown(self, *, only_ran: bool = False) -> None:
        """Tear down every member that handles teardown (``only_ran``: those that may hold resources).

        Goes on past failures; raises the first failure with every other attached.
        """
        order = [
            i
            for i in reversed(range(len(self.members)))
            if "teardown" in self.members[i].handles and (not only_ran or self.states[i].ran)
        ]
        failures = self._teardown_members(order)
        if failures:
            attach_failures(failures[0], failures[1:], chain=self.names)
            raise failures[0]

    def repair(self) -> tuple[list[NetpluginError], list[str]]:
        """Repair every member that ran and declares repair, in order, each with its own limit.

        Goes on past failures. Returns (the failures, the members that ran but cannot repair);
        what each member put back is in :attr:`repaired`.
        """
        failures: list[NetpluginError] = []
        unrepairable: list[str] = []
        for i, m in enumerate(self.members):
            if not self.states[i].ran:
                continue
            if "repair" not in m.handles:
                unrepairable.append(m.name)
                continue
            try:
                self._call(i, Action.REPAIR, [])
            except NetpluginError as e:
                failures.append(e)
        return failures, unrepairable

    def status(self) -> PodNetworkStatus | None:
        """The first status, in chain order, that reports an address."""
        deadline: list[float] = []
        for i, m in enumerate(self.members):
            if "status" in m.handles:
                got = self._call(i, Action.STATUS, deadline)
                if got is not None:
                    return got
        return None


class _Absent:
    """Stands in for a recorded member that is no longer installed (or no longer valid)."""

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason = reason

    def version(self) -> str:
        return "absent"

    def version_key(self) -> None:
        return None

    def _never(self, *_: object) -> None:
        raise PluginInvalid(
            self.name, f"is no longer usable ({self.reason}); the pod's record is kept until its teardown can run"
        )

    init = setup = teardown = status = repair = node = _never


def absent_member(name: str, reason: str = "not installed", *, ran: bool = False) -> Member:
    """A recorded member whose plugin is gone.

    One that never ran for the pod handles no action (it holds nothing). One that ran still owes
    its teardown: it "handles" teardown by failing with ``reason``, so the failure is reported,
    the other members still run, and the record is kept for a later teardown or gc.
    """
    return Member(cast(Plugin, _Absent(name, reason)), frozenset({"teardown"}) if ran else frozenset())


def recorded_members(
    states: Sequence[MemberState], plugin: Callable[[str], Plugin], member: Callable[[Plugin], Member]
) -> tuple[Member, ...]:
    """The members a pod record names, whatever the config says now (teardown and gc use these).

    ``plugin`` finds a plugin by its recorded name, ``member`` gives it its action mask. A plugin
    that cannot be found or is no longer valid becomes an :func:`absent_member`.
    """
    out: list[Member] = []
    for s in states:
        try:
            out.append(member(plugin(s.plugin)))
        except NetpluginError as e:
            out.append(absent_member(s.plugin, e.message, ran=s.ran))
        except OSError as e:  # its file went away since it was selected
            out.append(absent_member(s.plugin, e.strerror or str(e), ran=s.ran))
    return tuple(out)


def fresh_states(members: Sequence[Member]) -> list[MemberState]:
    """Every member pending (a setup that has not started)."""
    return [MemberState(m.name, m.plugin.version(), MEMBER_PENDING) for m in members]
