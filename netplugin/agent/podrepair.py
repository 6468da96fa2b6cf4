"""Pod-level self-repair: a ready pod whose host interface lost something gets its chain's ``repair``.

In detail: ``ARCHITECTURE.md``, "Module notes".

The kernel watch (:mod:`netplugin.nodenet.kernelwatch`, :mod:`netplugin.nodenet.linkview`) says which
interfaces lost something (a
master, hairpin, a qdisc, their bridge); this repairer maps them to the ready pods whose records
name them as a member's host interface, and on its own thread (a repair waits for the pod's lock,
and must not hold up the routes) runs each such pod's repair (:mod:`netplugin.manager.repair`).
A pod whose host interface is gone is **broken**: only a new setup (its sandbox recreated) can
mend it, so it is reported (log, ``health``, ``netplugin_pods_broken``, ``pods``), never repaired
or faked as healthy. Pods in setup or teardown are left to their action.
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

from netplugin.agent.repairlog import RepairLog
from netplugin.agent.worker import Worker
from netplugin.core.dirwatch import DirWatch
from netplugin.core.errors import NetpluginError, StateError
from netplugin.core.fileio import TMP_INFIX
from netplugin.manager.repair import repair_kind, repair_pod
from netplugin.nodenet.linkview import LostInterfaces
from netplugin.store.listing import link_gone
from netplugin.store.records import READY, RECORD_SUFFIX

if TYPE_CHECKING:
    from netplugin.manager.manager import Manager
    from netplugin.store.records import PodRecord

__all__ = ["PodRepairer"]

log = logging.getLogger("netplugin.repair")

#: pods repaired at once (each runs its chain's repair: a process per exec member)
PARALLEL = 8
#: the wait before a failed pod repair is tried again: doubled at each failure in a row, up to the max
RETRY_MIN = 0.2
RETRY_MAX = 5.0
#: failed repairs in a row after which the pod is shown broken
BROKEN_AFTER = 3
#: a loss this soon after a pod's repair, naming only its interfaces, counts as caused by it
SELF_WINDOW = 0.5
#: rounds in a row of such a loop after which the pod's repair is cut off
LOOP_ROUNDS = 20


def _key(rec: PodRecord) -> str:
    """``NS/NAME/INFRA_ID``: a pod's sandbox (as ``gc --forget`` names it)."""
    return f"{rec.ref}/{rec.ref.infra_id}"


def _is_record(name: str) -> bool:
    return name.endswith(RECORD_SUFFIX) and TMP_INFIX not in name


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
        repair_log: RepairLog | None = None,
        limit: Callable[[], float] = lambda: 120.0,
    ) -> None:
        self.manager = manager
        self.repairs = repairs  #: shared with the node keeper: one counter, one metric
        self._lock = lock  #: guards ``repairs`` and ``broken`` (the keeper's lock)
        #: pod (``ns/name/infra-id``) -> why it is broken
        self.broken: dict[str, str] = {}
        self.failures = 0
        #: pod -> (failures in a row, when it is tried again (monotonic), the last error)
        self.failing: dict[str, tuple[int, float, str]] = {}
        #: pod -> why its repair was cut off (it re-triggers itself)
        self.looping: dict[str, str] = {}
        #: pod -> (rounds in a row its repair caused the next loss, when its last repair ended)
        self._streak: dict[str, tuple[int, float]] = {}
        self._first_loss: float | None = None  #: when the pending losses began (monotonic)
        self.repair_log = repair_log or RepairLog(log)
        #: told once per pass that put something back (one breakage, however many pods it hit)
        self.on_incident = on_incident
        #: pods whose chain's repair was run (a pod setup or teardown never causes one)
        self.calls = 0
        self._pending = LostInterfaces()
        #: record path -> ((inode, mtime, size), record): a pass re-reads only the files that changed
        self._records: dict[str, tuple[tuple[int, int, int], PodRecord]] = {}
        #: the ready pods' records by pod key, and the pod keys by host interface (from ``_records``)
        self._ready: dict[str, PodRecord] = {}
        self._by_hif: dict[str, set[str]] = {}
        #: the records dir's watch: which files changed since the last pass
        self._watch: DirWatch | None = None
        #: record files a pass could not read (being rewritten): read again by the next
        self._unread: set[str] = set()
        self._worker = Worker("netplugin-pod-repair", self._loop, limit)

    @property
    def worker(self) -> Worker:
        return self._worker

    def start(self) -> None:
        self._pending.every = True  # the first pass: every ready pod's host interface checked once
        self._worker.wake()
        self._worker.start()

    def stop(self) -> None:
        self._worker.stop()

    def lost(self, lost: LostInterfaces) -> None:
        """The kernel watch's report (on its thread): look at these interfaces' pods soon."""
        with self._lock:
            if not self._pending:
                self._first_loss = time.monotonic()
            self._pending.add(lost)
        self._worker.wake()

    def _next_wait(self) -> float | None:
        """Until the next retry is due, or a held-back log summary is to be written (None: no limit)."""
        with self._lock:
            due = min((d for _, d, _ in self.failing.values()), default=None)
        waits = [max(0.0, due - time.monotonic())] if due is not None else []
        if self.repair_log.flush():
            waits.append(1.0)
        return min(waits) if waits else None

    def _loop(self) -> None:
        try:
            while not self._worker.stopping:
                self._worker.sleep(self._next_wait())
                with self._lock:
                    pending, self._pending = self._pending, LostInterfaces()
                    first, self._first_loss = self._first_loss, None
                    now = time.monotonic()
                    retry = {p for p, (_, due, _) in self.failing.items() if due <= now}
                if self._worker.stopping:
                    return
                try:
                    self.run(pending.gone | pending.damaged, every=pending.every, retry=retry,
                             lost=pending, since=first)  # fmt: skip
                except NetpluginError as e:
                    log.error("pod repair: cannot read the pod records: %s", e.message)
        finally:
            # closed by the thread that reads it (a stop may give up waiting for a stuck pass)
            self.close_watch()

    def close_watch(self) -> None:
        """Close the records dir's watch (the next pass reads every record, and watches again)."""
        if self._watch is not None:
            self._watch.close()
            self._watch = None

    def run(
        self,
        names: set[str],
        *,
        every: bool = False,
        retry: set[str] | None = None,
        lost: LostInterfaces | None = None,
        since: float | None = None,
    ) -> None:
        """One pass: each ready pod with a host interface in ``names`` (``every``: all), and each pod
        in ``retry`` (its last repair failed), checked. ``lost`` and ``since`` are the losses that
        woke it and when they began (the loop guard's evidence)."""
        manager = self.manager()
        if manager.state is None:
            return
        self._read_records(manager.state.dir, manager.state.load)
        ready = self._ready  # pod key -> record: a pass costs what it looks at, not the node's pod count
        with self._lock:
            for table in (self.broken, self.failing, self.looping, self._streak):
                for pod in [p for p in table if p not in ready]:
                    del table[pod]  # torn down (or its record gone): no longer broken, failing or looping
            streaks = [ready[p] for p in self._streak]
        # only a pod with a streak can have caused a loss (its last repair put something back)
        self._loop_guard(streaks, lost, since)
        retry = retry or set()
        if every:
            candidates = list(ready.values())
        else:
            keys = {k for n in names for k in self._by_hif.get(n, ())} | (retry & ready.keys())
            candidates = [ready[k] for k in sorted(keys)]
        hit = [
            (rec, hifs)
            for rec in candidates
            if (hifs := _host_interfaces(rec)) and (every or names & set(hifs) or _key(rec) in retry)
            and _key(rec) not in self.looping
        ]
        if not hit:
            return
        # The first pod alone: what pods share (the bridge) is put back once, by its repair; then
        # the rest in parallel (actions on different pods may overlap), so a node's worth of ports
        # comes back in a few plugin calls' time rather than in one per pod.
        kinds = self._pod(manager, *hit[0])
        rest = hit[1:]
        if "bridge" in kinds and not every:
            # The bridge was made again: every port detached while it was gone must be checked, and
            # no later loss names a port that is already detached.
            rest = [(r, h) for r in list(ready.values()) if (h := _host_interfaces(r)) and _key(r) != _key(hit[0][0])
                    and _key(r) not in self.looping]  # fmt: skip
        if rest:
            with ThreadPoolExecutor(min(PARALLEL, len(rest)), thread_name_prefix="netplugin-repair") as pool:
                for got in pool.map(lambda h: self._pod(manager, *h), rest):
                    kinds |= got
        if kinds:
            self.on_incident()

    def _loop_guard(self, records: list[PodRecord], lost: LostInterfaces | None, since: float | None) -> None:
        """Count, per pod, the passes woken by a loss its own last repair caused (only its interfaces,
        nothing gone, soon after); past :data:`LOOP_ROUNDS` in a row its repair is cut off."""
        if lost is None or since is None:
            return
        for rec in records:
            pod = _key(rec)
            with self._lock:
                count, ended = self._streak.get(pod, (0, -SELF_WINDOW))
            caused = (not lost.gone and not lost.every and bool(lost.damaged)
                      and lost.damaged <= set(_host_interfaces(rec)) and since - ended <= SELF_WINDOW)  # fmt: skip
            with self._lock:
                if not caused:
                    self._streak.pop(pod, None)
                    continue
                self._streak[pod] = (count + 1, ended)
                if count + 1 < LOOP_ROUNDS or pod in self.looping:
                    continue
                members = ", ".join(m.plugin for m in rec.chain if m.ran)
                why = (f"its repair caused the loss it repairs {count + 1} times in a row (members: {members}): "
                       "cut off until it is set up again")  # fmt: skip
                self.looping[pod] = why
            log.error("pod %s: %s", pod, why)

    def _ready_records(self, records_dir: str, load: Callable[[str], PodRecord]) -> list[PodRecord]:
        """The ready pods' records (see :meth:`_read_records`)."""
        self._read_records(records_dir, load)
        return list(self._ready.values())

    def _read_records(self, records_dir: str, load: Callable[[str], PodRecord]) -> None:
        """Bring the kept records (and their indexes) up to date. Every teardown deletes a host veth (a
        loss), so on a full node a pass that listed, stat-ed or parsed every record would tax every
        teardown: the files are kept between passes, and only the names the directory watch says
        changed are read again (all of them when it cannot tell)."""
        if self._watch is None or self._watch.path != records_dir:
            self.close_watch()
            self._watch = DirWatch(records_dir)
        changed = self._watch.changed()
        if changed is None:
            self._scan(records_dir, load)
        else:
            for name in changed | self._unread:
                self._refresh(os.path.join(records_dir, name), load)

    def _scan(self, records_dir: str, load: Callable[[str], PodRecord]) -> None:
        """Every record file, read again where it changed since it was read."""
        self._unread = set()
        try:
            with os.scandir(records_dir) as it:
                paths = [e.path for e in it if _is_record(e.name)]
        except FileNotFoundError:
            paths = []
        known = self._records
        self._records, self._ready, self._by_hif = {}, {}, {}
        for path in paths:
            self._refresh(path, load, known.get(path))

    def _refresh(
        self, path: str, load: Callable[[str], PodRecord],
        known: tuple[tuple[int, int, int], PodRecord] | None = None,
    ) -> None:
        """Record file ``path`` into the kept ones: read again if it changed, forgotten if it is gone."""
        name = os.path.basename(path)
        self._unread.discard(name)
        if not _is_record(name):
            return
        known = known or self._records.get(path)
        try:
            st = os.lstat(path)
            sig = (st.st_ino, st.st_mtime_ns, st.st_size)
            entry = known if known is not None and known[0] == sig else (sig, load(path))
        except FileNotFoundError:
            self._forget(path)  # removed: torn down, forgotten or set aside
            return
        except StateError:
            # being rewritten, or unreadable: its own action owns it; looked at again next pass
            self._forget(path)
            self._unread.add(name)
            return
        self._forget(path)
        self._records[path] = entry
        rec = entry[1]
        if rec.state == READY:
            self._ready[_key(rec)] = rec
            for hif in _host_interfaces(rec):
                self._by_hif.setdefault(hif, set()).add(_key(rec))

    def _forget(self, path: str) -> None:
        """Drop the kept record of ``path`` and its index entries."""
        entry = self._records.pop(path, None)
        if entry is None or entry[1].state != READY:
            return
        key = _key(entry[1])
        if self._ready.get(key) is entry[1]:
            del self._ready[key]
        for hif in _host_interfaces(entry[1]):
            keys = self._by_hif.get(hif)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._by_hif[hif]

    def _pod(self, manager: Manager, rec: PodRecord, hifs: list[str]) -> set[str]:
        """Check and repair one pod; the kinds of what its repair put back."""
        pod = _key(rec)
        missing = [h for h in hifs if link_gone(h)]
        if missing:
            why = f"host interface {', '.join(missing)} is gone: the pod needs a new sandbox (a new setup)"
            with self._lock:
                known = self.broken.get(pod) == why
                self.broken[pod] = why
            if not known:
                log.error("pod %s is broken: %s", pod, why)
            return set()
        start = time.monotonic()
        with self._lock:
            self.calls += 1
        try:
            done = repair_pod(manager, rec.ref)
            errors = done.errors
        except NetpluginError as e:
            done, errors = None, [e.message]
        took = time.monotonic() - start
        kinds: set[str] = set()
        for member, line in done.changes if done is not None else []:
            kind = repair_kind(line)
            kinds.add(kind)
            with self._lock:
                self.repairs[kind] += 1
            self.repair_log.line(kind, "repair (%s) of pod %s in %.3fs by %s: %s", kind, pod, took, member, line)
        with self._lock:
            count = self._streak.get(pod, (0, 0.0))[0]
            self._streak[pod] = (count, time.monotonic()) if kinds else (0, -SELF_WINDOW)
        self._failed(pod, errors)
        if done is not None and done.unrepairable:
            log.info("pod %s: %s declare(s) no repair: not put back", pod, ", ".join(done.unrepairable))
        return kinds

    def _failed(self, pod: str, errors: list[str]) -> None:
        """Schedule the retry of a failed repair (and call the pod broken past BROKEN_AFTER), or clear it."""
        with self._lock:
            if not errors:
                if self.failing.pop(pod, None) is not None and self.broken.get(pod, "").startswith("its repair"):
                    del self.broken[pod]
                return
            self.failures += len(errors)
            count = self.failing.get(pod, (0, 0.0, ""))[0] + 1
            wait = min(RETRY_MIN * 2 ** (count - 1), RETRY_MAX)
            self.failing[pod] = (count, time.monotonic() + wait, errors[0])
            if count >= BROKEN_AFTER:
                self.broken[pod] = f"its repair keeps failing ({count} times in a row): {errors[0]}"
        for err in errors:
            msg = "repair of pod %s failed (try %d, again in %.1fs): %s"
            self.repair_log.line("failed", msg, pod, count, wait, err, level=logging.ERROR)
