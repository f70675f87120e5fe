"""The value checks shared by the config tables, so the same kind of key fails with the same words
in every section. Each is a :data:`~probes.core.config_fields.Parser`.

Two flavours, because two kinds of caller write values: JSON parsers (:class:`Choice`,
:func:`boolean`, the ints, :class:`StrList`) treat null as "use the default" and name JSON types;
:class:`StrictChoice` is for Python arguments, where None is a value and is rejected.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from probes.core.config_fields import Field, is_int, one_of, suggest, type_name
from probes.core.errors import ConfigError

__all__ = [
    "INDEX_MAX",
    "Choice",
    "StrList",
    "StrictChoice",
    "boolean",
    "index_list",
    "non_negative_int",
    "parse_index_list",
    "positive_int",
]

#: Largest rank/step number and largest expanded list, as in the reference.
INDEX_MAX = 1_000_000

_RANGE_RE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")


@dataclass(frozen=True)
class Choice:
    """A JSON string that must be one of ``allowed``; null means the default."""

    allowed: tuple[str, ...]

    def __call__(self, key: str, value: object, field: Field) -> str:
        if value is None:
            return field.default  # type: ignore[no-any-return]
        if not isinstance(value, str):
            raise ConfigError(
                key, value, f"a string, {one_of(self.allowed)} (got a {type_name(value)})",
                hint=f'write "{field.default}"',
            )
        if value not in self.allowed:
            raise ConfigError(key, value, one_of(self.allowed), hint=suggest(value, self.allowed))
        return value


@dataclass(frozen=True)
class StrictChoice:
    """A Python argument that must be one of ``allowed`` (None too is rejected: it is a value).
    ``explain``: the hint is the field's doc (what each choice does) instead of a close match."""

    allowed: tuple[str, ...]
    explain: bool = False

    def __call__(self, key: str, value: object, field: Field) -> str:
        if not isinstance(value, str) or value not in self.allowed:
            hint = field.doc if self.explain else suggest(value, self.allowed)
            raise ConfigError(key, value, one_of(self.allowed), hint=hint)
        return value


def boolean(key: str, value: object, field: Field) -> bool:
    """A real JSON boolean; null means the default. Strings like "true" are rejected, as in the reference."""
    if value is None:
        return field.default  # type: ignore[no-any-return]
    if not isinstance(value, bool):
        hint = ""
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            hint = f"use JSON {value.strip().lower()} (without quotes)"
        raise ConfigError(key, value, f"true or false (got a {type_name(value)})", hint=hint)
    return value


def positive_int(key: str, value: object, field: Field) -> int:
    """An int > 0 that is not a bool; null means the default."""
    if value is None:
        return field.default  # type: ignore[no-any-return]
    if not is_int(value) or value <= 0:  # type: ignore[operator]
        raise ConfigError(key, value, f"an integer > 0 (not a boolean); the default is {field.default}")
    return value  # type: ignore[return-value]


def non_negative_int(key: str, value: object, field: Field) -> int:
    """An int >= 0 that is not a bool; null means the default."""
    if value is None:
        return field.default  # type: ignore[no-any-return]
    if not is_int(value) or value < 0:  # type: ignore[operator]
        raise ConfigError(key, value, f"an integer >= 0 (not a boolean); the default is {field.default}")
    return value  # type: ignore[return-value]


@dataclass(frozen=True)
class StrList:
    """A list of non-empty strings; null means ``()``. The words name what the strings are
    (API names, parameter names), because "a list of strings" does not say what to write."""

    noun: str = "API names"
    example: str = '["relu"]'
    item: str = "an API name"
    #: whether an all-blank string counts as empty (an API name never has spaces; a parameter
    #: name is matched exactly, whatever it holds)
    strip: bool = True

    def __call__(self, key: str, value: object, field: Field) -> tuple[str, ...]:
        if value is None:
            return ()
        if isinstance(value, str):
            raise ConfigError(
                key, value, f"a list of {self.noun}, not a single string", hint=f"write [{json.dumps(value)}]"
            )
        if not isinstance(value, (list, tuple)):
            raise ConfigError(
                key, value, f"a list of {self.noun} (got a {type_name(value)})", hint=f"write e.g. {self.example}"
            )
        for i, item in enumerate(value):
            if not isinstance(item, str) or not (item.strip() if self.strip else item):
                raise ConfigError(
                    f"{key}[{i}]", item, f"a non-empty string ({self.item}); {key} must be a list of strings"
                )
        return tuple(value)


def index_list(key: str, value: object, field: Field) -> tuple[int, ...]:
    """:func:`parse_index_list` as a table parser."""
    return parse_index_list(key, value)


def parse_index_list(key: str, value: object) -> tuple[int, ...]:
    """Parse msprobe's ``rank``/``step`` syntax into a sorted tuple of unique ints.

    Elements are ints in [0, 1_000_000] (booleans rejected) or ``"a-b"`` strings with a <= b,
    expanded inclusively. ``null`` means ``()`` (= all). A bare value where a list belongs is
    an error rather than being guessed at: ``"1"`` could mean [1] or a typo.
    """
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        if is_int(value):
            hint = f"write [{value}]"
        elif isinstance(value, str) and value.strip().isdigit():
            hint = f"write [{value.strip()}]"
        elif isinstance(value, str) and _RANGE_RE.match(value):
            hint = f"write [{json.dumps(value.strip())}]"
        else:
            hint = 'write e.g. [0, 1] or ["0-3"]'
        raise ConfigError(
            key, value, f'a list of integers and "a-b" ranges, not a {type_name(value)}', hint=hint
        )
    allowed = f'an integer in [0, {INDEX_MAX}] or a range string "a-b" with 0 <= a <= b <= {INDEX_MAX}'
    result: set[int] = set()
    for i, item in enumerate(value):
        item_key = f"{key}[{i}]"
        if is_int(item):
            if not 0 <= item <= INDEX_MAX:  # type: ignore[operator]
                raise ConfigError(item_key, item, allowed)
            result.add(item)  # type: ignore[arg-type]
        elif isinstance(item, str):
            m = _RANGE_RE.match(item)
            if m is None:
                hint = f"write {item.strip()} (a number, no quotes)" if item.strip().isdigit() else ""
                raise ConfigError(item_key, item, allowed, hint=hint)
            lo, hi = int(m.group(1)), int(m.group(2))
            if lo > hi:
                raise ConfigError(
                    item_key, item, f"{allowed}; the range is inverted", hint=f'write "{hi}-{lo}"'
                )
            if hi > INDEX_MAX:
                raise ConfigError(item_key, item, allowed)
            result.update(range(lo, hi + 1))
        else:
            raise ConfigError(item_key, item, f"{allowed} (got a {type_name(item)})")
        if len(result) > INDEX_MAX:
            raise ConfigError(key, value, f"at most {INDEX_MAX} entries once ranges are expanded")
    return tuple(sorted(result))
