"""The daemon's node-wide operations, ``pods`` and ``gc``, and the wire's error classes.

Both operations answer with what the CLI prints when it runs alone (the rendered table, the gc
report's text), so a command gives the same output through the daemon as without it. A gc that
could not finish is not raised: its report comes first, then the error, as a local gc does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from netplugin.core.errors import NetpluginError

if TYPE_CHECKING:
    from netplugin.core.config import Config
    from netplugin.manager.manager import Manager

__all__ = ["error_classes", "gc_answer", "pods_answer"]


def error_classes(cls: type) -> list[str]:
    """An error class and its bases up to NetpluginError, by name (the wire's ``classes``)."""
    names = []
    for c in cls.__mro__:
        names.append(c.__name__)
        if c is NetpluginError:
            break
    return names


def pods_answer(config: Config) -> dict[str, Any]:
    """The ``pods`` op: the listing, and its table as ``netplugin pods`` prints it."""
    from netplugin.store.listing import list_pods

    listing = list_pods(config.state_dir, config.run_dir)
    return {"listing": listing.to_dict(), "table": listing.table() if listing.rows else None}


def gc_answer(manager: Manager, req: dict[str, Any]) -> dict[str, Any]:
    """The ``gc`` op: the report, its text, and the error of a gc that could not finish (or None)."""
    from netplugin.manager.gc import GcIncomplete, run_gc

    report = run_gc(manager, dry_run=bool(req.get("dry_run")), check_host=req.get("check_host") is not False)
    out: dict[str, Any] = {"report": report.to_dict(), "text": report.text(), "error": None, "classes": None}
    if report.failed:
        err = GcIncomplete(report.failed)
        out["error"], out["classes"] = err.to_dict(), error_classes(type(err))
    return out
