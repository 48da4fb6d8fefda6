"""A config group's content made into its schema's dataclass: by OmegaConf (`merged`: merged
onto the schema, every refusal a ConfigError naming the key and the value), or without it
(`plain_object`) where the result is exactly OmegaConf's: known keys only, each value of its
field's own type (an int where a float is asked becomes that float), nested dataclasses
merged onto their defaults, no interpolation, nothing missing; it builds no OmegaConf node.
Anything else it leaves to OmegaConf. Equal to OmegaConf's: tests/test_convert.py."""

from __future__ import annotations

import dataclasses
import types
from functools import cache
from typing import Any, Union, get_args, get_origin, get_type_hints

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from tasks.specs import ConfigError

__all__ = ["merged", "plain_object"]

MISSING = "???"  # OmegaConf reads this string as a missing value
SCALARS = (str, int, float, bool, type(None))


class _NotPlain(Exception):
    """This content needs OmegaConf."""


def merged(cfg: DictConfig, key: str, schema: type) -> Any:
    """The node `key` of `cfg` merged onto `schema` by OmegaConf, as a dataclass, or a ConfigError."""
    if key not in cfg or cfg[key] is None:
        raise ConfigError(f"config group '{key}' is missing; choose one from conf/{key}/")
    try:
        obj = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), cfg[key]))
    except ConfigKeyError as e:
        where = e.full_key or e.key  # a nested group's key in full: phase.capture.select
        parent = OmegaConf.select(OmegaConf.structured(schema), where.rpartition(".")[0]) if "." in where else None
        names = list(parent) if parent is not None else [f.name for f in dataclasses.fields(schema)]
        raise ConfigError(f"{key}.{where} is not a known key; allowed keys: {', '.join(names)}") from None
    except OmegaConfBaseException as e:
        where = e.full_key or e.key
        value = OmegaConf.select(cfg, f"{key}.{where}", default=None) if where else None
        msg = str(e).splitlines()[0]
        raise ConfigError(f"{key}.{where}={value!r}: {msg}") from None
    assert dataclasses.is_dataclass(obj)
    return obj


_Field = tuple[str, Any, bool, Any]  # name, type, has a default, its default_factory


@cache
def _fields(schema: type) -> tuple[_Field, ...] | None:
    """Each field of the dataclass `schema`; None when one is not an __init__ argument."""
    hints = get_type_hints(schema)
    out = []
    for f in dataclasses.fields(schema):
        if not f.init:
            return None
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        out.append((f.name, hints[f.name], has_default, f.default_factory))
    return tuple(out)


def plain_object(schema: type, data: Any) -> Any | None:
    """`schema(...)` from the plain dict `data`, as OmegaConf would make it; None when only
    OmegaConf can tell (a wrong type, an unknown key, a missing value, an interpolation)."""
    try:
        return _object(schema, data)
    except _NotPlain:
        return None


def _object(schema: type, data: Any) -> Any:
    spec = _fields(schema)
    if spec is None or type(data) is not dict or not set(data) <= {name for name, *_ in spec}:
        raise _NotPlain
    kwargs = {}
    for name, hint, has_default, factory in spec:
        if name in data:
            kwargs[name] = _value(hint, data[name], factory)
        elif not has_default:
            raise _NotPlain
    try:  # a __post_init__ that refuses: OmegaConf's path raises it in its own words
        return schema(**kwargs)
    except Exception:
        raise _NotPlain from None


def _value(hint: Any, v: Any, factory: Any = dataclasses.MISSING) -> Any:
    origin = get_origin(hint)
    if hint is Any:
        return _copy(v)
    if origin is Union or origin is types.UnionType:
        args = get_args(hint)
        if v is None and type(None) in args:
            return None
        rest = [a for a in args if a is not type(None)]
        if len(rest) != 1:
            raise _NotPlain
        return _value(rest[0], v, factory)
    if hint in (str, int, bool) and type(v) is hint:
        return _copy(v)  # a str: neither missing nor an interpolation
    if hint is float and type(v) in (float, int):
        return float(v)
    if origin is dict and factory in (dataclasses.MISSING, dict) and type(v) is dict and get_args(hint)[0] is str:
        # (a dict default with keys would be merged into, not replaced)
        if not all(type(k) is str for k in v):
            raise _NotPlain
        return {k: _value(get_args(hint)[1], x) for k, x in v.items()}
    if origin is list and type(v) is list:
        return [_value(get_args(hint)[0], x) for x in v]
    if dataclasses.is_dataclass(hint) and type(v) is dict and factory is hint:  # merged onto hint()'s defaults
        return _object(hint, v)
    raise _NotPlain


def _copy(v: Any) -> Any:
    """A copy of `v` made of dicts with str keys, lists and scalars, none of them a missing
    value or an interpolation; else _NotPlain."""
    if type(v) is str:
        if v == MISSING or "${" in v:
            raise _NotPlain
        return v
    if type(v) in SCALARS:
        return v
    if type(v) is dict and all(type(k) is str for k in v):
        return {k: _copy(x) for k, x in v.items()}
    if type(v) is list:
        return [_copy(x) for x in v]
    raise _NotPlain
