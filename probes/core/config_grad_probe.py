"""The ``"grad_probe"`` section: its table of keys and the checks of bounds and FP8 formats.

Defaults are the reference's. Unlike the reference, an empty ``bounds`` list is rejected (it then
wrote L2 rows one cell wider than the header) and ``param_list`` entries must be non-empty strings.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from probes.core.config_fields import Field, keys_of, one_of, option, parse_fields, section_to_dict, type_name
from probes.core.config_parsers import Choice, StrList
from probes.core.errors import ConfigError
from probes.core.thresholds import FLOAT8_DTYPES

__all__ = ["GRAD_LEVELS", "GRAD_PROBE_KEYS", "GRAD_PROBE_OWN_KEYS", "GradProbeConfig", "parse_grad_probe"]

GRAD_LEVELS = ("L0", "L1", "L2")

#: Bounds must fit an int64, as in the reference's check_bounds (so nan/inf are rejected too).
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _bounds(key: str, value: object, field: Field) -> tuple[float | int, ...]:
    """Strictly ascending finite numbers within the int64 range; null means the default.

    The values are kept as given (int or float) because the CSV header prints them with str().
    """
    if value is None:
        return field.default  # type: ignore[no-any-return]
    if not isinstance(value, (list, tuple)):
        raise ConfigError(
            key, value, f"a list of strictly ascending numbers (got a {type_name(value)})", hint="write e.g. [-1, 0, 1]"
        )
    if not value:
        # the reference accepts [] and then writes rows one cell wider than the header.
        raise ConfigError(
            key, value, "a non-empty list of strictly ascending numbers", hint="write e.g. [-1, 0, 1] (the default)"
        )
    allowed = f"a finite number (int or float, not a boolean) in [{_INT64_MIN}, {_INT64_MAX}]"
    for i, item in enumerate(value):
        item_key = f"{key}[{i}]"
        if isinstance(item, bool) or not isinstance(item, (int, float)):
            raise ConfigError(item_key, item, f"{allowed} (got a {type_name(item)})")
        if isinstance(item, float) and not math.isfinite(item):
            raise ConfigError(item_key, item, allowed)
        if not _INT64_MIN <= item <= _INT64_MAX:
            raise ConfigError(item_key, item, allowed)
        if i and not value[i - 1] < item:
            raise ConfigError(
                item_key,
                item,
                f"greater than the previous bound {value[i - 1]!r}: {key} must be strictly ascending",
                hint=f"write {json.dumps(sorted(set(value)))}" if len(set(value)) > 1 else "",
            )
    return tuple(value)


def _fp8_health(key: str, value: object, field: Field) -> tuple[str, ...]:
    """FP8 format names, each once; null or [] = no FP8 columns. A list, not a switch, because the
    columns are per format and e4m3 (forward) and e5m2 (gradients) answer different questions."""
    allowed = f"a list of FP8 formats, each once, from {one_of(FLOAT8_DTYPES)}"
    example = 'write e.g. ["float8_e5m2", "float8_e4m3fn"]'
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise ConfigError(key, value, f"{allowed} (got a {type_name(value)})", hint=example)
    for i, item in enumerate(value):
        if not isinstance(item, str) or item not in FLOAT8_DTYPES:
            spelled = f"float8_{item}" if isinstance(item, str) else ""
            hint = f'write "{spelled}"' if spelled in FLOAT8_DTYPES else example
            raise ConfigError(f"{key}[{i}]", item, allowed, hint=hint)
        if item in value[:i]:
            raise ConfigError(f"{key}[{i}]", item, f"{allowed}: {item!r} is listed twice")
    return tuple(value)


@dataclass(frozen=True)
class GradProbeConfig:
    """The ``"grad_probe"`` section, validated; each field is one JSON key.

    ``bounds`` keeps each value exactly as parsed (an int stays an int), because the L2 CSV header
    is built from ``str()`` of each bound: ``-1`` -> ``(-inf, -1]``, ``1e-5`` -> ``1e-05``.
    """

    grad_level: str = option("grad_level", Choice(GRAD_LEVELS), "L1",
                             "L0: checksums; L1: statistics and signs; L2: also the interval counts")
    param_list: tuple[str, ...] = option(
        "param_list",
        StrList("parameter names", '["fc1.weight"]', "a name from model.named_parameters()", strip=False),
        (),
        "exact names from model.named_parameters(); () = every parameter",
    )
    bounds: tuple[float | int, ...] = option("bounds", _bounds, (-1, 0, 1), "the L2 interval edges")
    fp8_health: tuple[str, ...] = option(
        "fp8_health", _fp8_health, (),
        "FP8 formats whose underflow / saturation columns end each CSV row; () keeps msprobe's format",
        extension=True, write_default=False,
    )

    def to_dict(self) -> dict[str, Any]:
        """The section as JSON data, so it can be fed back to load_config (``fp8_health`` only when
        set: a config without it round-trips to msprobe's keys)."""
        return section_to_dict(self)


#: Keys of the ``"grad_probe"`` section (msprobe's).
GRAD_PROBE_KEYS = keys_of(GradProbeConfig, extension=False)
#: Our keys of the ``"grad_probe"`` section: off by default, so msprobe's files stay as they were.
GRAD_PROBE_OWN_KEYS = keys_of(GradProbeConfig, extension=True)


def parse_grad_probe(gp: Any) -> GradProbeConfig:
    """Validate the grad_probe section (msprobe's checks, plus: empty ``bounds`` rejected)."""
    return GradProbeConfig(**parse_fields(GradProbeConfig, gp, "grad_probe."))
