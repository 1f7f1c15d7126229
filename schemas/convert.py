"""Conversion between the record dataclasses and the plain dicts that fastavro and orjson speak.

Why not `dataclasses.asdict`: it deep-copies every value and is several times slower, and the
request path encodes one record per request. Each record class gets a converter pair built once from
its type hints; flat records (all fields primitive or lists of primitives) convert with a single
dict comprehension / `cls(**d)` call.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar, cast

__all__ = ["from_dict", "to_dict"]

T = TypeVar("T")

_ToDict = Callable[[Any], Any]
_FromDict = Callable[[Any], Any]


def _identity(value: Any) -> Any:
    return value


def _converters(annotation: Any) -> tuple[_ToDict, _FromDict] | None:
    """Converters for one field's type, or None when the value passes through unchanged."""
    origin = typing.get_origin(annotation)
    if dataclasses.is_dataclass(annotation) and isinstance(annotation, type):
        return _record_to_dict(annotation), _record_from_dict(annotation)
    if origin is list:
        (item,) = typing.get_args(annotation)
        inner = _converters(item)
        if inner is None:
            return None
        to_item, from_item = inner
        return (lambda v: [to_item(x) for x in v], lambda v: [from_item(x) for x in v])
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            inner = _converters(args[0])
            if inner is None:
                return None
            to_inner, from_inner = inner
            return (
                lambda v: None if v is None else to_inner(v),
                lambda v: None if v is None else from_inner(v),
            )
    return None


_TO_DICT: dict[type[Any], _ToDict] = {}
_FROM_DICT: dict[type[Any], _FromDict] = {}
"""Converters per record class, built on first use (a memo, not configuration)."""


def _field_converters(cls: type) -> tuple[tuple[str, ...], dict[str, tuple[_ToDict, _FromDict]]]:
    hints = typing.get_type_hints(cls)
    names = tuple(f.name for f in dataclasses.fields(cls))
    special: dict[str, tuple[_ToDict, _FromDict]] = {}
    for name in names:
        conv = _converters(hints[name])
        if conv is not None:
            special[name] = conv
    return names, special


def _record_to_dict(cls: type) -> _ToDict:
    conv = _TO_DICT.get(cls)
    if conv is None:
        names, special = _field_converters(cls)
        if not special:
            conv = lambda r: {n: getattr(r, n) for n in names}  # noqa: E731
        else:
            funcs = tuple((n, special[n][0] if n in special else _identity) for n in names)
            conv = lambda r: {n: f(getattr(r, n)) for n, f in funcs}  # noqa: E731
        _TO_DICT[cls] = conv
    return conv


def _record_from_dict(cls: type) -> _FromDict:
    conv = _FROM_DICT.get(cls)
    if conv is None:
        names, special = _field_converters(cls)
        if not special:
            conv = lambda d: cls(**d)  # noqa: E731
        else:
            funcs = tuple((n, special[n][1] if n in special else _identity) for n in names)
            conv = lambda d: cls(**{n: f(d[n]) for n, f in funcs if n in d})  # noqa: E731
        _FROM_DICT[cls] = conv
    return conv


def to_dict(record: object) -> dict[str, Any]:
    """A record dataclass as a plain dict (nested records become dicts)."""
    return cast(dict[str, Any], _record_to_dict(type(record))(record))


def from_dict(cls: type[T], data: dict[str, Any]) -> T:
    """Build a record dataclass from a plain dict (nested dicts become records)."""
    return cast(T, _record_from_dict(cls)(data))
