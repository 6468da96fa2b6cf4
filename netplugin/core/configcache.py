"""The config file, parsed once per content: a JSON copy of its YAML parse in the run dir.

Every ``netplugin`` CLI process and Python CNI shim that reads a config file would import
PyYAML for it (a large share of a cold start, most of it ``yaml``'s module-level regular
expressions), although the file changes once in a long while. So the first process that parses
a file writes ``<run dir>/cache/config-<crc32 of its path>.json`` holding the path, the file's
exact text and the parsed document; a later process that reads the same bytes from the same
path takes the document from there (``json`` is already loaded on these paths).

Correctness does not rest on timestamps: a hit needs the cached text to equal the bytes just
read, byte for byte, so an edited file is always parsed again. Only documents made of JSON's
own types (mappings with string keys, lists, strings, integers, finite floats, booleans, null)
are cached, so the copy is the parse exactly; anything else (a YAML timestamp, binary) is
parsed every time. Trust: the cache directory is netplugin's own (:func:`ensure_dir`), a cache
file is opened without following links and used only when it is a regular file owned by this
user and writable by no one else.

The cache is an optimisation, never a source of truth: a missing, unreadable, foreign or
malformed cache file is a miss (the file is parsed), and a cache that cannot be written is left
unwritten; the command's outcome is the same either way.
"""

from __future__ import annotations

# Imports inside this module's functions are kept for the per-call import set
# (tests/frontends/fastpath.py): each keeps a module off the calls that do not need it
# (BENCHMARKS.md rows B-i and B: the CLI's cold start and per-pod run without a daemon).
import json
import math
import os
import stat
import zlib

TYPE_CHECKING = False  # not typing's: this module is on the CLI's cold path
if TYPE_CHECKING:
    from typing import Any

__all__ = ["CACHE_DIR", "MAX_CACHE_BYTES", "MISS", "cache_path", "lookup", "store"]

#: the run dir's subdirectory holding parse caches
CACHE_DIR = "cache"
#: the largest cache file read (a config file is at most 1 MiB; its parse about as much again)
MAX_CACHE_BYTES = 4 << 20
#: what a lookup returns when there is no usable cached parse
MISS: Any = object()


def cache_path(run_dir: str, path: str) -> str:
    """The cache file of config file ``path`` in ``run_dir``."""
    key = zlib.crc32(os.path.abspath(path).encode("utf-8", "surrogateescape"))
    return os.path.join(run_dir, CACHE_DIR, f"config-{key:08x}.json")


def _trusted(st: os.stat_result) -> None:
    if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ValueError("not this user's own, or writable by others")


def lookup(run_dir: str, path: str, data: bytes) -> Any:
    """The cached parse of config file ``path`` whose content is ``data``, or :data:`MISS`."""
    from netplugin.core.fileio import read_bounded

    try:
        raw = read_bounded(cache_path(run_dir, path), MAX_CACHE_BYTES, check=_trusted)
        if len(raw) > MAX_CACHE_BYTES:
            return MISS
        entry = json.loads(raw)
        text = data.decode("utf-8")
    except (OSError, ValueError):  # absent, refused (FileRefused is an OSError), foreign, not JSON, not UTF-8
        return MISS
    if not isinstance(entry, dict) or entry.get("path") != os.path.abspath(path) or entry.get("text") != text:
        return MISS
    return entry.get("doc")


def _plain(doc: Any, depth: int = 0) -> bool:
    """Whether ``doc`` is made of JSON's own types only (so a JSON copy parses back to an equal value)."""
    if depth > 100:
        return False
    if doc is None or isinstance(doc, (str, bool, int)):
        return True
    if isinstance(doc, float):
        return math.isfinite(doc)
    if isinstance(doc, list):
        return all(_plain(v, depth + 1) for v in doc)
    if isinstance(doc, dict):
        return all(isinstance(k, str) and _plain(v, depth + 1) for k, v in doc.items())
    return False


def store(run_dir: str, path: str, data: bytes, doc: Any) -> bool:
    """Cache ``doc``, the parse of config file ``path`` whose content is ``data``; whether it was written.

    Not written (False): a document that is not plain JSON, text that is not UTF-8, a run dir that
    is not netplugin's own, or a write that fails (the next process parses the file again).
    """
    from netplugin.core.dirs import ensure_dir
    from netplugin.core.errors import SystemFailure
    from netplugin.core.fileio import replace_file

    if not _plain(doc):
        return False
    try:
        entry = json.dumps({"path": os.path.abspath(path), "text": data.decode("utf-8"), "doc": doc})
        target = cache_path(run_dir, path)
        ensure_dir(run_dir)  # as every other user of the run dir creates it (0755: the socket lives there)
        ensure_dir(os.path.dirname(target), base=run_dir, mode=0o700)
        replace_file(target, entry.encode(), mode=0o600, durable=False)
    except (OSError, ValueError, SystemFailure):  # UnsafeDirectory is a SystemFailure
        return False
    return True
