"""The CLI's tables: a header and left-aligned columns two spaces apart (as kubectl prints them)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["text_table"]


def text_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """``header`` and ``rows`` as aligned columns; trailing blanks stripped."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    return "\n".join(
        "  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=True)).rstrip() for row in [header, *rows]
    )
