"""Plain TOML data to the typed sections: each value converted by its field's type (a table to
its dataclass, arrays, literals, numbers, booleans, strings; an override's string by the same
rules), every problem recorded under its key path (unknown keys included), and a well-typed
stand-in put where a value failed, so every other key is still checked."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal

from gateway.config.key_paths import key_path
from gateway.config.overrides import EnvValue, parse_env_list

#: a value that could not be converted (its problem already recorded)
MISSING = object()


def build(tp: Any, value: Any, path: str, errors: list[str]) -> Any:
    """Convert plain TOML data to ``tp``; append ``path: message`` to ``errors`` on problems.

    Returns :data:`MISSING` for a value that could not be converted (already reported).
    """
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _build_table(tp, value, path, errors)
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return build(args[0], value, path, errors)
    if origin is tuple:
        return _build_array(typing.get_args(tp)[0], value, path, errors)
    if origin is Literal:
        allowed = typing.get_args(tp)
        if not isinstance(value, str) or value not in allowed:
            choices = ", ".join(repr(a) for a in allowed)
            errors.append(f"{path}: must be one of {choices}, got {_show(value)}")
            return MISSING
        return str(value)
    if tp is bool:
        return _build_bool(value, path, errors)
    if tp is int or tp is float:
        return _build_number(tp, value, path, errors)
    if tp is str:
        if not isinstance(value, str):
            errors.append(f"{path}: expected a string, got {_tname(value)}")
            return MISSING
        return str(value)
    raise TypeError(f"config type not handled: {tp!r}")  # pragma: no cover - programming error


def _build_table(tp: type[Any], value: Any, path: str, errors: list[str]) -> Any:
    if not isinstance(value, dict):
        errors.append(f"{path or '<root>'}: expected a table, got {_tname(value)}")
        return MISSING
    hints = typing.get_type_hints(tp)
    fields = {f.name: f for f in dataclasses.fields(tp) if f.name not in ("source", "explicit")}
    for key in value:
        if key not in fields:
            errors.append(f"{key_path(path, key)}: unknown key")
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        built = MISSING
        if name in value:
            built = build(hints[name], value[name], key_path(path, name), errors)
        elif required:
            errors.append(f"{key_path(path, name)}: required key is missing")
        if built is not MISSING:
            kwargs[name] = built
        elif required:
            # reported above: a well-typed stand-in keeps the other keys checkable
            kwargs[name] = _placeholder(hints[name])
    return tp(**kwargs)


def _placeholder(tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin is tuple:
        return ()
    if origin is Literal:
        return typing.get_args(tp)[0]
    if origin in (types.UnionType, typing.Union):
        return None
    return {str: "", int: 0, float: 0.0, bool: False}[tp]


def _build_array(item_tp: Any, value: Any, path: str, errors: list[str]) -> Any:
    if isinstance(value, EnvValue):
        value = parse_env_list(value)
    if not isinstance(value, list):
        errors.append(f"{path}: expected an array, got {_tname(value)}")
        return MISSING
    items = [build(item_tp, v, key_path(path, i), errors) for i, v in enumerate(value)]
    if all(item is not MISSING for item in items):
        return tuple(items)
    if dataclasses.is_dataclass(item_tp):
        # tables keep their index (later errors name the right one): a stand-in for the bad one
        return tuple(_stand_in(item_tp) if item is MISSING else item for item in items)
    return MISSING  # reported; the array takes its default (or a stand-in)


def _stand_in(tp: Any) -> Any:
    """A table of type ``tp`` with placeholder values for its required keys."""
    hints = typing.get_type_hints(tp)
    required = {
        f.name: _placeholder(hints[f.name])
        for f in dataclasses.fields(tp)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    return tp(**required)


def _build_bool(value: Any, path: str, errors: list[str]) -> Any:
    if isinstance(value, EnvValue):
        low = value.lower()
        if low in ("true", "1", "yes", "on"):
            return True
        if low in ("false", "0", "no", "off"):
            return False
    if not isinstance(value, bool):
        errors.append(f"{path}: expected true or false, got {_show(value)}")
        return MISSING
    return value


def _build_number(tp: type[int] | type[float], value: Any, path: str, errors: list[str]) -> Any:
    if isinstance(value, EnvValue):
        try:
            value = tp(value)
        except ValueError:
            errors.append(f"{path}: expected a number, got {str(value)!r}")
            return MISSING
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if tp is int and isinstance(value, float):
        ok = False
    if ok and tp is float and value != value:  # nan
        ok = False
    if not ok:
        what = "an integer" if tp is int else "a number"
        errors.append(f"{path}: expected {what}, got {_show(value)}")
        return MISSING
    return tp(value)


def _tname(value: Any) -> str:
    return {dict: "a table", list: "an array", str: "a string", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )


def _show(value: Any) -> str:
    """A value for an error message: short, and never a whole table."""
    if isinstance(value, dict | list):
        return _tname(value)
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


__all__ = ["MISSING", "build"]
