"""Plugin processes left running by a netplugin that died.

A plugin call runs in a session of its own, so it survives a killed netplugin. Such orphans are
found through /proc, allowed to finish within their action's time limit, then stopped, before
any new action on the same pod starts (so an orphaned setup never races the teardown after it).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from netplugin.core.errors import NetpluginError
from netplugin.core.names import PodRef

__all__ = ["PluginProcess", "plugin_processes", "settle"]


POD_ACTIONS = ("setup", "teardown", "status")


@dataclass(frozen=True, slots=True)
class PluginProcess:
    """A process started by a plugin call (found by the NETPLUGIN_* variables of its environment)."""

    pid: int
    pgid: int
    sid: int
    action: str
    plugin: str
    namespace: str
    name: str
    infra_id: str
    started: float
    #: whether this is the plugin executable netplugin started (its session leader, with the call's argv)
    call_leader: bool = False

    @property
    def ref(self) -> PodRef | None:
        try:
            return PodRef(self.namespace, self.name, self.infra_id)
        except NetpluginError:
            return None


def _environ(pid: int) -> dict[bytes, bytes] | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read()
    except OSError:
        return None
    if b"NETPLUGIN_ACTION=" not in data:
        return None
    out: dict[bytes, bytes] = {}
    for item in data.split(b"\0"):
        if item.startswith(b"NETPLUGIN_"):
            k, _, v = item.partition(b"=")
            out[k] = v
    return out


def plugin_processes(state_dir: str, *, pod: PodRef | None = None) -> list[PluginProcess]:
    """Live processes of plugin calls made for this state dir (optionally: for one pod's actions).

    A plugin's children inherit its environment, so this finds the whole tree, including
    processes that left the plugin's process group or session.
    """
    import psutil

    want_dir = os.fsencode(state_dir)
    me = os.getpid()
    out: list[PluginProcess] = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        pid = int(name)
        env = _environ(pid)
        if env is None or env.get(b"NETPLUGIN_STATE_DIR") != want_dir:
            continue

        def var(key: bytes, env: dict[bytes, bytes] = env) -> str:
            return env.get(key, b"").decode("utf-8", "replace")

        action, ns, pname, infra = (
            var(b"NETPLUGIN_ACTION"),
            var(b"NETPLUGIN_POD_NAMESPACE"),
            var(b"NETPLUGIN_POD_NAME"),
            var(b"NETPLUGIN_INFRA_ID"),
        )
        if pod is not None and (
            action not in POD_ACTIONS or (ns, pname, infra) != (pod.namespace, pod.name, pod.infra_id)
        ):
            continue
        try:
            proc = psutil.Process(pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            started = proc.create_time()
            pgid, sid = os.getpgid(pid), os.getsid(pid)
            argv = proc.cmdline()
        except (psutil.Error, OSError):
            continue
        # An interpreted plugin shows as [interpreter, script, args...]: compare the tail.
        call_argv = [action, ns, pname, infra] if action in POD_ACTIONS else [action]
        leader = sid == pid and argv[-len(call_argv) :] == call_argv
        out.append(PluginProcess(pid, pgid, sid, action, var(b"NETPLUGIN_PLUGIN"), ns, pname, infra, started, leader))
    return out


def _alive(p: PluginProcess) -> bool:
    import psutil

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

    The plugin executable (the call's session leader) may run until the deadline the dead
    netplugin would have enforced (its start plus the action's time limit); at the deadline
    everything found gets SIGTERM, then after ``kill_grace`` SIGKILL (as on a timeout in
    :mod:`netplugin.core.invoke`). Processes left in its session once it exited are killed right away
    (as leftovers are). Processes that detached into a session of their own are left alone, as a
    live netplugin would leave them, unless the call ran into its deadline.
    """
    if not procs:
        return []
    leaders = [p for p in procs if p.call_leader]
    if not leaders:
        # The leader exited or exec'd something else: every session leader may be it.
        leaders = [p for p in procs if p.pid == p.sid]
    first = min(p.started for p in leaders or procs)
    limit = min(timeout_for(p.action) if p.action in (*POD_ACTIONS, "init") else 30.0 for p in procs)
    deadline = time.monotonic() + max(0.0, first + limit - time.time())
    if not _wait_gone(leaders, deadline):
        _stop(procs, kill_grace)
        return sorted(p.pid for p in procs)
    leader_pids = {p.pid for p in leaders}
    # What is left of the calls' sessions (or of sessions whose leader is gone) is a leftover.
    leftovers = [p for p in procs if p.pid not in leader_pids and (p.sid in leader_pids or p.sid != p.pid)]
    detached = [p for p in procs if p.pid == p.sid and p.pid not in leader_pids]
    leftovers = [p for p in leftovers if all(p.sid != d.pid for d in detached)]
    if leftovers:
        _stop(leftovers, min(kill_grace, 0.5))
    return sorted(p.pid for p in leaders + leftovers)
