"""The daemon protocol's JSON codec: ``json.loads`` and ``json.dumps`` from the C accelerator alone.

JSON comes from the C accelerator ``_json`` alone: ``import json`` costs more than the rest of
a CNI call's start-up (json.decoder and json.encoder import ``re``, which imports ``enum`` and
``functools``: about the bare interpreter's whole start). :func:`loads` and :func:`dumps`
drive ``_json``'s parser and serializer directly, with the same results as ``json.loads`` and
``json.dumps`` (compact, or ``sort_keys`` with the default separators). Only on a syntax error
does :func:`loads` import ``json`` (to raise :class:`json.JSONDecodeError` with json's message).
"""

# No `from __future__ import annotations`: it loads the __future__ module on every call (a fast path).

# Imports inside this module's functions are kept for the per-call import set
# (tests/frontends/fastpath.py): each keeps a module off the calls that do not need it
# (BENCHMARKS.md rows H and Gpy: the CLI and the Python shim through the daemon).
import _json

__all__ = ["dumps", "loads"]

# Not typing's TYPE_CHECKING: importing typing would put the CLI's daemon path (and the Python shim's) over its target.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def _constant(name: str) -> float:
    return {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}[name]


class _Context:
    """What ``_json.make_scanner`` reads off a ``json.JSONDecoder``, with its defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = staticmethod(_constant)
    memo: dict[str, str]

    def __init__(self) -> None:
        self.memo = {}


# Driving _json directly keeps json (and re, enum, functools) off the CLI's daemon path, whose target it would miss.
_scan = _json.make_scanner(_Context())  # type: ignore[arg-type]  # duck-typed: the attributes it reads
_WHITESPACE = " \t\n\r"


def _fail(msg: str, doc: str, pos: int) -> ValueError:
    from json.decoder import JSONDecodeError

    return JSONDecodeError(msg, doc, pos)


def loads(data: str | bytes) -> "Any":
    """``json.loads`` for text or UTF-8 bytes; raises ValueError (JSONDecodeError, UnicodeDecodeError)."""
    doc = data.decode("utf-8") if isinstance(data, bytes) else data
    if doc.startswith("\ufeff"):
        raise _fail("Unexpected UTF-8 BOM (decode using utf-8-sig)", doc, 0)
    start = len(doc) - len(doc.lstrip(_WHITESPACE))
    try:
        value, end = _scan(doc, start)
    except StopIteration as e:
        raise _fail("Expecting value", doc, e.value) from None
    except (SystemError, ValueError):
        # The C scanner raises its syntax errors as json.decoder's class, and returns NULL
        # (SystemError) when that module is not loaded yet: let json itself say what is wrong.
        import json

        return json.loads(doc)
    rest = len(doc) - len(doc.rstrip(_WHITESPACE))
    if end != len(doc) - rest:
        raise _fail("Extra data", doc, end)
    return value


def _default(o: object) -> object:
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


_compact = _json.make_encoder(None, _default, _json.encode_basestring_ascii, None, ":", ",", False, False, True)
_sorted = _json.make_encoder(None, _default, _json.encode_basestring_ascii, None, ": ", ", ", True, False, True)


def dumps(obj: object, *, sort_keys: bool = False) -> str:
    """``json.dumps(obj, separators=(",", ":"))``, or with ``sort_keys`` ``json.dumps(obj, sort_keys=True)``."""
    if isinstance(obj, str):  # the C encoder handles containers and scalars, not a bare str
        return str(_json.encode_basestring_ascii(obj))
    chunks = (_sorted if sort_keys else _compact)(obj, 0)
    return "".join(chunks)
