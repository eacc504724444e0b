"""Frozen dataclasses <-> plain JSON values, driven by the type hints (pure); every JSON numarun reads goes
through :func:`loads`, which bounds the nesting depth."""

from __future__ import annotations

import dataclasses
import enum
import json
import types
import typing
from typing import Any, TypeVar

from .errors import SchemaError

T = TypeVar("T")

MAX_DEPTH = 64  # numarun's own files nest 5 levels; recursive readers fail near 1,000


def loads(text: str | bytes, *, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads`` whose nesting deeper than ``max_depth`` is a :class:`json.JSONDecodeError`, never a
    RecursionError."""
    try:
        data = json.loads(text)
        too_deep = _deeper_than(data, max_depth)
    except RecursionError:
        too_deep = True
    if too_deep:
        raise json.JSONDecodeError(f"nested deeper than {max_depth} levels", text if isinstance(text, str) else "", 0)
    return data


def _deeper_than(data: Any, limit: int) -> bool:
    stack = [(data, 1)]  # iterative: the check itself must not recurse
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))
    return False


def to_jsonable(obj: Any) -> Any:
    """Dataclass/Enum/tuple/dict tree -> dicts, lists, str, int, float, bool, None."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (tuple, list)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    return obj


def from_jsonable(cls: type[T], data: Any, path: str = "$") -> T:
    """Inverse of :func:`to_jsonable` for dataclass ``cls``; unknown keys are ignored."""
    return _convert(cls, data, path)


def _convert(tp: Any, data: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    if tp is Any:
        return data
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if data is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(arg, data, path)
            except SchemaError as e:
                errors.append(str(e))
        raise SchemaError(errors[0] if errors else f"{path}: unexpected null")
    if dataclasses.is_dataclass(tp):
        if not isinstance(data, dict):
            raise SchemaError(f"{path}: expected an object, got {type(data).__name__}")
        hints = typing.get_type_hints(tp)
        kwargs = {}
        for f in dataclasses.fields(tp):
            if not f.init:
                continue
            if f.name in data:
                kwargs[f.name] = _convert(hints[f.name], data[f.name], f"{path}.{f.name}")
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise SchemaError(f"{path}: missing key {f.name!r}")
        return tp(**kwargs)  # type: ignore[operator]  # is_dataclass also admits instances; tp is always a class here
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(data)
        except ValueError:
            raise SchemaError(f"{path}: {data!r} is not one of {[m.value for m in tp]}") from None
    if origin is tuple:
        if not isinstance(data, list):
            raise SchemaError(f"{path}: expected a list, got {type(data).__name__}")
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v, f"{path}[{i}]") for i, v in enumerate(data))
        if len(args) != len(data):
            raise SchemaError(f"{path}: expected {len(args)} items, got {len(data)}")
        return tuple(_convert(a, v, f"{path}[{i}]") for i, (a, v) in enumerate(zip(args, data)))
    if origin is dict:
        if not isinstance(data, dict):
            raise SchemaError(f"{path}: expected an object, got {type(data).__name__}")
        _, vt = typing.get_args(tp)
        return {str(k): _convert(vt, v, f"{path}.{k}") for k, v in data.items()}
    if tp is float:
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            raise SchemaError(f"{path}: expected a number, got {data!r}")
        return float(data)
    if tp in (int, str, bool):
        if type(data) is not tp:
            raise SchemaError(f"{path}: expected {tp.__name__}, got {data!r}")
        return data
    raise SchemaError(f"{path}: unsupported type {tp!r}")
