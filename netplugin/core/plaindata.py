"""Data classes for netplugin's own types, without the standard library's import cost.

``dataclasses`` imports ``inspect`` (and with it ``ast``, ``dis``, ``tokenize``, ``linecache``)
and writes five to seven functions per class through ``exec``: a large part of every ``netplugin``
and ``netplugin-cni`` process that loads the config, the manager and the store, among them the Python
shim the compiled one falls back to on each pod. This module gives the subset netplugin uses, with
the same behaviour and spelling, so a module switches by its import line alone:

* ``@dataclass``, ``@dataclass(frozen=True, order=True, slots=True)``;
* ``field(default=..., default_factory=..., repr=..., compare=...)``;
* ``fields(cls_or_instance)`` (objects with ``.name``, ``.default``, ``.default_factory``),
  ``replace(obj, **changes)`` and :class:`FrozenInstanceError`;
* ``__post_init__``, inherited fields, ``ClassVar`` annotations left alone;
* ``__init__`` (one ``exec`` per class: real parameters, so a missing or unknown argument is the
  usual ``TypeError``), ``__repr__``, ``__eq__`` (same class only), ``__hash__`` by the rules of
  ``dataclasses`` (frozen and eq: hashed by the compared fields; eq alone: unhashable),
  ordering with ``order=True``, ``__match_args__``, and with ``slots=True`` the state methods
  that let pickle copy an instance (frozen ones too).

Type checkers treat it as ``dataclasses`` itself (:pep:`681`'s ``dataclass_transform``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TypeVar, dataclass_transform

    _T = TypeVar("_T")
else:

    def dataclass_transform(**_: object) -> object:
        return lambda f: f


__all__ = ["MISSING", "Field", "FrozenInstanceError", "dataclass", "field", "fields", "replace"]

#: the class attribute holding a data class's fields, in order
_FIELDS = "__plaindata_fields__"


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


class FrozenInstanceError(AttributeError):
    """Assigning to or deleting a field of a frozen data class."""


class Field:
    """One field: its name, default or default factory, and whether repr and comparisons include it."""

    __slots__ = ("compare", "default", "default_factory", "name", "repr")

    def __init__(self, default: Any, default_factory: Any, repr: bool, compare: bool) -> None:
        if default is not MISSING and default_factory is not MISSING:
            raise ValueError("cannot specify both default and default_factory")
        self.name = ""
        self.default = default
        self.default_factory = default_factory
        self.repr = repr
        self.compare = compare

    def __repr__(self) -> str:
        return f"Field(name={self.name!r}, default={self.default!r}, default_factory={self.default_factory!r})"


def field(
    *, default: Any = MISSING, default_factory: Callable[[], Any] | Any = MISSING, repr: bool = True,
    compare: bool = True,
) -> Any:
    """A field with options (``dataclasses.field``'s subset)."""
    return Field(default, default_factory, repr, compare)


def fields(class_or_instance: Any) -> tuple[Field, ...]:
    """The fields of a data class or of one of its instances, in order."""
    try:
        found: tuple[Field, ...] = getattr(class_or_instance, _FIELDS)
    except AttributeError:
        raise TypeError("must be called with a dataclass type or instance") from None
    return found


def replace(obj: _T, /, **changes: Any) -> _T:
    """A copy of ``obj`` with ``changes`` (through ``__init__``, so ``__post_init__`` runs again)."""
    for f in fields(obj):
        if f.name not in changes:
            changes[f.name] = getattr(obj, f.name)
    return obj.__class__(**changes)


def _is_classvar(annotation: object) -> bool:
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__qualname__", "")
    return isinstance(text, str) and (text.startswith(("ClassVar", "typing.ClassVar")))


def _collect(cls: type) -> tuple[Field, ...]:
    """The fields of ``cls``: its bases' first, then its own annotations, in order."""
    found: dict[str, Field] = {}
    for base in reversed(cls.__mro__[1:]):
        for f in base.__dict__.get(_FIELDS, ()):
            found[f.name] = f
    # the class's own annotations (inspect.get_annotations would import inspect: what this module avoids)
    for name, annotation in cls.__dict__.get("__annotations__", {}).items():  # noqa: RUF063
        if _is_classvar(annotation):
            continue
        value = cls.__dict__.get(name, MISSING)
        f = value if isinstance(value, Field) else Field(value, MISSING, True, True)
        f.name = name
        if isinstance(value, Field):
            if f.default is MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, f.default)
        if isinstance(f.default, (list, dict, set)):
            raise ValueError(f"mutable default {type(f.default)} for field {name} is not allowed: use default_factory")
        found[name] = f
    seen_default = False
    for f in found.values():
        if f.default is MISSING and f.default_factory is MISSING:
            if seen_default:
                raise TypeError(f"non-default argument {f.name!r} follows default argument")
        else:
            seen_default = True
    return tuple(found.values())


def _make_init(cls: type, all_fields: tuple[Field, ...], frozen: bool) -> Any:
    """``__init__`` for ``all_fields``, written once: real parameters, defaults and factories."""
    scope: dict[str, Any] = {"MISSING": MISSING, "_setattr": object.__setattr__}
    params, body = [], []
    for f in all_fields:
        if f.default is not MISSING:
            scope[f"_d_{f.name}"] = f.default
            params.append(f"{f.name}=_d_{f.name}")
            value = f.name
        elif f.default_factory is not MISSING:
            scope[f"_f_{f.name}"] = f.default_factory
            params.append(f"{f.name}=MISSING")
            value = f"_f_{f.name}() if {f.name} is MISSING else {f.name}"
        else:
            params.append(f.name)
            value = f.name
        body.append(f"_setattr(self, {f.name!r}, {value})" if frozen else f"self.{f.name} = {value}")
    if hasattr(cls, "__post_init__"):
        body.append("self.__post_init__()")
    source = f"def __init__(self, {', '.join(params)}):\n    " + "\n    ".join(body or ["pass"]) + "\n"
    exec(source, scope)  # the source is built above from field names, which are identifiers
    init = scope["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    return init


def _values(obj: Any) -> tuple[Any, ...]:
    return tuple(getattr(obj, f.name) for f in obj.__plaindata_compared__)


def _repr(self: Any) -> str:
    shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in getattr(self, _FIELDS) if f.repr)
    return f"{self.__class__.__qualname__}({shown})"


def _eq(self: Any, other: object) -> Any:
    if other.__class__ is self.__class__:
        return _values(self) == _values(other)
    return NotImplemented


def _hash(self: Any) -> int:
    return hash(_values(self))


def _order(compare: Callable[[tuple[Any, ...], tuple[Any, ...]], bool]) -> Callable[[Any, Any], Any]:
    def method(self: Any, other: Any) -> Any:
        if other.__class__ is self.__class__:
            return compare(_values(self), _values(other))
        return NotImplemented

    return method


def _frozen_setattr(self: Any, name: str, value: Any) -> None:
    raise FrozenInstanceError(f"cannot assign to field {name!r}")


def _frozen_delattr(self: Any, name: str) -> None:
    raise FrozenInstanceError(f"cannot delete field {name!r}")


def _getstate(self: Any) -> list[Any]:
    return [getattr(self, f.name) for f in getattr(self, _FIELDS)]


def _setstate(self: Any, state: list[Any]) -> None:
    # pickle restores a slotted object's state with setattr, which a frozen class refuses
    for f, value in zip(getattr(self, _FIELDS), state, strict=True):
        object.__setattr__(self, f.name, value)


_ORDER = {
    "__lt__": _order(lambda a, b: a < b),
    "__le__": _order(lambda a, b: a <= b),
    "__gt__": _order(lambda a, b: a > b),
    "__ge__": _order(lambda a, b: a >= b),
}


def _process(cls: type[_T], frozen: bool, order: bool, slots: bool) -> type[_T]:
    all_fields = _collect(cls)
    if slots:
        names = tuple(f.name for f in all_fields if f.name not in {n for b in cls.__mro__[1:]
                                                                  for n in getattr(b, "__slots__", ())})
        body = {k: v for k, v in cls.__dict__.items() if k not in (*names, "__dict__", "__weakref__")}
        body["__slots__"] = names
        qualname = cls.__qualname__
        cls = type(cls.__name__, cls.__bases__, body)
        cls.__qualname__ = qualname
    own = cls.__dict__
    # dataclasses' rules: a method the class writes itself is kept; eq=True makes a frozen class
    # hashable by value and any other unhashable, unless the class wrote its own __hash__ (a class
    # body that defines __eq__ gets __hash__ = None from Python: that one is not "its own").
    explicit_hash = "__hash__" in own and not (own["__hash__"] is None and "__eq__" in own)
    methods: dict[str, Any] = {
        "__init__": _make_init(cls, all_fields, frozen),
        "__repr__": _repr,
        "__eq__": _eq,
        **(_ORDER if order else {}),
    }
    for name, method in methods.items():
        if name not in own:
            setattr(cls, name, method)
    extra: dict[str, Any] = {
        _FIELDS: all_fields,
        "__plaindata_compared__": tuple(f for f in all_fields if f.compare),
        "__match_args__": tuple(f.name for f in all_fields),
    }
    if not explicit_hash:
        extra["__hash__"] = _hash if frozen else None
    if frozen:
        extra.update(__setattr__=_frozen_setattr, __delattr__=_frozen_delattr)
    if slots:  # as dataclasses does for slots=True: picklable, frozen or not
        for name, method in (("__getstate__", _getstate), ("__setstate__", _setstate)):
            if name not in own:
                extra[name] = method
    for name, value in extra.items():
        setattr(cls, name, value)
    return cls


@dataclass_transform(field_specifiers=(field,))
def dataclass(
    cls: type[_T] | None = None, /, *, frozen: bool = False, order: bool = False, slots: bool = False
) -> Any:
    """``dataclasses.dataclass`` for netplugin's types (see the module's docstring for the subset)."""

    def wrap(c: type[_T]) -> type[_T]:
        return _process(c, frozen, order, slots)

    return wrap if cls is None else wrap(cls)
