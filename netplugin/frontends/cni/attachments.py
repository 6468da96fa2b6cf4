"""TODO docstring."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from netplugin.core.config import Config
from netplugin.core.names import PodRef
from netplugin.frontends.cni.protocol import E_CONFIG, CniError

__all__ = [
    "Attachment",
    "attachment_dir",
    "attachment_path",
    "forget_attachment",
    "list_attachments",
    "record_attachment",
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
        raise CniError(E_CONFIG, "GC needs cni.dev/valid-attachments in the network config")
    if not isinstance(raw, list):
        raise CniError(E_CONFIG, "cni.dev/valid-attachments must be a list")
    out: set[tuple[str, str]] = set()
    for entry in raw:
        if not isinstance(entry, dict) or not isinstance(entry.get("containerID"), str):
            raise CniError(E_CONFIG, f"cni.dev/valid-attachments: bad entry {entry!r} (needs containerID)")
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
        from netplugin.core.names import PodRef

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


def record_attachment(cfg: Config, network: str, att: Attachment) -> None:
    from netplugin.store.fsutil import atomic_write
    from netplugin.store.locks import ensure_dir

    ensure_dir(attachment_dir(cfg.state_dir, network), 0o755)
    path = attachment_path(cfg.state_dir, network, att.container_id, att.ifname)
    atomic_write(path, json.dumps(att.to_dict()).encode() + b"\n", mode=0o644)


def forget_attachment(cfg: Config, network: str, container_id: str, ifname: str) -> None:
    from netplugin.core.errors import SystemFailure

    path = attachment_path(cfg.state_dir, network, container_id, ifname)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise SystemFailure("cannot remove", path, e.strerror or str(e)) from e


def list_attachments(state_dir: str, network: str) -> tuple[list[Attachment], list[str]]:
    """The attachments recorded for ``network``, and the problems met reading them."""
    from netplugin.core.errors import InvalidArgument

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
            with open(path, "rb") as f:
                doc = json.loads(f.read())
            att = Attachment(doc["containerID"], doc["ifname"], doc.get("netns", ""), doc["namespace"], doc["name"])
            if not all(isinstance(v, str) for v in att.to_dict().values()):
                raise TypeError("fields must be strings")
            _ = att.pod  # validates the names
        except FileNotFoundError:
            continue  # a DEL removed it meanwhile
        except (OSError, ValueError, KeyError, TypeError, InvalidArgument) as e:
            problems.append(f"{path}: unreadable attachment record ({e})")
            continue
        found.append(att)
    return found, problems
