"""Bounded YAML and JSON loading: what a document costs is bounded by its size, whoever wrote it;
and the one YAML writer (``-o yaml``), so that only this module imports yaml.

In detail: ``ARCHITECTURE.md``, "Module notes".

netplugin reads documents that other people wrote (pod manifests, its config, kubeconfigs, CNI
network configs). Every loader here enforces, before anything big is built:
"""

from __future__ import annotations

# Imports inside this module's functions are kept for the per-call import set
# (tests/frontends/fastpath.py): each keeps a module off the calls that do not need it
# (BENCHMARKS.md rows B-i and B: the CLI's cold start and per-pod run without a daemon).
import json
from typing import Any

from netplugin.core.errors import short_repr  # defined there: errors quote values with it

__all__ = [
    "MAX_CHARS",
    "MAX_DEPTH",
    "MAX_NODES",
    "DocumentError",
    "dump_yaml",
    "load_json",
    "load_yaml",
    "read_document",
    "shape_problem",
    "short_repr",
]

#: The deepest nesting of collections accepted (a pod manifest needs about 10).
MAX_DEPTH = 100
#: The most nodes (scalars and collections, aliases expanded) one document may have.
MAX_NODES = 50_000
#: The most characters of scalars, aliases expanded (an alias to a long string is counted each time:
#: a mapping of 50 000 keys aliasing one 1 MB string would be a 50 GB environment for a plugin).
MAX_CHARS = 16 << 20
_MERGE_TAG = "tag:yaml.org,2002:merge"


class DocumentError(ValueError):
    """A document netplugin refuses to read; ``str()`` is a one-line reason."""


def _check_size(data: bytes | str, max_bytes: int | None) -> None:
    if max_bytes is not None and len(data) > max_bytes:
        raise DocumentError(f"is larger than the limit of {max_bytes} bytes")


def read_document(path: str, max_bytes: int) -> bytes:
    """The bytes of the file at ``path``, at most ``max_bytes`` of them, without blocking.

    A FIFO would block the reader for ever and ``/dev/zero`` never ends: opened non-blocking,
    only regular files and character devices (``/dev/null`` as an empty config) are read, and
    reading stops one byte past the limit. Raises OSError (I/O) or :class:`DocumentError`.
    """
    # Imported here: short_repr and load_json users (the CNI protocol) read no files.
    from netplugin.core.fileio import FileRefused, read_bounded

    try:
        data = read_bounded(path, max_bytes, follow=True, devices=True)
    except FileRefused:
        raise DocumentError("is not a regular file") from None
    _check_size(data, max_bytes)
    return data


# --- YAML ----------------------------------------------------------------------------------------

_LOADER: Any = None


def _parsers() -> tuple[Any, tuple[Any, ...]]:
    """libyaml's parser (None without it) and the parser classes the loader derives from."""
    import yaml

    c_parser: Any
    try:
        import yaml.cyaml

        c_parser = yaml.cyaml.CParser  # type: ignore[attr-defined]
    except (ImportError, AttributeError):  # PyYAML built without libyaml
        c_parser = None
    parsers: tuple[Any, ...] = (
        (c_parser,) if c_parser is not None else (yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser)
    )
    return c_parser, parsers


def _loader_class() -> Any:
    """The loader: libyaml's parser (events only), the composer below, a strict SafeConstructor."""
    import yaml
    from yaml.constructor import ConstructorError, SafeConstructor
    from yaml.resolver import Resolver

    c_parser, parsers = _parsers()

    class StrictConstructor(SafeConstructor):
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            own = [k for k, _ in node.value if k.tag != _MERGE_TAG] if isinstance(node, yaml.MappingNode) else []
            merged = len(own) != len(node.value)
            mapping = super().construct_mapping(node, deep=deep)
            # Cheap test first: fewer entries than keys means a duplicate (unless "<<" merged some).
            if merged or len(mapping) < len(own):
                seen: dict[Any, Any] = {}
                for key_node in own:
                    key = self.construct_object(key_node)
                    try:
                        first = seen.setdefault(key, key_node)
                    except TypeError:
                        continue  # unhashable: construct_mapping said so already
                    if first is not key_node:
                        raise ConstructorError(
                            None,
                            None,
                            f"duplicate key {short_repr(key)} (first on line {first.start_mark.line + 1})",
                            key_node.start_mark,
                        )
            return mapping

    class Loader(*parsers, StrictConstructor, Resolver):  # type: ignore[misc]
        def __init__(self, stream: Any) -> None:
            if c_parser is not None:
                c_parser.__init__(self, stream)
            else:
                yaml.reader.Reader.__init__(self, stream)
                yaml.scanner.Scanner.__init__(self)
                yaml.parser.Parser.__init__(self)
            StrictConstructor.__init__(self)
            Resolver.__init__(self)

        def get_single_node(self) -> Any:
            self.get_event()  # StreamStart
            if self.check_event(yaml.StreamEndEvent):
                return None
            self.get_event()  # DocumentStart
            root = _compose(self)
            self.get_event()  # DocumentEnd
            if not self.check_event(yaml.StreamEndEvent):
                raise _error("expected a single document, but found another", self.get_event().start_mark)
            return root

    return Loader


def _error(problem: str, mark: Any) -> Exception:
    from yaml.composer import ComposerError

    return ComposerError(None, None, problem, mark)


def _kinds() -> tuple[Any, ...]:
    """The event and node classes :func:`_compose` tells apart, in the order it unpacks them."""
    from yaml import events, nodes

    return (
        events.AliasEvent,
        events.ScalarEvent,
        events.SequenceStartEvent,
        events.MappingStartEvent,
        events.SequenceEndEvent,
        events.MappingEndEvent,
        nodes.ScalarNode,
        nodes.SequenceNode,
        nodes.MappingNode,
    )


def _open(event: Any, node_kind: Any, resolve: Any, depth: int) -> Any:
    """The empty collection node a start event opens at ``depth`` open collections (limit checked)."""
    if depth >= MAX_DEPTH:
        raise _error(f"is nested more than {MAX_DEPTH} levels deep", event.start_mark)
    tag = event.tag
    if tag is None or tag == "!":
        tag = resolve(node_kind, None, event.implicit)
    return node_kind(tag, [], event.start_mark, None, flow_style=event.flow_style)


def _compose(loader: Any) -> Any:
    """The node graph of one document, from the parser's events, by a loop (not recursion).

    Counts every node and scalar character, aliases expanded (an anchor remembers its subtree's
    expanded size), and the depth of open collections; any limit ends the parse at the event
    that crossed it.
    """
    alias_ev, scalar_ev, seq_start, map_start, seq_end, map_end, scalar_node, seq_node, map_node = _kinds()
    get_event, resolve = loader.get_event, loader.resolve
    anchors: dict[str, tuple[Any, int, int]] = {}  # anchor -> (its node, expanded nodes, expanded chars)
    stack: list[list[Any]] = []  # open collections: [node, anchor, counts at its start, pending key]
    nokey = stack  # a sentinel no key can be
    total = chars = 0
    while True:
        event = get_event()
        kind = type(event)
        if kind is scalar_ev:
            total += 1
            chars += len(event.value)
            tag = event.tag
            if tag is None or tag == "!":
                tag = resolve(scalar_node, event.value, event.implicit)
            done: Any = scalar_node(tag, event.value, event.start_mark, event.end_mark, style=event.style)
            if event.anchor is not None:
                anchors[event.anchor] = (done, 1, len(event.value))
        elif kind is map_start or kind is seq_start:
            total += 1
            node_kind = seq_node if kind is seq_start else map_node
            stack.append([_open(event, node_kind, resolve, len(stack)), event.anchor, (total - 1, chars), nokey])
            continue
        elif kind is map_end or kind is seq_end:
            done, anchor, (start, start_chars), _ = stack.pop()
            done.end_mark = event.end_mark
            if anchor is not None:
                anchors[anchor] = (done, total - start, chars - start_chars)
        elif kind is alias_ev:
            if event.anchor not in anchors:  # undefined, or its own node still open (a cycle)
                raise _error(f"found undefined or recursive alias {event.anchor!r}", event.start_mark)
            done, size, length = anchors[event.anchor]
            total += size
            chars += length
        else:  # the parser emits nothing else inside a document
            raise _error(f"unexpected {kind.__name__}", event.start_mark)
        if total > MAX_NODES:
            raise _error(f"has more than {MAX_NODES} nodes (aliases expanded)", event.start_mark)
        if chars > MAX_CHARS:
            raise _error(f"has more than {MAX_CHARS} characters of text (aliases expanded)", event.start_mark)
        if not stack:
            return done
        top = stack[-1]
        if top[0].__class__ is seq_node:
            top[0].value.append(done)
        elif top[3] is nokey:
            top[3] = done
        else:
            top[0].value.append((top[3], done))
            top[3] = nokey


def dump_yaml(doc: Any) -> str:
    """``doc`` (JSON's types only) as a block-style YAML document, keys sorted, no trailing newline."""
    import yaml

    return str(yaml.safe_dump(doc, sort_keys=True, default_flow_style=False)).rstrip("\n")


def load_yaml(data: bytes | str, *, max_bytes: int | None = None) -> Any:
    """Parse one YAML document (safe tags only) within the limits above. Raises :class:`DocumentError`."""
    global _LOADER
    _check_size(data, max_bytes)
    if not data.strip():
        return None  # what YAML makes of an empty document, without importing yaml (a costly import)
    import yaml

    if _LOADER is None:
        _LOADER = _loader_class()
    loader = None
    try:
        loader = _LOADER(data)
        return loader.get_single_data()
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or str(e)
        if "exceeded maximum nesting depth" in str(problem):
            # A libyaml with a depth limit of its own stops while scanning ahead of the composer: the
            # same limit, said in this module's words whichever libyaml the machine has.
            problem = f"is nested more than {MAX_DEPTH} levels deep"
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise DocumentError(" ".join(str(problem).split()) + where) from None
    except (ValueError, RecursionError) as e:  # bad UTF-8, a timestamp out of range, ...
        raise DocumentError(f"cannot decode: {short_repr(e, 200)}") from None
    finally:
        if loader is not None:
            loader.dispose()


# --- JSON ----------------------------------------------------------------------------------------


def shape_problem(doc: Any, max_nodes: int | None = MAX_NODES) -> str | None:
    """Deeper than MAX_DEPTH or more than ``max_nodes`` nodes? (an iterative walk of a parsed value)

    ``max_nodes=None`` checks the depth only (a document whose size bounds its cost already).
    """
    todo: list[tuple[Any, int]] = [(doc, 0)]
    count = 0
    limit = -1 if max_nodes is None else max_nodes
    while todo:
        value, depth = todo.pop()
        count += 1
        if count == limit + 1:
            return f"has more than {max_nodes} nodes"
        if isinstance(value, dict):
            value = value.values()
        elif not isinstance(value, list):
            continue
        if depth >= MAX_DEPTH:
            return f"is nested more than {MAX_DEPTH} levels deep"
        todo.extend((v, depth + 1) for v in value)
    return None


def load_json(
    data: bytes | str, *, max_bytes: int | None = None, duplicates: bool = False, max_nodes: int | None = MAX_NODES
) -> Any:
    """Parse one JSON document within the limits above. Raises :class:`DocumentError`.

    Duplicate object keys are refused unless ``duplicates`` (then the last one wins, as in Go).
    ``max_nodes=None``: no node count, for documents that are many objects in one (a LIST page
    of a Kubernetes collection: its byte size bounds it, and each object is checked on its own).
    """
    _check_size(data, max_bytes)
    try:
        doc = json.loads(data, object_pairs_hook=None if duplicates else _unique)
    except RecursionError:  # the C scanner's own guard, far below any stack overflow
        raise DocumentError(f"is nested more than {MAX_DEPTH} levels deep") from None
    except DocumentError:
        raise
    except ValueError as e:  # JSONDecodeError, bad UTF-8 (UnicodeDecodeError), huge integers
        raise DocumentError(" ".join(str(e).split())[:200]) from None
    problem = shape_problem(doc, max_nodes)
    if problem:
        raise DocumentError(problem)
    return doc


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DocumentError(f"duplicate key {short_repr(key)}")
            seen.add(key)
    return out
