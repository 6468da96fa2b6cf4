"""The daemon's log line of each pod action, and of each request it answers with an error.

A pod action has one line, as it ends (:func:`log_action`, the manager's ``on_action``): setup and
teardown at info, status (which the kubelet asks for on every pod sync) at debug; a failure at
error (a status failure at warning), its fields those of the error's answer. A request the
daemon declines (:class:`DaemonUnavailable`: the caller does it itself) is no fault: info.
"""

from __future__ import annotations

import logging
from typing import Any

from netplugin.core.errors import DaemonUnavailable, NetpluginError, short_repr
from netplugin.core.logs import error_fields
from netplugin.core.names import PodRef
from netplugin.frontends.wire.protocol import OPS, POD_OPS

__all__ = ["log_action", "log_refusal"]

log = logging.getLogger("netplugin.pods")
requests_log = logging.getLogger("netplugin.daemon")

#: action -> (level when it succeeded, level when it failed)
_LEVELS = {
    "setup": (logging.INFO, logging.ERROR),
    "teardown": (logging.INFO, logging.ERROR),
    "status": (logging.DEBUG, logging.WARNING),
}


def log_action(action: str, pod: PodRef, chain: tuple[str, ...], seconds: float, error: NetpluginError | None) -> None:
    """Log one pod action: pod, infra id, chain, outcome and duration (and the error's data)."""
    ok_level, failed_level = _LEVELS[action]
    fields: dict[str, Any] = {
        "action": action,
        "pod": f"{pod.namespace}/{pod.name}",
        "infra_id": pod.infra_id,
        "chain": ",".join(chain),
        "outcome": "ok" if error is None else "error",
        "duration_ms": round(seconds * 1000, 1),
    }
    if error is None:
        log.log(ok_level, "%s %s/%s: ok", action, pod.namespace, pod.name, extra={"fields": fields})
        return
    # The error's own data (class, failing member, exit status, stderr tail, ...), as its answer has it.
    data = {k: v for k, v in error_fields(error).items() if k not in fields}
    log.log(
        failed_level,
        "%s %s/%s: %s",
        action,
        pod.namespace,
        pod.name,
        error.message,
        extra={"fields": {**fields, **data}},
    )
    error.logged = True


def log_refusal(req: Any, error: NetpluginError) -> None:
    """Log a request (as read, maybe not even JSON) answered with ``error``, unless its action's line did."""
    op, what = "request", ""
    if isinstance(req, dict) and req.get("op") in OPS:
        op = req["op"]
        if op in POD_OPS:
            what = f"{req.get('namespace')}/{req.get('pod')} ({req.get('infra_id')})"
            # A caller's text: never a line break or escape sequence of its own in the log.
            what = " " + (what if what.isprintable() else short_repr(what))
    if isinstance(error, DaemonUnavailable):
        # Not run, and not a fault: the caller does it itself (or reports it, use_daemon: always).
        requests_log.info("declined %s%s: %s", op, what, error.details.get("reason", error.message))
    elif not error.logged:
        requests_log.warning("%s%s: %s", op, what, error.message, extra={"fields": error_fields(error)})
