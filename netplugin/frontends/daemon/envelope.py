"""A request's envelope, checked before anything runs: an object, our protocol version, a known op,
and (when the caller sent its settings' fingerprint) the daemon's own settings.

A caller whose settings differ gets DaemonUnavailable, not an error: it then does the work itself
with its own settings, as if no daemon were there.
"""

from __future__ import annotations

from typing import Any

from netplugin.core.errors import DaemonUnavailable, InvalidArgument
from netplugin.frontends.wire.fingerprint import differing_settings
from netplugin.frontends.wire.protocol import OPS, PROTOCOL_VERSION

__all__ = ["check_request"]


def check_request(req: Any, own: dict[str, Any], socket_path: str) -> dict[str, Any]:
    """``req`` when its envelope is good; InvalidArgument naming the field, or DaemonUnavailable."""
    if not isinstance(req, dict):
        raise InvalidArgument("request", type(req).__name__, "must be a JSON object")
    if req.get("v", PROTOCOL_VERSION) != PROTOCOL_VERSION:
        raise InvalidArgument("protocol version", req.get("v"), f"this daemon speaks {PROTOCOL_VERSION}")
    op = req.get("op")
    if op not in OPS:
        raise InvalidArgument("op", op, f"must be one of {', '.join(OPS)}")
    theirs = req.get("config")
    if theirs is not None and (differ := differing_settings(own, theirs)):
        raise DaemonUnavailable(socket_path, f"it runs with different settings ({', '.join(differ)})")
    return req
