"""Strict conversion between nested config dataclasses and plain dicts, YAML files and dotted overrides.

Configs are typed dataclasses validated in ``__post_init__``; files and command lines give plain data.
``from_dict`` builds the dataclass through its constructor (so its validation runs) and fails loudly:
an unknown key lists the valid keys and suggests the closest one, a wrongly typed value names its
dotted key and the expected type. Supported annotations: ``int``, ``float`` (ints accepted), ``bool``,
``str``, ``X | None`` and other unions, ``Literal[...]``, nested dataclasses, ``list[X]``,
``tuple[X, ...]``, ``tuple[X, Y]``, ``dict[str, X]``, ``Any``, and classes that convert themselves
(``to_plain()`` / ``from_plain(data, path)``, the model section); string annotations
(``from __future__ import annotations``) are resolved with ``typing.get_type_hints``.

YAML is read with PyYAML's safe loader plus one YAML 1.2 rule: ``5e-4`` and ``1e9`` are floats
(YAML 1.1, and so plain ``yaml.safe_load``, reads them as strings).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import os
import re
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

import yaml

from aiayn.checkpoint.atomic_io import atomic_write_bytes
from aiayn.untrusted import MAX_CONFIG_BYTES, parse_yaml, read_untrusted_bytes
from aiayn.validation import check_known_keys

__all__ = ["to_dict", "from_dict", "convert_value", "read_yaml", "load_yaml", "save_yaml", "apply_overrides", "parse_yaml_value"]

T = TypeVar("T")


class _Loader(yaml.SafeLoader):
    """Safe loader that reads exponent-only floats (``5e-4``, ``1E9``) as floats, as YAML 1.2 does."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+.0123456789"),
)


def parse_yaml_value(text: str, source: str | None = None) -> Any:
    """Parse ``text`` with the safe YAML loader of this module, bounded (:func:`aiayn.untrusted.parse_yaml`:
    depth, alias expansion); ``ValueError`` naming ``source`` (default: the text) if it is not valid YAML."""
    return parse_yaml(text, source, loader=_Loader)


# --------------------------------------------------------------------------- dataclass -> plain data


def to_dict(obj: Any) -> dict[str, Any]:
    """A dataclass instance -> nested plain dict (tuples become lists) that YAML and JSON can hold."""
    if not (dataclasses.is_dataclass(obj) and not isinstance(obj, type)):
        raise TypeError(f"to_dict expects a dataclass instance, got {type(obj).__name__}")
    return _plain(obj, "")


def _plain(value: Any, path: str) -> Any:
    if _is_plain_section(type(value)):
        return _plain(value.to_plain(), path)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name), _join(path, f.name)) for f in _init_fields(type(value))}
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        for key in value:
            if not isinstance(key, str):
                raise TypeError(f"{path or 'value'}: dict keys must be str, got {key!r} ({type(key).__name__})")
        return {k: _plain(v, _join(path, k)) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(
        f"{path or 'value'}: cannot convert {type(value).__name__} to plain data; expected a dataclass, "
        "list, tuple, dict, int, float, bool, str or None"
    )


# --------------------------------------------------------------------------- plain data -> dataclass


def from_dict(cls: type[T], data: Mapping[str, Any], *, path: str = "") -> T:
    """Build dataclass ``cls`` from plain ``data``, checking every key and type (``path`` prefixes errors).

    Raises ``ValueError`` for an unknown or missing key and for a ``Literal`` value outside its set,
    ``TypeError`` for a value of the wrong type; errors raised by ``cls.__post_init__`` for a nested
    config are re-raised with the dotted ``path`` in front.
    """
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"from_dict expects a dataclass type, got {cls!r}")
    if not isinstance(data, Mapping):
        raise TypeError(
            f"{path or cls.__name__}: expected a mapping of {cls.__name__} fields, got {_short(data)} "
            f"({type(data).__name__})"
        )
    hints = _type_hints(cls)
    fields = _init_fields(cls)
    check_known_keys(data, [f.name for f in fields], owner=cls.__name__, path=path)
    kwargs: dict[str, Any] = {}
    for f in fields:
        dotted = _join(path, f.name)
        if f.name in data:
            kwargs[f.name] = _convert(data[f.name], hints[f.name], dotted)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ValueError(f"missing required key {dotted!r} for {cls.__name__}")
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as e:
        if not path or type(e) not in (ValueError, TypeError):
            raise
        raise type(e)(f"{path}: {e}") from e


def convert_value(value: Any, tp: Any, path: str) -> Any:
    """Check plain ``value`` against the annotation ``tp`` (as ``from_dict`` does for a field at ``path``)."""
    return _convert(value, tp, path)


def _convert(value: Any, tp: Any, path: str) -> Any:
    """Check ``value`` against annotation ``tp`` and return it in the annotated form."""
    if tp is Any:
        return value
    if tp is type(None):
        if value is None:
            return None
        raise _type_error(path, tp, value)
    origin, args = get_origin(tp), get_args(tp)
    if origin is Union or origin is types.UnionType:
        return _convert_union(value, tp, args, path)
    if origin is Literal:
        if any(value == a and type(value) is type(a) for a in args):
            return value
        allowed = ", ".join(repr(a) for a in args)
        close = difflib.get_close_matches(str(value), [str(a) for a in args], n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"{path}: expected one of {allowed}, got {_short(value)}{hint}")
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if isinstance(value, Mapping):
            return from_dict(tp, value, path=path)
        raise _type_error(path, tp, value)
    if _is_plain_section(tp):
        return value if isinstance(value, tp) else tp.from_plain(value, path)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _type_error(path, tp, value)
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _type_error(path, tp, value)
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):  # .nan/.inf never make a sensible learning rate, penalty, ...
                raise ValueError(f"{path}: expected a finite number, got {value!r}")
            return float(value)
        raise _type_error(path, tp, value)
    if tp is str:
        if isinstance(value, str):
            return value
        raise _type_error(path, tp, value)
    if origin is list or tp is list:
        if not isinstance(value, (list, tuple)):
            raise _type_error(path, tp, value)
        item = args[0] if args else Any
        return [_convert(v, item, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is tuple or tp is tuple:
        return _convert_tuple(value, tp, args, path)
    if origin is dict or tp is dict:
        return _convert_dict(value, tp, args, path)
    if isinstance(tp, type):
        if isinstance(value, tp):
            return value
        raise _type_error(path, tp, value)
    raise TypeError(f"{path}: unsupported annotation {_type_name(tp)}")


def _convert_union(value: Any, tp: Any, args: tuple[Any, ...], path: str) -> Any:
    if value is None:
        if type(None) in args:
            return None
        raise _type_error(path, tp, value)
    options = [a for a in args if a is not type(None)]
    if len(options) == 1:  # X | None: keep X's own, more precise, error
        return _convert(value, options[0], path)
    for option in options:
        try:
            return _convert(value, option, path)
        except (TypeError, ValueError):
            continue
    raise _type_error(path, tp, value)


def _convert_tuple(value: Any, tp: Any, args: tuple[Any, ...], path: str) -> tuple[Any, ...]:
    if not isinstance(value, (list, tuple)):
        raise _type_error(path, tp, value)
    if not args or (len(args) == 2 and args[1] is Ellipsis):
        item = args[0] if args else Any
        return tuple(_convert(v, item, f"{path}[{i}]") for i, v in enumerate(value))
    if len(value) != len(args):
        raise TypeError(
            f"{path}: expected {_type_name(tp)} ({len(args)} items), got {len(value)} items: {_short(value)}"
        )
    return tuple(_convert(v, a, f"{path}[{i}]") for i, (v, a) in enumerate(zip(value, args)))


def _convert_dict(value: Any, tp: Any, args: tuple[Any, ...], path: str) -> dict[str, Any]:
    if args and args[0] is not str:
        raise TypeError(f"{path}: unsupported annotation {_type_name(tp)}; dict keys must be str")
    if not isinstance(value, Mapping):
        raise _type_error(path, tp, value)
    item = args[1] if args else Any
    out: dict[str, Any] = {}
    for key, v in value.items():
        if not isinstance(key, str):
            raise TypeError(f"{path}: dict keys must be str, got {key!r} ({type(key).__name__})")
        out[key] = _convert(v, item, _join(path, key))
    return out


# --------------------------------------------------------------------------- files and overrides


def read_yaml(path: str | os.PathLike[str]) -> Any:
    """The plain value of a YAML config file (bounded in size, depth and aliases); ``ValueError`` naming the file
    when it is not UTF-8 or not valid YAML."""
    raw = read_untrusted_bytes(path, max_bytes=MAX_CONFIG_BYTES, what="config file")
    try:
        return parse_yaml_value(raw.decode("utf-8"), str(path))
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: the config file is not UTF-8 text ({e})") from None


def load_yaml(path: str | os.PathLike[str], cls: type[T]) -> T:
    """Read a YAML file into dataclass ``cls``; every error names the file and the dotted key."""
    data = read_yaml(path)
    if data is None:  # an empty file is a mistake (a wrong path, a truncated copy), never "all defaults"
        raise ValueError(f"{path}: the config file is empty; write at least the keys that differ from the defaults")
    if not isinstance(data, Mapping):
        raise TypeError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return from_dict(cls, data)
    except (ValueError, TypeError) as e:
        if type(e) not in (ValueError, TypeError):
            raise
        raise type(e)(f"{path}: {e}") from e


def save_yaml(obj: Any, path: str | os.PathLike[str]) -> None:
    """Write dataclass ``obj`` as YAML, atomically (a crash leaves the old file or the new one)."""
    text = yaml.safe_dump(to_dict(obj), sort_keys=False, default_flow_style=False, allow_unicode=True)
    atomic_write_bytes(path, text.encode("utf-8"))


def apply_overrides(obj: T, overrides: Sequence[str]) -> T:
    """A copy of dataclass ``obj`` with ``"dotted.key=value"`` overrides applied (later ones win).

    Values are parsed as YAML (``5e-4`` is a float, ``[1, 2]`` a list) and type-checked like
    ``from_dict``; a field annotated ``str`` takes the text as written (``name=1.0`` stays ``"1.0"``).
    Raises ``ValueError`` for a malformed override or an unknown key (listing the valid keys at that
    level and the closest one), ``TypeError`` for a wrongly typed value.
    """
    if isinstance(overrides, str):
        raise TypeError(f"overrides must be a sequence of 'key=value' strings, got the single string {overrides!r}")
    cls = type(obj)
    data = to_dict(obj)
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"override {item!r} must have the form 'dotted.key=value'")
        tp, container, leaf = _resolve_key(cls, data, key)
        try:
            value = parse_yaml_value(text)
        except ValueError as e:
            raise ValueError(f"override {key!r}: {e}") from e
        if _accepts_str(tp) and value is not None and not isinstance(value, str):
            value = text
        container[leaf] = value
    return from_dict(cls, data)


def _resolve_key(cls: type[Any], data: dict[str, Any], key: str) -> tuple[Any, dict[str, Any], str]:
    """Walk ``key``'s dotted parts through nested dataclasses: (annotation, containing dict, last part)."""
    *sections, leaf = key.split(".")
    prefix = ""
    for i, part in enumerate(sections):
        tp = _field_type(cls, part, prefix)
        if _is_plain_section(tp) and i == len(sections) - 1:  # its keys are checked by the section itself
            if not isinstance(data.get(part), dict):
                data[part] = {}
            return Any, data[part], leaf
        section = _dataclass_of(tp)
        if section is None:
            raise ValueError(
                f"override key {key!r}: {_join(prefix, part)!r} is a {_type_name(tp)}, not a config section"
            )
        if not isinstance(data.get(part), dict):  # an unset optional section starts from its defaults
            data[part] = {}
        data, cls, prefix = data[part], section, _join(prefix, part)
    return _field_type(cls, leaf, prefix), data, leaf


def _field_type(cls: type[Any], name: str, prefix: str) -> Any:
    """The annotation of field ``name`` of ``cls``; ``ValueError`` naming the valid keys if there is none."""
    check_known_keys([name], [f.name for f in _init_fields(cls)], owner=cls.__name__, path=prefix)
    return _type_hints(cls)[name]  # type: ignore[arg-type]  # a class is hashable; typeshed cannot tell for type[Any]


# --------------------------------------------------------------------------- helpers


def _is_plain_section(tp: Any) -> bool:
    """A config section that is not a dataclass but converts itself (``to_plain`` / ``from_plain``),
    e.g. the model section, whose keys are a preset's fields and whose absent keys mean "unchanged"."""
    return isinstance(tp, type) and hasattr(tp, "from_plain") and hasattr(tp, "to_plain")


@functools.cache
def _type_hints(cls: type[Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except NameError as e:
        raise TypeError(
            f"cannot resolve the annotations of {cls.__qualname__}: {e}; "
            "define it and the types it uses at module level"
        ) from e


def _init_fields(cls: type[Any]) -> list[dataclasses.Field[Any]]:
    return [f for f in dataclasses.fields(cls) if f.init]


def _dataclass_of(tp: Any) -> type[Any] | None:
    """The dataclass in annotation ``tp`` (``C`` or ``C | None``), or None."""
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return tp
    if get_origin(tp) is Union or get_origin(tp) is types.UnionType:
        found = [_dataclass_of(a) for a in get_args(tp) if a is not type(None)]
        if len(found) == 1:
            return found[0]
    return None


def _accepts_str(tp: Any) -> bool:
    if tp is str:
        return True
    if get_origin(tp) is Union or get_origin(tp) is types.UnionType:
        return str in get_args(tp)
    return False


def _type_error(path: str, tp: Any, value: Any) -> TypeError:
    return TypeError(f"{path}: expected {_type_name(tp)}, got {_short(value)} ({type(value).__name__})")


def _type_name(tp: Any) -> str:
    if tp is type(None):
        return "None"
    if isinstance(tp, type) and not get_args(tp):
        return tp.__name__
    return repr(tp).replace("typing.", "")


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key
