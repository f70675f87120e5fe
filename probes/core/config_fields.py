"""Config sections declared once: each is a frozen dataclass whose fields carry their JSON key,
parser, default and doc, and the key tuples, parsing, ``to_dict`` and call signatures are read off
it. A key written in four places drifts (a key parsed but not written back breaks the summary's
round trip); a key written once cannot.

A parser is called as ``parse(dotted_key, value, field)``: it gets the field so that its error
can name the default and quote the field's doc as the hint. This module imports no framework.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable

from probes.core.hints import did_you_mean

__all__ = [
    "Field",
    "Parser",
    "fields_of",
    "is_int",
    "keys_of",
    "one_of",
    "option",
    "parse_fields",
    "section_to_dict",
    "signature_of",
    "suggest",
    "type_name",
]

_METADATA_KEY = "probes.config_field"

Parser = Callable[[str, object, "Field"], Any]


@dataclass(frozen=True)
class Field:
    """One config key: how it is spelled in JSON, how a value is checked, what it defaults to."""

    key: str
    parse: Parser
    default: Any
    doc: str
    #: our key, not msprobe's: msprobe's files never hold it (the docs' msprobe examples leave it out)
    extension: bool = False
    #: False: ``to_dict`` leaves the key out at its default, so a config without it round-trips to
    #: exactly msprobe's keys
    write_default: bool = True

    @property
    def choices(self) -> tuple[str, ...]:
        """The allowed values of an enumerated key (empty for other keys), for errors and docs."""
        return tuple(getattr(self.parse, "allowed", ()))


def option(
    key: str,
    parse: Parser,
    default: Any = dataclasses.MISSING,
    doc: str = "",
    *,
    extension: bool = False,
    write_default: bool = True,
) -> Any:
    """A dataclass field that is also a config key. No default: the key is required (its parser
    sees None and says so). Typed ``Any`` so that the attribute keeps its declared type."""
    meta = Field(key, parse, None if default is dataclasses.MISSING else default, doc, extension, write_default)
    if default is dataclasses.MISSING:
        return dataclasses.field(metadata={_METADATA_KEY: meta})
    return dataclasses.field(default=default, metadata={_METADATA_KEY: meta})


def fields_of(cls: type) -> tuple[tuple[str, Field], ...]:
    """``(attribute name, Field)`` of every config key of ``cls``, in declaration order."""
    return tuple((f.name, f.metadata[_METADATA_KEY]) for f in dataclasses.fields(cls) if _METADATA_KEY in f.metadata)


def keys_of(cls: type, *, extension: bool | None = None) -> tuple[str, ...]:
    """The JSON keys of ``cls``; ``extension`` True / False keeps only ours / only msprobe's."""
    return tuple(f.key for _, f in fields_of(cls) if extension is None or f.extension == extension)


def parse_fields(cls: type, raw: Mapping[Any, Any], prefix: str = "") -> dict[str, Any]:
    """Every key of ``cls`` parsed from ``raw`` (a missing key is None), by attribute name, in
    declaration order, so the first bad key in the table is the one reported."""
    return {name: f.parse(prefix + f.key, raw.get(f.key), f) for name, f in fields_of(cls)}


def section_to_dict(obj: Any) -> dict[str, Any]:
    """The config keys of a section instance as JSON data, so it can be fed back to its parser."""
    out: dict[str, Any] = {}
    for name, f in fields_of(type(obj)):
        value = getattr(obj, name)
        if not f.write_default and value == f.default:
            continue
        out[f.key] = _json_value(value)
    return out


def signature_of(cls: type) -> inspect.Signature:
    """A call signature with one parameter per key (positional or keyword, the table's defaults),
    for a constructor whose arguments are the table: help() and binding then match it."""
    params = []
    for f in dataclasses.fields(cls):
        meta = f.metadata.get(_METADATA_KEY)
        if meta is not None:
            default = inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default
            params.append(inspect.Parameter(meta.key, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default))
    return inspect.Signature(params)


def _json_value(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_json_value(v) for v in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return value


# --------------------------------------------------------------------------------------------------
# the words of every error message


def is_int(value: object) -> bool:
    """A real int: JSON true/false arrive as bool, which is an int subclass, and must not count."""
    return isinstance(value, int) and not isinstance(value, bool)


def type_name(value: object) -> str:
    """JSON-flavoured type names, because users write JSON, not Python."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "list"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


def suggest(value: object, allowed: tuple[str, ...]) -> str:
    """The hint of a config error: one suggestion, since a key or a choice has one right spelling."""
    return did_you_mean(value, allowed, n=1) if isinstance(value, str) else ""


def one_of(allowed: tuple[str, ...]) -> str:
    return "one of " + ", ".join(f'"{a}"' for a in allowed)
