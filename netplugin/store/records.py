"""Pod records: the on-disk schema of one pod sandbox's record, and its owner.

The record format (version 1) and file naming are described in :mod:`netplugin.store.state`,
which reads and writes them; this module only encodes, decodes and validates.
"""

from __future__ import annotations

# Imports inside this module's functions are kept for the per-call import set
# (tests/frontends/fastpath.py): each keeps a module off the calls that do not need it
# (BENCHMARKS.md rows B-i and B: the CLI's cold start and per-pod run without a daemon).
import ipaddress
import json
import os
import time
from collections.abc import Mapping
from typing import Any

from netplugin.core.errors import InvalidArgument, StateError
from netplugin.core.names import PodRef
from netplugin.core.plaindata import dataclass, field
from netplugin.core.procs import boot_id, proc_start

__all__ = [
    "KIND",
    "MAX_RECORD",
    "MEMBER_PENDING",
    "MEMBER_SKIPPED",
    "MEMBER_STATES",
    "MEMBER_TORN_DOWN",
    "READY",
    "RECORD_SUFFIX",
    "SCHEMA_VERSION",
    "SETTING_UP",
    "STATES",
    "TEARING_DOWN",
    "MemberState",
    "Owner",
    "PodRecord",
    "now_iso",
    "parse_record",
    "record_filename",
]


SCHEMA_VERSION = 1


KIND = "NetpluginPodRecord"


SETTING_UP = "setting-up"


READY = "ready"


TEARING_DOWN = "tearing-down"


STATES = (SETTING_UP, READY, TEARING_DOWN)


# A chain member's own progress. ``pending``: its setup never started; ``skipped``: its action mask
# leaves setup out; ``setting-up``/``ready``/``tearing-down`` as for the pod; ``torn-down``: its
# teardown (or rollback) succeeded. The members that "ran" are the ones neither pending, skipped
# nor torn down: exactly those gc tears down.
MEMBER_PENDING = "pending"
MEMBER_SKIPPED = "skipped"
MEMBER_TORN_DOWN = "torn-down"
MEMBER_STATES = (MEMBER_PENDING, MEMBER_SKIPPED, SETTING_UP, READY, TEARING_DOWN, MEMBER_TORN_DOWN)


RECORD_SUFFIX = ".json"


# Keys longer than this are shortened: a file name may hold 255 bytes, and the temp file of an
# atomic write adds ".tmp.<pid>.<thread-id>" (up to about 35 bytes) to it.
_MAX_KEY = 200


_HASHED_PREFIX = 160


# A record is well under 2 KiB; a bigger file is not one of ours (and must not cost memory).
MAX_RECORD = 1 << 16


def record_filename(ref: PodRef) -> str:
    """The file name of a pod's record (unique per namespace, name and infra id)."""
    key = f"{ref.namespace}_{ref.name}_{ref.infra_id}"
    if len(key) > _MAX_KEY:
        import hashlib  # only for names too long to be the file name (its import would cost every process)

        digest = hashlib.sha256(f"{ref.namespace}\0{ref.name}\0{ref.infra_id}".encode()).hexdigest()[:24]
        key = f"{key[:_HASHED_PREFIX]}~{digest}"
    return key + RECORD_SUFFIX


def now_iso() -> str:
    """Now in UTC, ISO 8601 to the millisecond (``datetime``'s isoformat, without importing it on every call path)."""
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}Z"


@dataclass(frozen=True, slots=True)
class Owner:
    """The process that last acted on a pod: (pid, start time, boot id) identifies it uniquely."""

    pid: int
    start: int
    boot_id: str

    @classmethod
    def me(cls) -> Owner:
        return _self_owner()

    def alive(self) -> bool:
        return self.boot_id == _self_owner().boot_id and proc_start(self.pid) == self.start

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "start": self.start, "boot_id": self.boot_id}


_SELF: tuple[int, Owner] | None = None


def _self_owner() -> Owner:
    global _SELF
    pid = os.getpid()
    if _SELF is None or _SELF[0] != pid:  # recomputed after a fork
        _SELF = (pid, Owner(pid, proc_start(pid) or 0, boot_id()))
    return _SELF[1]


@dataclass(frozen=True, slots=True)
class MemberState:
    """One chain member in a pod record: who it is, how far it got, what its setup reported."""

    plugin: str
    version: str
    state: str = MEMBER_PENDING
    ips: tuple[str, ...] = ()
    host_interface: str | None = None

    @property
    def ran(self) -> bool:
        """Whether this member may hold resources of the pod (its teardown is still owed)."""
        return self.state not in (MEMBER_PENDING, MEMBER_SKIPPED, MEMBER_TORN_DOWN)

    def to_dict(self) -> dict[str, Any]:
        return {
            "plugin": self.plugin,
            "version": self.version,
            "state": self.state,
            "ips": list(self.ips),
            "host_interface": self.host_interface,
        }


def _member(doc: Any, i: int) -> MemberState:
    if not isinstance(doc, dict):
        raise ValueError(f"chain member {i + 1} must be an object")
    try:
        state = _field(doc, "state", str)
        if state not in MEMBER_STATES:
            raise ValueError(f"field 'state' must be one of {', '.join(MEMBER_STATES)}, got {state!r:.80}")
        ips = _field(doc, "ips", list)
        for ip in ips:
            if not isinstance(ip, str):
                raise ValueError(f"field 'ips' holds a non-address {ip!r:.80}")
            try:
                ipaddress.ip_address(ip)
            except ValueError:
                raise ValueError(f"field 'ips' holds a non-address {ip!r:.80}") from None
        return MemberState(
            _field(doc, "plugin", str),
            _field(doc, "version", str),
            state,
            tuple(ips),
            _field(doc, "host_interface", str, optional=True),
        )
    except ValueError as e:
        raise ValueError(f"chain member {i + 1}: {e}") from None


@dataclass(frozen=True)
class PodRecord:
    """One pod sandbox netplugin acted on, as stored on disk."""

    ref: PodRef
    plugin: str
    plugin_version: str
    netns: str
    #: whether the netns existed when setup began; only then does its absence prove the pod gone
    netns_existed: bool
    #: whether the host knew the pod when setup began; only then does "unknown now" mean "deleted"
    host_known: bool
    state: str
    ip: str | None
    uid: str | None
    created: str
    updated: str
    ready_at: str | None
    owner: Owner
    path: str = field(default="", compare=False)
    #: the chain that set the pod up, each member with its progress; a record written before
    #: chains has none, and means the chain of one ``plugin`` that ran (see :attr:`chain`)
    members: tuple[MemberState, ...] = ()
    #: why the rollback of a failed setup failed too (the record then owes its teardown to gc)
    rollback_error: str | None = None

    @property
    def chain(self) -> tuple[MemberState, ...]:
        """The members, also for a record written before chains (its one plugin, which ran)."""
        if self.members:
            return self.members
        state = READY if self.state == READY else SETTING_UP
        return (MemberState(self.plugin, self.plugin_version, state, (self.ip,) if self.ip else ()),)

    @property
    def settled(self) -> bool:
        """True when the last action finished (the record is ``ready``)."""
        return self.state == READY

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": SCHEMA_VERSION,
            "kind": KIND,
            "namespace": self.ref.namespace,
            "name": self.ref.name,
            "infra_id": self.ref.infra_id,
            "uid": self.uid,
            "plugin": self.plugin,
            "plugin_version": self.plugin_version,
            "netns": self.netns,
            "netns_existed": self.netns_existed,
            "host_known": self.host_known,
            "state": self.state,
            "ip": self.ip,
            "created": self.created,
            "updated": self.updated,
            "ready_at": self.ready_at,
            "owner": self.owner.to_dict(),
            "chain": [m.to_dict() for m in self.members],
        } | ({"rollback_error": self.rollback_error} if self.rollback_error is not None else {})

    def encode(self) -> bytes:
        return (json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n").encode()


def _field(doc: Mapping[str, Any], key: str, kind: type | tuple[type, ...], *, optional: bool = False) -> Any:
    if key not in doc:
        if optional:
            return None
        raise ValueError(f"missing field {key!r}")
    value = doc[key]
    if value is None and optional:
        return None
    # bool is an int in Python; a JSON true is never a valid pid or start time
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise ValueError(f"field {key!r} must be {names}{' or null' if optional else ''}, got {value!r:.80}")
    return value


def _time(doc: Mapping[str, Any], key: str, *, optional: bool = False) -> str | None:
    value: str | None = _field(doc, key, str, optional=optional)
    if value is not None:
        import datetime  # reading a record's times only (writing one needs only time.strftime)

        try:
            datetime.datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"field {key!r} is not an ISO 8601 time: {value!r:.80}") from None
    return value


def _from_doc(doc: Any, path: str) -> PodRecord:
    if not isinstance(doc, dict):
        raise ValueError(f"must be a JSON object, got {type(doc).__name__}")
    version = doc.get("version")
    if version != SCHEMA_VERSION or isinstance(version, bool):
        raise ValueError(f"unknown version {version!r:.40} (this netplugin reads version {SCHEMA_VERSION})")
    if doc.get("kind") != KIND:
        raise ValueError(f"kind must be {KIND!r}, got {doc.get('kind')!r:.80}")
    try:
        ref = PodRef(_field(doc, "namespace", str), _field(doc, "name", str), _field(doc, "infra_id", str))
    except InvalidArgument as e:
        raise ValueError(e.message) from None
    state = _field(doc, "state", str)
    if state not in STATES:
        raise ValueError(f"field 'state' must be one of {', '.join(STATES)}, got {state!r:.80}")
    ip = _field(doc, "ip", str, optional=True)
    if ip is not None:
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            raise ValueError(f"field 'ip' is not an IP address: {ip!r:.80}") from None
    owner_doc = _field(doc, "owner", dict)
    try:
        owner = Owner(_field(owner_doc, "pid", int), _field(owner_doc, "start", int), _field(owner_doc, "boot_id", str))
    except ValueError as e:
        raise ValueError(f"owner: {e}") from None
    created = _time(doc, "created")
    updated = _time(doc, "updated")
    assert created is not None and updated is not None
    rec = PodRecord(
        ref=ref,
        plugin=_field(doc, "plugin", str),
        plugin_version=_field(doc, "plugin_version", str),
        netns=_field(doc, "netns", str),
        netns_existed=_field(doc, "netns_existed", bool),
        host_known=_field(doc, "host_known", bool),
        state=state,
        ip=ip,
        uid=_field(doc, "uid", str, optional=True),
        created=created,
        updated=updated,
        ready_at=_time(doc, "ready_at", optional=True),
        owner=owner,
        path=path,
        members=tuple(_member(m, i) for i, m in enumerate(_field(doc, "chain", list, optional=True) or ())),
        rollback_error=_field(doc, "rollback_error", str, optional=True),
    )
    if path and os.path.basename(path) != record_filename(ref):
        # A renamed or copied file would alias another pod's record.
        raise ValueError(f"file name does not match its content (expected {record_filename(ref)})")
    return rec


def parse_record(data: bytes, path: str = "") -> PodRecord:
    """Parse one record file's bytes. Raises :class:`StateError` naming ``path`` and the problem."""
    where = path or "(record)"
    # Size first: a bounded read stops one byte past the limit, which may be all blanks.
    if len(data) > MAX_RECORD:
        raise StateError(where, f"larger than {MAX_RECORD} bytes: not a pod record")
    if not data.strip():
        raise StateError(where, "empty file (a write was interrupted before it reached the disk?)")
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise StateError(where, f"not valid JSON: {str(e)[:200]}") from None
    try:
        return _from_doc(doc, path)
    except ValueError as e:
        raise StateError(where, str(e)) from None
