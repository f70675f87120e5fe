"""Reading a config: the file or mapping, its task sections, and the warning for unknown keys.
Kept apart from the tables so that "where the data comes from" and "what it must hold" change
separately."""

from __future__ import annotations

import copy
import json
import os
import warnings
from collections.abc import Iterable, Mapping
from typing import Any, Union

from probes.core.config_fields import suggest, type_name
from probes.core.errors import ConfigError

__all__ = ["PathSource", "raw_section", "read_source", "warn_unknown"]

PathSource = Union[str, "os.PathLike[str]"]


def read_source(source: PathSource | Mapping[str, Any] | None) -> dict[Any, Any]:
    """Turn the ``source`` argument into a fresh dict (never aliasing the caller's mapping)."""
    if source is None:
        return {}
    if isinstance(source, Mapping):
        return copy.deepcopy(dict(source))
    if not isinstance(source, (str, os.PathLike)):
        raise ConfigError(
            "source", source, f"a path to a .json file, a mapping or None (got {type(source).__name__})"
        )
    path = os.fspath(source)
    if not isinstance(path, str):
        raise ConfigError("source", source, "a str path to a .json file")
    if not path.lower().endswith(".json"):
        raise ConfigError(
            "source", path, "a path to a .json config file", hint="rename the file to end in .json"
        )
    if not os.path.isfile(path):
        what = "a directory" if os.path.isdir(path) else "missing"
        raise ConfigError("source", path, f"an existing .json config file (this path is {what})")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("source", path, f"a readable UTF-8 .json file ({exc})") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            "source", path, f"valid JSON (error at line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from exc
    if not isinstance(data, dict):
        raise ConfigError("source", path, f"a JSON object at the top level (got a {type_name(data)})")
    return data


def warn_unknown(keys: Iterable[Any], known: tuple[str, ...], prefix: str) -> None:
    """Unknown keys are warned about, never fatal: configs are shared with msprobe and other versions.
    The warning points at the caller of ``load_config``, which calls this directly."""
    for key in keys:
        if key in known:
            continue
        suggestion = suggest(key, known)
        msg = f"unknown config key {prefix}{key!r} is ignored; known keys: {', '.join(known)}" + (
            f"; {suggestion}" if suggestion else ""
        )
        warnings.warn(msg, UserWarning, stacklevel=3)


def raw_section(raw: Mapping[Any, Any], name: str) -> dict[Any, Any] | None:
    """A task section: absent or null -> None, an object -> a copy, anything else -> error."""
    value = raw.get(name)
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ConfigError(
            name,
            value,
            f"a JSON object of {name} settings (got a {type_name(value)})",
            hint=f'write "{name}": {{...}}',
        )
    return dict(value)
