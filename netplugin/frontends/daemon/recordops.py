"""The daemon's node-wide operations on the state records, ``pods`` and ``gc``.

Both operations answer with what the CLI prints when it runs alone (the rendered table, the gc
report's text), so a command gives the same output through the daemon as without it. A gc that
could not finish is not raised: its report comes first, then the error, as a local gc does.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from netplugin.frontends.wire.codes import error_classes
from netplugin.frontends.wire.protocol import progress_line
from netplugin.manager.gc import GcIncomplete, run_gc
from netplugin.store.listing import list_pods, still_needed
from netplugin.store.records import READY

if TYPE_CHECKING:
    from netplugin.core.config import Config
    from netplugin.manager.manager import Manager

log = logging.getLogger("netplugin.daemon")

__all__ = ["PROGRESS", "gc_answer", "pods_answer", "progress_sink", "still_needed_answer"]

#: where a request's progress lines go: set per connection in the event loop, seen by the worker
#: thread that runs the request (``asyncio.to_thread`` copies the context)
PROGRESS: ContextVar[Callable[[str], None] | None] = ContextVar("netplugin_progress", default=None)


def progress_sink(writer: asyncio.StreamWriter) -> Callable[[str], None]:
    """Writes a progress line on ``writer`` from a worker thread, before the answer the loop writes
    when the worker returns (both are loop callbacks, run in the order they were scheduled)."""
    loop = asyncio.get_running_loop()

    def send(text: str) -> None:
        line = json.dumps(progress_line(text), separators=(",", ":")).encode() + b"\n"
        loop.call_soon_threadsafe(writer.write, line)

    return send


def pods_answer(config: Config, broken: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The ``pods`` op: the listing, and its tables as ``netplugin pods`` prints them (plain and wide).

    ``broken``: the pods (``NS/NAME/INFRA_ID``) the daemon's repairer knows broken (a repair that
    keeps failing): a ready one among them is shown ``broken``."""
    listing = list_pods(config.state_dir, config.run_dir, config.chain)
    known = broken or {}
    listing.rows = [
        (r, "broken" if c == READY and f"{r.ref}/{r.ref.infra_id}" in known else c) for r, c in listing.rows
    ]
    if not listing.rows:
        return {"listing": listing.to_dict(), "table": None, "wide": None}
    return {"listing": listing.to_dict(), "table": listing.table(), "wide": listing.wide_table()}


def still_needed_answer(config: Config) -> dict[str, list[str]]:
    """Plugins outside the configured chain that recorded pods still need for their teardown -> pods.

    A reload that drops such a plugin is taken (the pods' teardowns select it by name while it is
    installed); health names it, and the log warns, until no pod needs it.
    """
    needed = still_needed(config.state_dir, config.chain)
    for plugin, pods in needed.items():
        log.warning("plugin %s is no longer configured but %d pod(s) still need it", plugin, len(pods))
    return needed


def gc_answer(manager: Manager, req: dict[str, Any]) -> dict[str, Any]:
    """The ``gc`` op: the report, its text, and the error of a gc that could not finish (or None).

    With ``"progress": true`` each pod gc waits for is sent as a progress line as it happens."""
    progress = PROGRESS.get() if req.get("progress") is True else None
    report = run_gc(
        manager, dry_run=bool(req.get("dry_run")), check_host=req.get("check_host") is not False, progress=progress
    )
    out: dict[str, Any] = {"report": report.to_dict(), "text": report.text(), "error": None, "classes": None}
    if report.failed:
        err = GcIncomplete(report.failed)
        out["error"], out["classes"] = err.to_dict(), error_classes(type(err))
    return out
