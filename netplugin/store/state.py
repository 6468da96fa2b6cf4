"""Durable pod records: what netplugin set up, written so that a crash loses nothing.

In detail: ``ARCHITECTURE.md``, "Module notes".

One human-readable JSON file per pod sandbox, ``<state_dir>/pods/<namespace>_<name>_<infra-id>.json``
(long keys are shortened with a hash; ``~`` marks those, and never occurs in a plain key). The
infra id is part of the key, so a pod re-created with a new sandbox gets a new record and the old
sandbox's record stays until its own teardown (or ``netplugin gc``) removes it.
"""

from __future__ import annotations

# Imports inside this module's functions are kept for the per-call import set
# (tests/frontends/fastpath.py): each keeps a module off the calls that do not need it
# (BENCHMARKS.md rows B-i and B: the CLI's cold start and per-pod run without a daemon).
import contextlib
import errno
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from netplugin.core.defaults import DEFAULT_KILL_GRACE
from netplugin.core.dirs import ensure_dir
from netplugin.core.errors import StateError
from netplugin.core.fileio import TMP_INFIX, FileRefused, atomic_write, read_bounded
from netplugin.core.names import PodRef
from netplugin.core.plaindata import dataclass, field, replace
from netplugin.core.procs import proc_start
from netplugin.core.spares import SPARE_DIR, discard, spares_for
from netplugin.store.records import (
    MAX_RECORD,
    READY,
    RECORD_SUFFIX,
    SETTING_UP,
    TEARING_DOWN,
    MemberState,
    Owner,
    PodRecord,
    now_iso,
    parse_record,
    record_filename,
)

__all__ = ["CorruptFile", "Scan", "StateStore"]


def _log() -> Any:
    """The store's logger, imported when a record needs repair: importing logging would slow every CLI call."""
    import logging

    return logging.getLogger("netplugin.state")


_TMP_MARK = RECORD_SUFFIX + TMP_INFIX  # the temp files of atomic_write


# --- parsing -------------------------------------------------------------------------------------


def _read(path: str) -> bytes:
    """The bytes of a record file; FileNotFoundError when absent, StateError when it is not a file."""
    try:
        return read_bounded(path, MAX_RECORD)  # parse_record says "larger than" past the limit
    except FileNotFoundError:
        raise
    except FileRefused as e:
        raise StateError(path, e.reason) from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise StateError(path, "is a symbolic link, not a pod record") from None
        raise StateError(path, f"cannot read: {e.strerror or e}") from e


# --- the store -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CorruptFile:
    """A file in the records dir that is not a valid record, and why."""

    path: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"path": self.path, "reason": self.reason}


@dataclass
class Scan:
    """Everything found in the records dir."""

    records: list[PodRecord] = field(default_factory=list)
    corrupt: list[CorruptFile] = field(default_factory=list)
    #: temp files of atomic writes whose writer is dead
    stale_temps: list[str] = field(default_factory=list)


def _temp_writer_pid(name: str) -> int | None:
    rest = name.rsplit(_TMP_MARK, 1)[-1]
    pid = rest.split(".", 1)[0]
    return int(pid) if pid.isdigit() else None


def _starts_a_member(before: tuple[MemberState, ...], after: tuple[MemberState, ...]) -> bool:
    """Whether ``after`` marks a member ``setting-up`` that ``before`` did not: an intent."""
    was = {m.plugin for m in before if m.state == SETTING_UP}
    return any(m.state == SETTING_UP and m.plugin not in was for m in after)


class StateStore:
    """Pod records under ``<state_dir>/pods``. Thread-safe; callers hold the pod's lock for writes."""

    def __init__(
        self,
        state_dir: str,
        *,
        record_status: bool = False,
        timeout_for: Callable[[str], float] | None = None,
        kill_grace: float = DEFAULT_KILL_GRACE,
        durable: bool = True,
    ) -> None:
        self.state_dir = state_dir
        self.dir = os.path.join(state_dir, "pods")
        self.corrupt_dir = os.path.join(self.dir, "corrupt")
        #: run the plugin's status right after setup to record the IP (one more exec on the pod-start
        #: path); off by default: the IP is recorded when status is first asked (the kubelet asks
        #: right after setup), see :meth:`observe_ip`
        self.record_status = record_status
        self.durable = durable
        self._timeout_for = timeout_for or (lambda action: 30.0)
        self._kill_grace = kill_grace
        self._pending: dict[str, PodRecord] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, config: Any) -> StateStore:
        """The store a Config asks for (``record_status`` is read when the config has it)."""
        return cls(
            config.state_dir,
            record_status=config.record_status,
            timeout_for=config.timeout_for,
            kill_grace=config.kill_grace,
        )

    def path_for(self, ref: PodRef) -> str:
        return os.path.join(self.dir, record_filename(ref))

    def _checked_dir(self, *, create: bool) -> bool:
        """Whether ``pods/`` exists, after making sure it (and the state dir) may be trusted.

        Raises :class:`~netplugin.core.dirs.UnsafeDirectory` (never a symlinked ``pods/``, never
        a directory another user could write) rather than read or write records there.
        """
        return ensure_dir(self.dir, base=self.state_dir, mode=0o755, create=create) is not None

    def stock(self) -> int:
        """Make the records' spare inodes ahead of need (:meth:`netplugin.core.spares.Spares.fill`)."""
        self._checked_dir(create=True)
        return spares_for(self.dir, self.state_dir).fill()

    # --- reading --------------------------------------------------------------------------------

    def load(self, path: str) -> PodRecord:
        """Parse the record at ``path``; StateError if it is corrupt, FileNotFoundError if absent."""
        return parse_record(_read(path), path)

    def get(self, ref: PodRef) -> PodRecord | None:
        """The pod's record, None when there is none. Raises StateError when it is corrupt."""
        if not self._checked_dir(create=False):
            return None
        try:
            return self.load(self.path_for(ref))
        except FileNotFoundError:
            return None

    def scan(self) -> Scan:
        """Every record, corrupt file and stale temp file; a missing dir is empty. Sorted by file name."""
        out = Scan()
        if not self._checked_dir(create=False):
            return out
        try:
            with os.scandir(self.dir) as it:
                entries = sorted(it, key=lambda e: e.name)
        except FileNotFoundError:
            return out
        except OSError as e:
            raise StateError(self.dir, f"cannot list: {e.strerror or e}") from e
        for entry in entries:
            if entry.name in ("corrupt", SPARE_DIR) and entry.is_dir(follow_symlinks=False):
                continue
            if _TMP_MARK in entry.name:
                pid = _temp_writer_pid(entry.name)
                if pid is None or proc_start(pid) is None:
                    out.stale_temps.append(entry.path)
                continue
            if not entry.name.endswith(RECORD_SUFFIX):
                out.corrupt.append(CorruptFile(entry.path, "not a pod record (name does not end in .json)"))
                continue
            try:
                out.records.append(self._load_twice(entry.path))
            except FileNotFoundError:
                continue  # removed while we listed
            except StateError as e:
                out.corrupt.append(CorruptFile(entry.path, e.reason))
        return out

    def _load_twice(self, path: str) -> PodRecord:
        """:meth:`load`, read once more before a record counts as corrupt: without the pod's lock, a
        file opened just before its record was removed may be a spare rewritten meanwhile."""
        try:
            return self.load(path)
        except StateError:
            return self.load(path)

    # --- repair -----------------------------------------------------------------------------------

    def set_aside(self, path: str, reason: str) -> str:
        """Move a corrupt file to ``pods/corrupt/`` (with ``<name>.reason``); returns its new path."""
        ensure_dir(self.corrupt_dir, base=self.state_dir, mode=0o755)
        import datetime  # only when a corrupt file is set aside

        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        base = os.path.join(self.corrupt_dir, f"{os.path.basename(path)}.{stamp}")
        dest = base
        n = 0
        while os.path.lexists(dest):
            n += 1
            dest = f"{base}.{n}"
        try:
            os.rename(path, dest)
        except FileNotFoundError:
            return ""  # someone else moved or removed it
        except OSError as e:
            raise StateError(path, f"cannot move aside to {dest}: {e.strerror or e}") from e
        note = f"{path}: {reason}\nset aside at {now_iso()} by pid {os.getpid()}\n"
        atomic_write(dest + ".reason", note.encode(), mode=0o644, durable=self.durable)
        self._sync_dir(self.dir)
        _log().info("corrupt pod record %s set aside as %s: %s", path, dest, reason)
        return dest

    def remove_temp(self, path: str) -> bool:
        try:
            os.unlink(path)
        except FileNotFoundError:
            return False
        except OSError as e:
            raise StateError(path, f"cannot remove: {e.strerror or e}") from e
        return True

    # --- the Manager's hooks (called with the pod's lock held) --------------------------------------

    def _existing(self, ref: PodRef) -> PodRecord | None:
        """The current record; a corrupt one is set aside (and counts as none)."""
        try:
            return self.get(ref)
        except StateError as e:
            if os.path.lexists(e.path):
                dest = self.set_aside(e.path, e.reason)
                _log().warning("corrupt pod record %s: %s (set aside as %s)", e.path, e.reason, dest)
            return None

    def _write(self, rec: PodRecord, *, intent: bool = False, durable_with: Sequence[str] = ()) -> PodRecord:
        """Write the record atomically; an ``intent`` is also made durable, with ``durable_with``,
        through the group commit (see "Durability" above)."""
        self._checked_dir(create=True)
        path = self.path_for(rec.ref)
        try:
            spares_for(self.dir, self.state_dir).replace(path, rec.encode(), mode=0o644)
        except Exception as e:
            reason = getattr(e, "reason", None) or str(e)
            raise StateError(path, f"cannot write: {reason}") from e
        if intent and self.durable:
            from netplugin.store.commit import make_durable

            make_durable([path, *durable_with])
        return replace(rec, path=path)

    def _settle_orphans(self, rec: PodRecord | None) -> list[int]:
        """Let plugin processes of a dead owner finish (or stop them at their deadline)."""
        if rec is None or rec.settled or rec.owner.alive():
            return []
        from netplugin.store.orphans import plugin_processes, settle

        procs = plugin_processes(self.state_dir, pod=rec.ref)
        return settle(procs, timeout_for=self._timeout_for, kill_grace=self._kill_grace) if procs else []

    def begin(
        self,
        pod: PodRef,
        plugin_name: str,
        version: str,
        netns: str,
        *,
        pod_obj: Mapping[str, Any] | None = None,
        members: tuple[MemberState, ...] = (),
        durable_with: Sequence[str] = (),
    ) -> None:
        """Record the intent to set ``pod`` up, before the plugin (the chain's first member) runs.

        The action's first durable write, and a chain of one's only one (see "Durability" above).
        ``durable_with``: files the caller wrote for this action (not yet synced) that become
        durable in the same group commit.
        """
        existing = self._existing(pod)
        self._settle_orphans(existing)
        now = now_iso()
        uid = None
        meta = pod_obj.get("metadata") if pod_obj is not None else None
        if isinstance(meta, Mapping) and isinstance(meta.get("uid"), str) and meta["uid"]:
            uid = meta["uid"]
        rec = PodRecord(
            ref=pod,
            plugin=plugin_name,
            plugin_version=version,
            netns=netns,
            netns_existed=bool(netns) and os.path.exists(netns),
            host_known=pod_obj is not None,
            state=SETTING_UP,
            ip=existing.ip if existing is not None else None,
            uid=uid,
            created=existing.created if existing is not None else now,
            updated=now,
            ready_at=None,
            owner=Owner.me(),
            members=members,
        )
        rec = self._write(rec, intent=True, durable_with=durable_with)
        with self._lock:
            self._pending[record_filename(pod)] = rec

    def _current(self, pod: PodRef, *, pop: bool) -> PodRecord:
        """The record of a setup in progress (kept since ``begin``; read again when not)."""
        key = record_filename(pod)
        with self._lock:
            rec = self._pending.pop(key, None) if pop else self._pending.get(key)
        if rec is None:
            rec = self.get(pod)
            if rec is None:
                raise StateError(self.path_for(pod), "the setup record disappeared before setup completed")
        return rec

    def progress(self, pod: PodRef, members: tuple[MemberState, ...]) -> None:
        """Record how far each chain member got (before the next one runs), keeping the pod's state.

        Durable (group commit) when it marks a member ``setting-up``: an intent (see "Durability").
        """
        key = record_filename(pod)
        with self._lock:
            rec = self._pending.get(key)
        if rec is None:
            rec = self.get(pod)
            if rec is None:
                return  # a teardown of a pod without a record: nothing to keep track of
        starts = _starts_a_member(rec.members, members)
        rec = self._write(replace(rec, members=members, updated=now_iso(), owner=Owner.me()), intent=starts)
        with self._lock:
            if key in self._pending:
                self._pending[key] = rec

    def complete(self, pod: PodRef, ip: str | None, *, members: tuple[MemberState, ...] | None = None) -> None:
        """Record that setup succeeded (with the pod's IP when known, and the members' final progress)."""
        rec = self._current(pod, pop=True)
        now = now_iso()
        done = rec.members if members is None else members
        self._write(replace(rec, state=READY, ip=ip, updated=now, ready_at=now, owner=Owner.me(), members=done))

    def mark_rollback_failed(self, pod: PodRef, reason: str) -> None:
        """Record that a failed setup's rollback failed too (the pod keeps its state for gc)."""
        existing = self._existing(pod)
        if existing is not None:
            self._write(replace(existing, rollback_error=reason[:2000], updated=now_iso(), owner=Owner.me()))

    def mark_teardown(self, pod: PodRef) -> list[int]:
        """Record that teardown is starting. No record: nothing to mark. Returns orphans it waited for."""
        return self._mark_teardown(pod)[0]

    def begin_teardown(self, pod: PodRef) -> PodRecord | None:
        """Record that teardown is starting; the record as written (None: the pod has none)."""
        return self._mark_teardown(pod)[1]

    def _mark_teardown(self, pod: PodRef) -> tuple[list[int], PodRecord | None]:
        existing = self._existing(pod)
        if existing is None:
            return [], None
        orphans = self._settle_orphans(existing)
        rec = self._write(replace(existing, state=TEARING_DOWN, updated=now_iso(), owner=Owner.me()))
        return orphans, rec

    def observe_ip(self, pod: PodRef, ip: str) -> None:
        """Record the IP a ``status`` reported, if the ready record lacks it or has another.

        Costs a read per status call and a write only when the IP changes; a failure to write is
        logged, never raised (status is a read for its caller).
        """
        try:
            rec = self.get(pod)
            if rec is not None and rec.state == READY and rec.ip != ip:
                self._write(replace(rec, ip=ip, updated=now_iso()))
        except StateError as e:
            _log().warning("cannot record the IP of %s: %s", pod, e.message)

    def remove(self, pod: PodRef) -> None:
        """Forget the pod (after its teardown or rollback succeeded)."""
        with self._lock:
            self._pending.pop(record_filename(pod), None)
        path = self.path_for(pod)
        if not self._checked_dir(create=False):
            return
        try:
            discard(path, spares_for(self.dir, self.state_dir))
        except OSError as e:
            raise StateError(path, f"cannot remove: {e.strerror or e}") from e

    def _sync_dir(self, path: str) -> None:
        if not self.durable:
            return
        with contextlib.suppress(OSError):
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
