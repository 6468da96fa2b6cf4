"""How netplugin's log lines look: an RFC 3339 timestamp, the level, the message and its fields.

A log call passes its structured data as ``extra={"fields": {...}}``: ``text`` lines end with them
as ``key=value`` pairs (logfmt: values with spaces or quotes are JSON-quoted), ``json`` lines carry
them as keys beside ``time``, ``level``, ``logger`` and ``msg``. An error's fields are its data
(:meth:`~netplugin.core.errors.NetpluginError.to_dict`), so a log line says what the error answer says.

When stderr is the journal, journald stamps each entry with its own time and takes the level
from a ``<N>`` syslog priority prefix (sd-daemon(3)): the lines then carry neither timestamp nor
level name, only that prefix, on each line of a multi-line message.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from netplugin.core.errors import NetpluginError

__all__ = ["LineFormatter", "configure", "error_fields", "fields_of", "level_number"]


#: logging level -> syslog priority (sd-daemon(3)'s SD_CRIT ... SD_DEBUG), highest first
_PRIORITIES = ((logging.CRITICAL, 2), (logging.ERROR, 3), (logging.WARNING, 4), (logging.INFO, 6))


def level_number(name: str) -> int:
    """``info`` -> ``logging.INFO``."""
    return int(logging.getLevelName(name.upper()))


def fields_of(record: logging.LogRecord) -> Mapping[str, Any]:
    """The structured fields a log call passed as ``extra={"fields": ...}`` (none: empty)."""
    found = record.__dict__.get("fields")
    return found if isinstance(found, Mapping) else {}


def error_fields(error: NetpluginError) -> dict[str, Any]:
    """An error's data as log fields (``error``: its class, the failing plugin, ...); its message is the line's."""
    return {k: v for k, v in error.to_dict().items() if k != "message"}


def _rfc3339(created: float) -> str:
    moment = datetime.datetime.fromtimestamp(created, datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _logfmt_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str, separators=(",", ":"))
    if text and not any(c in text for c in ' "=\\\n\t') and text.isprintable():
        return text
    return json.dumps(text, ensure_ascii=False)


def _priority(levelno: int) -> int:
    return next((prio for level, prio in _PRIORITIES if levelno >= level), 7)


class LineFormatter(logging.Formatter):
    """One log record as a ``text`` or ``json`` line; ``journal``: for journald (see the module doc)."""

    def __init__(self, fmt: str = "text", *, journal: bool = False) -> None:
        super().__init__()
        self.json = fmt == "json"
        self.journal = journal

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        trace = self.formatException(record.exc_info) if record.exc_info else ""
        if self.json:
            doc: dict[str, Any] = {} if self.journal else {"time": _rfc3339(record.created)}
            doc.update(level=record.levelname.lower(), logger=record.name, msg=message)
            doc.update(fields_of(record))
            if trace:
                doc["exception"] = trace
            line = json.dumps(doc, default=str, ensure_ascii=False, separators=(",", ":"))
        else:
            pairs = "".join(f" {k}={_logfmt_value(v)}" for k, v in fields_of(record).items())
            line = f"{message}{pairs}" + (f"\n{trace}" if trace else "")
            if not self.journal:
                line = f"{_rfc3339(record.created)} {record.levelname} {line}"
        if self.journal:
            # journald splits on newlines: every line of a traceback keeps the entry's priority.
            prio = _priority(record.levelno)
            return "\n".join(f"<{prio}>{part}" for part in line.split("\n"))
        return line


def configure(level: str, fmt: str, *, journal: bool = False) -> None:
    """Send every log record at ``level`` or above to stderr, formatted by :class:`LineFormatter`.

    Replaces the root logger's handlers: one process has one log format.
    """
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LineFormatter(fmt, journal=journal))
    root.addHandler(handler)
    root.setLevel(level_number(level))
