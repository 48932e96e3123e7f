"""The one config reader: every stage's config section is a frozen dataclass read by :func:`read`.

A section's dataclass holds its defaults (the YAML groups in ``conf/`` list the same values; the
tests compare them), and each field says how a configured value is checked: by the parser in its
metadata (:func:`opt`, with the parsers below) or, without one, by its type hint (``int``,
``float``, ``bool``, ``str``, ``X | None``, ``tuple[X, ...]``, ``list[X]``, a nested section's
dataclass, ``dict``). :func:`read` refuses an unknown key and a value of the wrong type or range
in one line that names ``<section>.<key>``::

    features.bogus: unknown setting; known: append, delta_order, dither, ...
    trainer.learners='four': expected an integer >= 1

and checks across keys are the dataclass's ``__post_init__`` (raising
:class:`asrtrain.AsrtrainError` through :func:`bad`). This module is in the base layer
(docs/architecture.md, "Layers"): it imports nothing of the package but :mod:`asrtrain`, and
neither torch nor omegaconf, so a recipe is checked before any stage runs.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import field
from typing import Any, TypeVar

from asrtrain import AsrtrainError

Parse = Callable[[str, Any], Any]
_C = TypeVar("_C")


def bad(key: str, value: Any, expected: str) -> AsrtrainError:
    """The error for ``key``'s ``value``: ``<key>=<value>: expected <expected>``."""
    return AsrtrainError(f"{key}={value!r}: expected {expected}")


def integer(low: int | None = None) -> Parse:
    """An int (not a bool) of at least ``low``."""
    expected = "an integer" + (f" >= {low}" if low is not None else "")

    def parse(key: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad(key, value, expected)
        if low is not None and value < low:
            raise bad(key, value, expected)
        return value
    return parse


def number(low: float | None = None, high: float | None = None,
           low_open: bool = False) -> Parse:
    """A finite int or float, as a float, within ``low`` (excluded when ``low_open``) and
    ``high``."""
    bounds = []
    if low is not None:
        bounds.append(f"> {low:g}" if low_open else f">= {low:g}")
    if high is not None:
        bounds.append(f"<= {high:g}")
    expected = "a number" + (" " + " and ".join(bounds) if bounds else "")

    def parse(key: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise bad(key, value, expected)
        value = float(value)
        if not math.isfinite(value):  # NaN compares false with every bound: refused by name
            raise bad(key, value, "a finite " + expected[2:])
        if low is not None and (value < low or (low_open and value == low)):
            raise bad(key, value, expected)
        if high is not None and value > high:
            raise bad(key, value, expected)
        return value
    return parse


def boolean(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise bad(key, value, "true or false")
    return value


def text(key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise bad(key, value, "a string")
    return value


def choice(*names: str, known: Callable[[], tuple[str, ...]] | None = None) -> Parse:
    """One of ``names`` (or of ``known()``, asked when a value is checked)."""
    def parse(key: str, value: Any) -> str:
        allowed = known() if known is not None else names
        if value not in allowed:
            raise bad(key, value, "one of " + ", ".join(allowed))
        return str(value)
    return parse


def optional(parse: Parse) -> Parse:
    """``parse``, or None for None."""
    def parse_optional(key: str, value: Any) -> Any:
        return None if value is None else parse(key, value)
    return parse_optional


def sequence(parse: Parse, kind: type = tuple, least: int = 0) -> Parse:
    """A list of values each checked by ``parse``, as a ``kind`` (tuple or list) of at least
    ``least`` items."""
    def parse_list(key: str, value: Any) -> Any:
        if isinstance(value, str | bytes | Mapping) or not hasattr(value, "__iter__"):
            raise bad(key, value, "a list")
        items = kind(parse(f"{key}[{i}]", v) for i, v in enumerate(value))
        if len(items) < least:
            raise bad(key, list(value), f"a list of at least {least}")
        return items
    return parse_list


def mapping(key: str, value: Any) -> dict | None:
    """A mapping (its values checked by the section's own code), or None."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise bad(key, value, "a mapping")
    return dict(value)


def opt(default: Any, parse: Parse) -> Any:
    """A field with its default and the parser that checks a configured value."""
    if isinstance(default, list | dict):
        return field(default_factory=lambda: type(default)(default), metadata={"parse": parse})
    return field(default=default, metadata={"parse": parse})


def _from_hint(hint: Any) -> Parse:
    """The parser a type hint implies (fields without one of their own)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return optional(_from_hint(rest[0]))
    if origin in (tuple, list):
        return sequence(_from_hint(args[0]), origin)
    if origin is dict or hint is dict:
        return mapping
    if dataclasses.is_dataclass(hint):
        return lambda key, value: read(hint, value, key)
    simple = {int: integer(), float: number(), bool: boolean, str: text}
    if hint in simple:
        return simple[hint]
    raise TypeError(f"no parser for type {hint!r}: give the field one with settings.opt")


def read(cls: type[_C], cfg: Mapping | _C | None, section: str) -> _C:
    """The ``cls`` section of a config: the defaults for the keys ``cfg`` lacks, every given
    value checked. ``section`` is the section's dotted name, used in every error
    (``hybrid.decode``, ``align.passes.tri2``). ``cfg`` may be a mapping (an omegaconf node
    too), None (all defaults) or already a ``cls``.

    Raises:
        AsrtrainError: one line naming ``<section>.<key>``: an unknown key (with the known
            ones), a value of the wrong type or range, or a check across keys.
    """
    if isinstance(cfg, cls):
        return cfg
    return cls(**read_values(cls, cfg, section))


def read_values(cls: type, cfg: Mapping | None, section: str) -> dict[str, Any]:
    """The checked values of the keys ``cfg`` gives (no defaults, no checks across keys): for a
    partial section that overrides another (``hybrid.trainer`` over ``trainer``)."""
    if cfg is None:
        return {}
    if not isinstance(cfg, Mapping) and not hasattr(cfg, "items"):
        raise bad(section, cfg, "a mapping of " + ", ".join(f.name for f in
                                                             dataclasses.fields(cls)))
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for key, value in dict(cfg.items()).items():
        if key not in fields:
            raise AsrtrainError(f"{section}.{key}: unknown setting; known: "
                                f"{', '.join(sorted(fields))}")
        parse = fields[key].metadata.get("parse") or _from_hint(hints[key])
        values[key] = parse(f"{section}.{key}", value)
    return values


def defaults(cls: type) -> dict[str, Any]:
    """``cls``'s defaults as a YAML group lists them (tuples as lists, nested sections as
    mappings): what ``tests/test_settings.py`` compares with ``conf/``."""
    return _plain(dataclasses.asdict(cls()))


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def check(ok: bool, message: str) -> None:
    """Raise ``message`` as an AsrtrainError unless ``ok`` (a ``__post_init__``'s checks)."""
    if not ok:
        raise AsrtrainError(message)
