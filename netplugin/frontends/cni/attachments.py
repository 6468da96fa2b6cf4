"""The attachment index: which (container, interface) each CNI network was asked to set up.

The state dir's pod records do not say which CNI network, if any, made a pod, and the CLI and
daemon may share the state dir: GC must only touch its own network's pods. So ADD records the
attachment in ``<stateDir>/cni/<network>/<containerID>:<ifname>.json`` before the setup runs (an
ADD that never returns is still found), and a successful DEL removes it. ':' occurs in neither a
container id nor an interface name, so the file names are unambiguous.

**One attachment per container and state dir.** netplugin's plugins, and the pod records, key a
pod's resources by its infra (container) id alone: both bridge plugins name the host veth and
the IPAM entry after it. A second attachment of the same container (another ``CNI_IFNAME``, or
another network) would silently delete the first one's veth and move its address; the same
container added again under another pod name would leave the first pod's record behind. So
:func:`claim_attachment` refuses both, with CNI error 4 naming the variable, and leaves the
first attachment alone; the DEL a runtime sends after that failed ADD is a no-op (there is
nothing of that attachment to remove, and the other one is not its to touch). Checking and
recording happen under one flock (``<stateDir>/cni/.lock``), so concurrent ADDs cannot both win.
Real multi-attachment needs both bridge plugins to key veth names and IPAM by infra id and
interface name.
"""

from __future__ import annotations

# Imports inside this module's functions are kept for the per-call import set
# (tests/frontends/fastpath.py): each keeps a module off the calls that do not need it
# (BENCHMARKS.md rows B-i and B: the CLI's cold start and per-pod run without a daemon).
import json
import os
from collections.abc import Mapping
from typing import Any

from netplugin.core._yaml import DocumentError, load_json, short_repr
from netplugin.core.config import Config
from netplugin.core.dirs import ensure_dir
from netplugin.core.errors import NetpluginError, SystemFailure
from netplugin.core.fileio import read_small, stale_temps
from netplugin.core.names import PodRef
from netplugin.core.netns import netns_identity, netns_problem
from netplugin.core.plaindata import dataclass
from netplugin.core.spares import discard, spares_for
from netplugin.frontends.cni.spec import CniError
from netplugin.frontends.wire.codes import CNI_INVALID_CONFIG, CNI_INVALID_ENV
from netplugin.store.locks import flocked

__all__ = [
    "Attachment",
    "attached_elsewhere",
    "attachment_dir",
    "attachment_path",
    "attachments_of",
    "claim_attachment",
    "forget_attachment",
    "list_attachments",
    "prune_netns_index",
    "record_attachment",
    "recorded_attachment",
    "refuse_foreign_netns",
    "remove_stale_temps",
    "stock_attachments",
    "valid_attachments",
]


def valid_attachments(conf: Mapping[str, Any]) -> set[tuple[str, str]]:
    """(containerID, ifname) of ``cni.dev/valid-attachments`` (or the legacy ``cni.dev/attachments``).

    An entry without ifname is ``(containerID, "")``: it keeps every attachment of that container.
    """
    raw = conf.get("cni.dev/valid-attachments")
    if raw is None:
        raw = conf.get("cni.dev/attachments")
    if raw is None:
        raise CniError(CNI_INVALID_CONFIG, "GC needs cni.dev/valid-attachments in the network config")
    if not isinstance(raw, list):
        raise CniError(CNI_INVALID_CONFIG, "cni.dev/valid-attachments must be a list")
    out: set[tuple[str, str]] = set()
    for entry in raw:
        if not isinstance(entry, dict) or not isinstance(entry.get("containerID"), str):
            from netplugin.core._yaml import short_repr

            raise CniError(
                CNI_INVALID_CONFIG, f"cni.dev/valid-attachments: bad entry {short_repr(entry)} (needs containerID)"
            )
        ifname = entry.get("ifname")
        out.add((entry["containerID"], ifname if isinstance(ifname, str) else ""))
    return out


@dataclass(frozen=True)
class Attachment:
    """One (container, interface) this network was asked to set up."""

    container_id: str
    ifname: str
    netns: str
    namespace: str
    name: str

    @property
    def pod(self) -> PodRef:
        return PodRef(self.namespace, self.name, self.container_id)

    def to_dict(self) -> dict[str, str]:
        return {
            "containerID": self.container_id,
            "ifname": self.ifname,
            "netns": self.netns,
            "namespace": self.namespace,
            "name": self.name,
        }


def attachment_dir(state_dir: str, network: str) -> str:
    return os.path.join(state_dir, "cni", network)


def attachment_path(state_dir: str, network: str, container_id: str, ifname: str) -> str:
    return os.path.join(attachment_dir(state_dir, network), f"{container_id}:{ifname}.json")


def record_attachment(cfg: Config, network: str, att: Attachment) -> str:
    """Write the attachment record atomically (from a spare inode when there is one: see
    :mod:`netplugin.core.spares`); not synced: the setup's intent record makes it durable in the
    same commit (CallOptions.durable_with). Returns its path."""
    directory = attachment_dir(cfg.state_dir, network)
    ensure_dir(directory, base=cfg.state_dir)
    path = attachment_path(cfg.state_dir, network, att.container_id, att.ifname)
    try:
        spares_for(directory, cfg.state_dir).replace(path, json.dumps(att.to_dict()).encode() + b"\n", mode=0o644)
    except OSError as e:
        raise SystemFailure("cannot write", path, e.strerror or str(e)) from e
    return path


def stock_attachments(state_dir: str, network: str) -> int:
    """Make spare inodes for ``network``'s attachment records ahead of need (the daemon, once per
    network); how many it made."""
    directory = attachment_dir(state_dir, network)
    ensure_dir(directory, base=state_dir)
    return spares_for(directory, state_dir).fill()


def _index_lock(state_dir: str) -> Any:
    ensure_dir(os.path.join(state_dir, "cni"), base=state_dir)
    # one fixed file taken on every CNI call: kept, not created and removed per call
    return flocked(os.path.join(state_dir, "cni", ".lock"), base=state_dir, keep=True)


def attachments_of(state_dir: str, container_id: str) -> list[tuple[str, str]]:
    """(network, ifname) of every attachment recorded for ``container_id``, in any network.

    Read from the file names alone, so a torn record still counts. Raises SystemFailure when
    the index cannot be listed (guessing "none" could tear down or clobber a live attachment).
    """
    root = os.path.join(state_dir, "cni")
    prefix = container_id + ":"
    found: list[tuple[str, str]] = []
    try:
        networks = sorted(n for n in os.listdir(root) if not n.startswith("."))
    except FileNotFoundError:
        return []
    except OSError as e:
        raise SystemFailure("cannot list", root, e.strerror or str(e)) from e
    for network in networks:
        directory = os.path.join(root, network)
        try:
            names = os.listdir(directory)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as e:
            raise SystemFailure("cannot list", directory, e.strerror or str(e)) from e
        found += [(network, n[len(prefix) : -5]) for n in names if n.startswith(prefix) and n.endswith(".json")]
    return sorted(found)


def attached_elsewhere(state_dir: str, network: str, container_id: str, ifname: str) -> bool:
    """Is the container attached under another (network, ifname)? (DEL of a refused attachment)"""
    return any(a != (network, ifname) for a in attachments_of(state_dir, container_id))


def claim_attachment(cfg: Config, network: str, att: Attachment) -> str:
    """Record ``att`` for ``network`` unless the container has another attachment (see the module doc).

    Returns the record's path (to be made durable with the setup's intent record).

    Adding the same attachment again, as the same pod, is allowed (an ADD retried); anything
    else is CniError 4 and nothing is changed.
    """
    with _index_lock(cfg.state_dir):
        for other_network, ifname in attachments_of(cfg.state_dir, att.container_id):
            if (other_network, ifname) != (network, att.ifname):
                raise CniError(
                    CNI_INVALID_ENV,
                    f"container {att.container_id} already has interface {ifname!r} on network "
                    f"{other_network!r}: netplugin attaches a container once per state dir, so "
                    f"CNI_IFNAME {att.ifname!r} on network {network!r} is refused",
                    "its plugins key a pod's veth and address by the container id alone; "
                    "the existing attachment is left as it is",
                )
            before = recorded_attachment(cfg, network, att.container_id, att.ifname)
            if before is not None and (before.namespace, before.name) != (att.namespace, att.name):
                raise CniError(
                    CNI_INVALID_ENV,
                    f"container {att.container_id} ({att.ifname}) is already attached as pod "
                    f"{before.pod}; CNI_ARGS now name pod {att.namespace}/{att.name}: a DEL must come first",
                    "the existing attachment is left as it is",
                )
        ident = _shared_netns(cfg, att)
        path = record_attachment(cfg, network, att)
        if ident is not None:
            _index_netns(cfg, network, att, ident)
        return path


def refuse_foreign_netns(netns: str) -> None:
    """CniError 4 when ``netns`` is this process's or the node's own network namespace (or no
    namespace file at all, but missing): see :func:`netplugin.core.netns.netns_problem`."""
    problem = netns_problem(netns)
    if problem is not None:
        raise CniError(CNI_INVALID_ENV, f"invalid CNI_NETNS {short_repr(netns)}: {problem}")


def _netns_index(state_dir: str, ident: tuple[int, int]) -> str:
    return os.path.join(state_dir, "cni", ".netns", f"{ident[0]}-{ident[1]}")


def _index_owner(index: str) -> str:
    """The container whose attachment record ``index`` is a hard link of ("" when none)."""
    try:
        doc = json.loads(read_small(index))
        return str(doc["containerID"]) if isinstance(doc, dict) else ""
    except FileNotFoundError:
        return ""
    except (OSError, ValueError, KeyError, NetpluginError):
        return ""  # torn: no owner, the claim replaces it


def _shared_netns(cfg: Config, att: Attachment) -> tuple[int, int] | None:
    """CniError 4 when another container's recorded attachment is in the same network namespace;
    else the namespace's identity to index (None when ``att.netns`` is no namespace).

    Namespaces are compared by what the paths name now (nsfs device and inode), so another path
    to the same namespace (``/proc/PID/ns/net``, a bind mount) is caught. One lookup, not a scan:
    ``cni/.netns/<dev>-<ino>`` is a hard link of the attachment record that last claimed the
    namespace (one link(2) per ADD, made under the index lock). It counts only while its
    container still has an attachment whose netns path names the same namespace now, so a stale
    entry, or a namespace inode number the kernel reused, never blocks a new pod.
    """
    try:
        mine = netns_identity(att.netns)
    except OSError:
        return None  # no namespace to share: the plugin reports it
    other = _index_owner(_netns_index(cfg.state_dir, mine))
    if not other or other == att.container_id:
        return mine
    for network, ifname in attachments_of(cfg.state_dir, other):
        rec = recorded_attachment(cfg, network, other, ifname)
        try:
            same = rec is not None and netns_identity(rec.netns) == mine
        except OSError:
            continue
        if same and rec is not None:
            raise CniError(
                CNI_INVALID_ENV,
                f"invalid CNI_NETNS {short_repr(att.netns)}: it is the network namespace of container "
                f"{other} (pod {rec.pod}, network {network!r}); a container may not attach to "
                "another container's namespace",
                "the existing attachment is left as it is",
            )
    return mine


def _index_netns(cfg: Config, network: str, att: Attachment, ident: tuple[int, int]) -> None:
    index = _netns_index(cfg.state_dir, ident)
    record = attachment_path(cfg.state_dir, network, att.container_id, att.ifname)
    try:
        if os.path.exists(index) and os.path.samefile(index, record):
            return  # an ADD retried
        ensure_dir(os.path.dirname(index), base=cfg.state_dir)
        try:
            os.link(record, index)
        except FileExistsError:  # a stale entry, checked by _shared_netns: replace it
            os.unlink(index)
            os.link(record, index)
    except OSError as e:
        raise SystemFailure("cannot index", index, e.strerror or str(e)) from e


def prune_netns_index(state_dir: str) -> None:
    """Drop index entries whose attachment record is gone (its last link): CNI GC."""
    directory = os.path.join(state_dir, "cni", ".netns")
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return
    for name in names:
        path = os.path.join(directory, name)
        try:
            if os.lstat(path).st_nlink < 2:
                os.unlink(path)
        except FileNotFoundError:
            continue


def recorded_attachment(cfg: Config, network: str, container_id: str, ifname: str) -> Attachment | None:
    """The attachment ADD recorded, or None when there is no (usable) record."""
    path = attachment_path(cfg.state_dir, network, container_id, ifname)
    try:
        doc = load_json(read_small(path), duplicates=True)  # O_NOFOLLOW, a regular file, bounded
        att = Attachment(container_id, ifname, str(doc.get("netns", "")), doc["namespace"], doc["name"])
        if not isinstance(att.namespace, str) or not isinstance(att.name, str):
            return None
        _ = att.pod
    except (OSError, DocumentError, AttributeError, KeyError, TypeError, NetpluginError):
        return None
    return att


def forget_attachment(cfg: Config, network: str, container_id: str, ifname: str, netns: str | None = None) -> None:
    """Remove the attachment record, and the netns index's link to it when ``netns`` still names
    the namespace it indexes; the record's inode then becomes a spare (:mod:`netplugin.core.spares`).
    A record still linked from the index is unlinked (the index entry goes at the next CNI GC)."""
    path = attachment_path(cfg.state_dir, network, container_id, ifname)
    try:
        if netns:
            _unindex(cfg.state_dir, path, netns)
        linked = os.lstat(path).st_nlink > 1  # still in the index: its inode is no spare
        discard(path, None if linked else spares_for(attachment_dir(cfg.state_dir, network), cfg.state_dir))
    except FileNotFoundError:
        pass
    except OSError as e:
        raise SystemFailure("cannot remove", path, e.strerror or str(e)) from e


def _unindex(state_dir: str, record: str, netns: str) -> None:
    """Drop ``cni/.netns/<dev>-<ino>`` of ``netns`` if it is a link of ``record`` (under the index lock)."""
    try:
        ident = netns_identity(netns)
    except OSError:
        return  # the namespace is gone: the index entry is pruned by the next CNI GC
    index = _netns_index(state_dir, ident)
    with _index_lock(state_dir):
        try:
            if os.path.samefile(index, record):
                os.unlink(index)
        except FileNotFoundError:
            pass


def remove_stale_temps(state_dir: str, network: str) -> list[str]:
    """Remove the temp files of record writes whose writer died (a SIGKILL mid-ADD); the problems."""
    problems = []
    for path in stale_temps(attachment_dir(state_dir, network), max_depth=0):
        try:
            os.unlink(path)
        except FileNotFoundError:
            continue
        except OSError as e:
            problems.append(f"cannot remove {path}: {e.strerror or e}")
    return problems


def list_attachments(state_dir: str, network: str) -> tuple[list[Attachment], list[str]]:
    """The attachments recorded for ``network``, and the problems met reading them."""
    directory = attachment_dir(state_dir, network)
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return [], []
    except OSError as e:
        return [], [f"cannot list {directory}: {e.strerror or e}"]
    found: list[Attachment] = []
    problems: list[str] = []
    for fname in names:
        if not fname.endswith(".json") or ":" not in fname:
            continue  # temp files of a write in progress, or not ours
        path = os.path.join(directory, fname)
        try:
            doc = json.loads(read_small(path))  # O_NOFOLLOW, a regular file, bounded
            att = Attachment(doc["containerID"], doc["ifname"], doc.get("netns", ""), doc["namespace"], doc["name"])
            if not all(isinstance(v, str) for v in att.to_dict().values()):
                raise TypeError("fields must be strings")
            _ = att.pod  # validates the names
        except FileNotFoundError:
            continue  # a DEL removed it meanwhile
        except (OSError, ValueError, KeyError, TypeError, NetpluginError) as e:
            problems.append(f"{path}: unreadable attachment record ({e})")
            continue
        found.append(att)
    return found, problems
