"""Plugin processes whose netplugin died, and settling them as it would have.

A plugin call runs in a session of its own (its leader is the executable netplugin
started), so it outlives a netplugin that is killed. Such processes are found, and only
such processes:

* a process counts only if its ``NETPLUGIN_CALL_ID`` token verifies (see
  :mod:`netplugin.core.execplugin.calls`: an HMAC under a root-only key over the call's own
  ``NETPLUGIN_*`` variables), it runs as netplugin's uid, and it started no earlier than
  the token says: planted processes with copied ``NETPLUGIN_*`` variables are ignored;
* the call's leader is the token-bearing session leader whose argv ends with the call's
  argv; every other process of its session belongs to the call too, also one that
  dropped its environment (``env -i``) -- a session id is the leader's pid, and Linux never
  reuses a pid while a session with that id exists;
* a token-bearing process that called ``setsid`` (the contract's daemon) is not part of
  the call: it, and its own session, are never signalled.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import psutil

from netplugin.core.errors import NetpluginError
from netplugin.core.execplugin.calls import ENV as CALL_ENV
from netplugin.core.execplugin.calls import boot_clock, call_key, token_time, verify_token
from netplugin.core.names import PodRef
from netplugin.core.procs import proc_start

__all__ = ["POD_ACTIONS", "PluginProcess", "plugin_processes", "settle"]

POD_ACTIONS = ("setup", "teardown", "status", "repair")
# Process start times (clock ticks since boot) and token times (ms since boot) are compared with
# this slack: a process cannot be older than the call whose token it carries.
_START_SLACK = 0.5
_TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class PluginProcess:
    """A process of a plugin call netplugin made (proven by its call token, or by its session)."""

    pid: int
    pgid: int
    sid: int
    action: str
    plugin: str
    namespace: str
    name: str
    infra_id: str
    #: start time (wall clock, as psutil gives it: to tell a reused pid)
    started: float
    #: whether this is the plugin executable netplugin started (its session leader, with the call's argv)
    call_leader: bool = False
    #: when the call began (from its token; seconds since boot)
    call_started: float = 0.0

    @property
    def ref(self) -> PodRef | None:
        try:
            return PodRef(self.namespace, self.name, self.infra_id)
        except NetpluginError:
            return None


def _environ(pid: int) -> dict[str, str] | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read()
    except OSError:
        return None
    if b"NETPLUGIN_" not in data:
        return None
    out: dict[str, str] = {}
    for item in data.split(b"\0"):
        if item.startswith(b"NETPLUGIN_"):
            k, _, v = item.partition(b"=")
            out[k.decode("ascii", "replace")] = os.fsdecode(v)
    return out


def _identity(pid: int) -> tuple[int, int, int, float, list[str], float] | None:
    """(uid, pgid, sid, start time, argv, start in seconds since boot) of a live, non-zombie process."""
    ticks = proc_start(pid)
    if ticks is None:
        return None
    try:
        proc = psutil.Process(pid)
        uids = proc.uids()
        if uids.real != uids.effective:
            return None  # a setuid program is nobody's plugin
        return uids.real, os.getpgid(pid), os.getsid(pid), proc.create_time(), proc.cmdline(), ticks / _TICK
    except (psutil.Error, OSError):
        return None


def _pids() -> list[int]:
    me = os.getpid()
    return [int(n) for n in os.listdir("/proc") if n.isdigit() and int(n) != me]


def plugin_processes(state_dir: str, *, pod: PodRef | None = None) -> list[PluginProcess]:
    """Live processes of plugin calls netplugin made for this state dir (optionally: one pod's actions).

    Detached daemons (token-bearing session leaders that are not a call's leader) and their
    sessions are left out: they are the plugin's business.
    """
    key = call_key(state_dir, create=False)
    if key is None:
        return []  # no call was ever made with this state dir
    euid = os.geteuid()
    tokened: list[PluginProcess] = []
    detached: set[int] = set()
    for pid in _pids():
        env = _environ(pid)
        if env is None or env.get("NETPLUGIN_STATE_DIR") != state_dir or CALL_ENV not in env:
            continue
        ident = _identity(pid)
        if ident is None or ident[0] != euid or not verify_token(key, env):
            continue
        _, pgid, sid, started, argv, boot_start = ident
        call_started = token_time(env[CALL_ENV]) or 0.0
        if boot_start < call_started - _START_SLACK:
            continue  # older than the call it claims: not started by it
        action = env.get("NETPLUGIN_ACTION", "")
        ns, pname, infra = (env.get(f"NETPLUGIN_{k}", "") for k in ("POD_NAMESPACE", "POD_NAME", "INFRA_ID"))
        call_argv = [action, ns, pname, infra] if action in POD_ACTIONS else [action]
        # An interpreted plugin shows as [interpreter, script, args...]: compare the tail.
        leader = sid == pid and argv[-len(call_argv) :] == call_argv
        if sid == pid and not leader:
            detached.add(pid)
            continue
        proc = PluginProcess(
            pid, pgid, sid, action, env.get("NETPLUGIN_PLUGIN", ""), ns, pname, infra, started, leader, call_started
        )
        want = None if pod is None else (pod.namespace, pod.name, pod.infra_id)
        if want is not None and (action not in POD_ACTIONS or (ns, pname, infra) != want):
            continue
        tokened.append(proc)
    tokened = [p for p in tokened if p.sid not in detached]
    return tokened + _session_members(tokened, euid)


def _session_members(tokened: list[PluginProcess], euid: int) -> list[PluginProcess]:
    """The processes in the calls' sessions that carry no token (they dropped their environment)."""
    sessions: dict[int, PluginProcess] = {}
    for p in tokened:
        sessions.setdefault(p.sid, p)
    known = {p.pid for p in tokened}
    out: list[PluginProcess] = []
    if not sessions:
        return out
    for pid in _pids():
        if pid in known:
            continue
        try:
            sid = os.getsid(pid)
        except OSError:
            continue
        like = sessions.get(sid)
        if like is None:
            continue
        ident = _identity(pid)
        if ident is None or ident[0] != euid or ident[2] != sid or ident[5] < like.call_started - _START_SLACK:
            continue
        out.append(replace(like, pid=pid, pgid=ident[1], started=ident[3], call_leader=False))
    return out


def _alive(p: PluginProcess) -> bool:
    try:
        proc = psutil.Process(p.pid)
        return abs(proc.create_time() - p.started) < 0.01 and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _signal_all(procs: list[PluginProcess], sig: int) -> None:
    live = [p for p in procs if _alive(p)]
    own_groups = {p.pid for p in live if p.pid == p.pgid}
    for p in live:
        try:
            if p.pgid in own_groups:  # the group's leader is one of them: the whole group is theirs
                os.killpg(p.pgid, sig)
            os.kill(p.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _wait_gone(procs: list[PluginProcess], until: float) -> bool:
    while True:
        if not any(_alive(p) for p in procs):
            return True
        if time.monotonic() >= until:
            return False
        time.sleep(0.01)


def _stop(procs: list[PluginProcess], grace: float) -> None:
    _signal_all(procs, signal.SIGTERM)
    if not _wait_gone(procs, time.monotonic() + grace):
        _signal_all(procs, signal.SIGKILL)
        _wait_gone(procs, time.monotonic() + 5.0)


def settle(procs: list[PluginProcess], *, timeout_for: Callable[[str], float], kill_grace: float) -> list[int]:
    """Finish what a dead netplugin left running, as it would have: returns the pids handled.

    The call's leader may run until the deadline the dead netplugin would have enforced (the
    call's start, from its token, plus the action's time limit); then the call's processes get
    SIGTERM, and after ``kill_grace`` SIGKILL (as on a timeout in :mod:`netplugin.core.execplugin.invoke`).
    What is left of a call's session once its leader exited is killed right away (as leftovers
    are). ``procs`` never holds detached daemons (see :func:`plugin_processes`).
    """
    if not procs:
        return []
    leaders = [p for p in procs if p.call_leader]
    first = min(p.call_started for p in procs)
    limit = min(timeout_for(p.action) if p.action in (*POD_ACTIONS, "init") else 30.0 for p in procs)
    deadline = time.monotonic() + max(0.0, first + limit - boot_clock())
    if leaders and not _wait_gone(leaders, deadline):
        _stop(procs, kill_grace)
        return sorted(p.pid for p in procs)
    leftovers = [p for p in procs if not p.call_leader]
    if leftovers:
        _stop(leftovers, min(kill_grace, 0.5))
    return sorted(p.pid for p in procs)
