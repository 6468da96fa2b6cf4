"""The real Kubernetes peers that ``scripts/build-peers.sh`` builds from the Go module proxy.

``scripts/test.sh`` runs the build and exports its directory as ``NETPLUGIN_PEERS``; a developer
running pytest alone exports it from ``bash scripts/build-peers.sh``. A test that needs a peer calls
:func:`require`: where a peer is missing it fails under CI (``CI=true``: the peer build is part of
the run, so a missing peer is a broken build) and skips with the reason elsewhere. It never stands
in for a peer that is not there.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

__all__ = ["PEERS_ENV", "missing_reason", "peer", "require"]

PEERS_ENV = "NETPLUGIN_PEERS"


def _dir() -> Path | None:
    value = os.environ.get(PEERS_ENV, "")
    return Path(value) if value else None


def missing_reason(*names: str) -> str | None:
    """Why the peers ``names`` (paths under the peer dir, e.g. ``containerd``, ``cni/bridge``) cannot be used."""
    base = _dir()
    if base is None:
        return f"{PEERS_ENV} is not set (export {PEERS_ENV}=$(bash scripts/build-peers.sh))"
    absent = [n for n in names if not os.access(base / n, os.X_OK)]
    if not absent:
        return None
    why = f"{', '.join(absent)} not built in {base}"
    failed = base / "MISSING"
    if failed.is_file():
        why += f" (build-peers.sh could not build: {' '.join(failed.read_text().split())}; its logs: {base.parent}/log)"
    return why


def require(*names: str) -> Path:
    """The peer dir, holding ``names``; else fail under CI, skip elsewhere, with the reason."""
    reason = missing_reason(*names)
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"peer missing under CI: {reason}", pytrace=False)
        pytest.skip(reason)
    base = _dir()
    assert base is not None
    return base


def peer(name: str) -> Path:
    """The path of peer ``name`` (after :func:`require` accepted it)."""
    return require(name) / name
