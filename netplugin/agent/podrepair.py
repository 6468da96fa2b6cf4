"""Pod-level self-repair: a ready pod whose host interface lost something gets its chain's ``repair``.

The kernel watch (:mod:`netplugin.nodenet.kernelwatch`, :mod:`netplugin.nodenet.linkview`) says which
interfaces lost something (a
master, hairpin, a qdisc, their bridge); this repairer maps them to the ready pods whose records
name them as a member's host interface, and on its own thread (a repair waits for the pod's lock,
and must not hold up the routes) runs each such pod's repair (:mod:`netplugin.manager.repair`).
A pod whose host interface is gone is **broken**: only a new setup (its sandbox recreated) can
mend it, so it is reported (log, ``health``, ``netplugin_pods_broken``, ``pods``), never repaired
or faked as healthy. Pods in setup or teardown are left to their action.

Each thing put back is logged (``repair (KIND) of pod NS/NAME in 0.012s: what``) and counted in
the keeper's repair counter, by the kinds of :data:`netplugin.core.plugin.REPAIR_KINDS`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from netplugin.agent.worker import Worker
from netplugin.core.errors import NetpluginError, StateError
from netplugin.core.fileio import TMP_INFIX
from netplugin.manager.repair import repair_kind, repair_pod
from netplugin.nodenet.linkview import Lost
from netplugin.store.listing import link_gone
from netplugin.store.records import READY, RECORD_SUFFIX

if TYPE_CHECKING:
    from netplugin.manager.manager import Manager
    from netplugin.store.records import PodRecord

__all__ = ["PodRepairer"]

log = logging.getLogger("netplugin.repair")

#: pods repaired at once (each runs its chain's repair: a process per exec member)
PARALLEL = 8


def _key(rec: PodRecord) -> str:
    """``NS/NAME/INFRA_ID``: a pod's sandbox (as ``gc --forget`` names it)."""
    return f"{rec.ref}/{rec.ref.infra_id}"


def _host_interfaces(rec: PodRecord) -> list[str]:
    return [m.host_interface for m in rec.chain if m.ran and m.host_interface]


class PodRepairer:
    """Repairs the ready pods whose host interfaces lost something; keeps the broken ones."""

    def __init__(
        self,
        manager: Callable[[], Manager],
        repairs: Counter[str],
        lock: threading.Lock,
        on_incident: Callable[[], None] = lambda: None,
    ) -> None:
        self.manager = manager
        self.repairs = repairs  #: shared with the node keeper: one counter, one metric
        self._lock = lock  #: guards ``repairs`` and ``broken`` (the keeper's lock)
        #: pod (``ns/name/infra-id``) -> why it is broken
        self.broken: dict[str, str] = {}
        self.failures = 0
        #: told once per pass that put something back (one breakage, however many pods it hit)
        self.on_incident = on_incident
        #: pods whose chain's repair was run (a pod setup or teardown never causes one)
        self.calls = 0
        self._pending = Lost(set(), set())
        #: record path -> ((inode, mtime, size), record): a pass re-reads only the files that changed
        self._records: dict[str, tuple[tuple[int, int, int], PodRecord]] = {}
        self._worker = Worker("netplugin-pod-repair", self._loop)

    def start(self) -> None:
        self._pending.damaged.add("")  # the first pass: every ready pod's host interface checked once
        self._worker.wake()
        self._worker.start()

    def stop(self) -> None:
        self._worker.stop()

    def lost(self, lost: Lost) -> None:
        """The kernel watch's report (on its thread): look at these interfaces' pods soon."""
        with self._lock:
            self._pending.gone |= lost.gone
            self._pending.damaged |= lost.damaged
        self._worker.wake()

    def _loop(self) -> None:
        while not self._worker.stopping:
            self._worker.sleep()
            with self._lock:
                pending, self._pending = self._pending, Lost(set(), set())
            if self._worker.stopping:
                return
            try:
                self.run(pending.gone | pending.damaged, every="" in pending.damaged)
            except NetpluginError as e:
                log.error("pod repair: cannot read the pod records: %s", e.message)

    def run(self, names: set[str], *, every: bool = False) -> None:
        """One pass: each ready pod with a host interface in ``names`` (``every``: all) checked."""
        manager = self.manager()
        if manager.state is None:
            return
        records = self._ready_records(manager.state.dir, manager.state.load)
        live = {_key(r) for r in records}
        with self._lock:
            for pod in [p for p in self.broken if p not in live]:
                del self.broken[pod]  # torn down (or its record gone): no longer broken
        hit = [(rec, hifs) for rec in records if (hifs := _host_interfaces(rec)) and (every or names & set(hifs))]
        if not hit:
            return
        # The first pod alone: what pods share (the bridge) is put back once, by its repair; then
        # the rest in parallel (actions on different pods may overlap), so a node's worth of ports
        # comes back in a few plugin calls' time rather than in one per pod.
        changed = self._pod(manager, *hit[0])
        if len(hit) > 1:
            with ThreadPoolExecutor(min(PARALLEL, len(hit) - 1), thread_name_prefix="netplugin-repair") as pool:
                changed |= any(list(pool.map(lambda h: self._pod(manager, *h), hit[1:])))
        if changed:
            self.on_incident()

    def _ready_records(self, records_dir: str, load: Callable[[str], PodRecord]) -> list[PodRecord]:
        """The ready pods' records. Every teardown deletes a host veth (a loss), so on a full node a
        parse of every record per pass would tax every teardown: only changed files are read again."""
        fresh: dict[str, tuple[tuple[int, int, int], PodRecord]] = {}
        try:
            with os.scandir(records_dir) as it:
                entries = [e for e in it if e.name.endswith(RECORD_SUFFIX) and TMP_INFIX not in e.name]
        except FileNotFoundError:
            entries = []
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
                sig = (st.st_ino, st.st_mtime_ns, st.st_size)
                known = self._records.get(entry.path)
                fresh[entry.path] = known if known is not None and known[0] == sig else (sig, load(entry.path))
            except (FileNotFoundError, StateError):
                continue  # removed while listed, or being rewritten: its own action owns it
        self._records = fresh
        return [rec for _, rec in fresh.values() if rec.state == READY]

    def _pod(self, manager: Manager, rec: PodRecord, hifs: list[str]) -> bool:
        """Check and repair one pod; True when its repair put something back."""
        pod = _key(rec)
        missing = [h for h in hifs if link_gone(h)]
        if missing:
            why = f"host interface {', '.join(missing)} is gone: the pod needs a new sandbox (a new setup)"
            with self._lock:
                known = self.broken.get(pod) == why
                self.broken[pod] = why
            if not known:
                log.error("pod %s is broken: %s", pod, why)
            return False
        start = time.monotonic()
        with self._lock:
            self.calls += 1
        try:
            done = repair_pod(manager, rec.ref)
        except NetpluginError as e:
            with self._lock:
                self.failures += 1
            log.error("repair of pod %s failed: %s", pod, e.message)
            return False
        took = time.monotonic() - start
        for member, line in done.changes:
            kind = repair_kind(line)
            with self._lock:
                self.repairs[kind] += 1
            log.warning("repair (%s) of pod %s in %.3fs by %s: %s", kind, pod, took, member, line)
        for err in done.errors:
            with self._lock:
                self.failures += 1
            log.error("repair of pod %s failed: %s", pod, err)
        if done.unrepairable:
            log.info("pod %s: %s declare(s) no repair: not put back", pod, ", ".join(done.unrepairable))
        return bool(done.changes)
