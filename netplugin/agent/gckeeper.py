"""GC that nobody has to run: the daemon runs ``gc`` itself (:func:`netplugin.manager.gc.run_gc`).

* **At start**, before the daemon says it is ready: the records of pods lost in a reboot (their
  network namespaces are gone) are torn down and their addresses freed before the first ADD.
* **Every** ``gc_interval`` seconds (default 300; 0 turns the periodic run off), on a thread of
  its own that sleeps in between: no pass touches anything unless its time has come.
* **When a Pod of this node is deleted** (``host: kube``; the watch says so) and its record is
  still there once the teardown the runtime should send has had its time (the teardown limit
  plus the kill grace): one run then, for every pod deleted meanwhile.

Each run keeps gc's rules: a live pod (its namespace there, its Pod known) is never touched, a
pod whose action is in progress is waited for under its lock and judged again after it. Each run
is logged with what it freed and counted: ``netplugin_gc_runs_total{trigger,outcome}`` and
``netplugin_gc_freed_total{kind}`` (kind: ``teardown``, ``set-aside``, ``settle``, ``remove-temp``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from netplugin.agent.worker import Worker
from netplugin.core.defaults import DEFAULT_GC_INTERVAL
from netplugin.core.errors import NetpluginError
from netplugin.manager.gc import FREEING_KINDS, GcKind, run_gc

if TYPE_CHECKING:
    from netplugin.manager.gc import GcReport
    from netplugin.manager.manager import Manager

__all__ = ["FREED_KINDS", "GcCounts", "GcKeeper"]

log = logging.getLogger("netplugin.gc")

#: what a gc run frees, by its action kind (the ``kind`` label), in the kinds' order
FREED_KINDS = tuple(kind for kind in GcKind if kind in FREEING_KINDS)


@dataclass(frozen=True)
class GcCounts:
    """What the runs so far did, read at each scrape of the daemon's metrics."""

    #: runs by (trigger, outcome), in the order each pair first happened
    runs: dict[tuple[str, str], int]
    #: what they freed, by action kind (every kind of :data:`FREED_KINDS`, zero or more)
    freed: dict[GcKind, int]


class GcKeeper:
    """Runs gc at start, periodically and after pod deletions; one run at a time."""

    def __init__(self, manager: Callable[[], Manager]) -> None:
        self._manager = manager  #: the daemon's manager now (a reload may swap it)
        self._lock = threading.Lock()  # one run at a time, whatever started it
        self._lock_due = threading.Lock()
        # a run past its interval (the default one when periodic runs are off) counts as stuck
        self._worker = Worker(
            "netplugin-gc", self._loop, lambda: self._manager().config.gc_interval or DEFAULT_GC_INTERVAL
        )
        #: when each deleted pod's run is due (monotonic); one run serves every pod due by then
        self._due_deleted: list[float] = []
        self.last: dict[str, object] | None = None  #: the last run, for health
        self._count_lock = threading.Lock()  # not the run's lock: a scrape never waits for a run
        self._runs: Counter[tuple[str, str]] = Counter()
        self._freed: Counter[GcKind] = Counter(dict.fromkeys(FREED_KINDS, 0))

    def counts(self) -> GcCounts:
        """The runs and what they freed so far (a copy)."""
        with self._count_lock:
            return GcCounts(dict(self._runs), dict(self._freed))

    def _count(self, trigger: str, outcome: str, freed: list[GcKind]) -> None:
        with self._count_lock:
            self._runs[trigger, outcome] += 1
            self._freed.update(freed)

    def run(self, trigger: str) -> GcReport | None:
        """One gc run now (on the caller's thread); None when it could not run at all."""
        with self._lock:
            start = time.monotonic()
            try:
                report = run_gc(self._manager())
            except NetpluginError as e:
                log.error("gc (%s) could not run: %s", trigger, e.message)
                self._count(trigger, "failed", [])
                return None
            done = [a for a in report.actions if a.outcome == "done"]
            outcome = "failed" if report.failed else "ok"
            self._count(trigger, outcome, [a.kind for a in done if a.kind in FREEING_KINDS])
            self.last = {"trigger": trigger, "time": time.time(), "freed": len(done), "failed": len(report.failed)}
            took = time.monotonic() - start
            if done or report.failed:
                lines = "; ".join(a.describe() for a in [*done, *report.failed])
                freed, failed = len(done), len(report.failed)
                log.info("gc (%s): freed %d, %d failed in %.2fs: %s", trigger, freed, failed, took, lines)
            else:
                log.info("gc (%s): nothing to free (%d record(s) checked)", trigger, report.checked)
            return report

    def pod_deleted(self, namespace: str, name: str) -> None:
        """A Pod of this node was deleted (called on a watch thread): a run after the grace period."""
        cfg = self._manager().config
        due = time.monotonic() + cfg.timeout_for("teardown") + cfg.kill_grace
        log.debug("pod %s/%s deleted: gc after %.0fs unless its teardown came", namespace, name, due - time.monotonic())
        with self._lock_due:
            self._due_deleted.append(due)
        self._worker.wake()

    def kick(self) -> None:
        """Look at the settings again (a reload may have changed ``gc_interval``)."""
        self._worker.wake()

    @property
    def worker(self) -> Worker:
        return self._worker

    def start(self) -> None:
        """The run at start (pods lost in a reboot give their addresses back before the daemon takes
        its first ADD), then the thread of the later runs."""
        self.run("start")
        self._worker.start()

    def stop(self) -> None:
        self._worker.stop()

    def _loop(self) -> None:
        last = time.monotonic()
        while not self._worker.stopping:
            interval = self._manager().config.gc_interval
            now = time.monotonic()
            with self._lock_due:
                waits = [min(self._due_deleted) - now] if self._due_deleted else []
            if interval > 0:
                waits.append(last + interval - now)
            if not waits or min(waits) > 0:
                self._worker.sleep(min(waits) if waits else None)
                continue
            with self._lock_due:
                deleted = bool(self._due_deleted) and min(self._due_deleted) <= now
                self._due_deleted = [d for d in self._due_deleted if d > now]
            if deleted:
                self.run("pod-deleted")
            else:
                self.run("periodic")
            last = time.monotonic()
