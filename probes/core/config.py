"""Probe configuration: the msprobe 8.3.3 ``config.json`` format, validated up front.

Every check runs in :func:`load_config`, before any hook is installed, so a bad config never
leaves a model half-probed. Each failure raises :class:`~probes.core.errors.ConfigError` naming
the dotted key, the bad value and what is allowed (the reference logs a bare INVALID_PARAM).

Deliberate differences from the reference:

* an explicit JSON ``null`` means "use the default" (the reference fails membership checks);
* ``max_sample`` defaults to 20, as msprobe's docs say (its code used 15 by mistake);
* ``preheat_step``/``max_sample`` are validated even when preheat is off;
* ``level`` must be ``"L1"`` for free_benchmark (the reference silently does nothing under L0);
* ``scope`` must be a list (the reference wraps a bare string), and the scope-layer checks
  (scope/list conflict, list element types) run here instead of when the service is built;
* ``task`` has no default (the reference falls back to ``"statistics"``, which this tool lacks);
* unknown keys warn instead of being silently ignored;
* grad_probe: an empty ``bounds`` list is rejected (the reference accepted it and then wrote L2
  rows one cell wider than the header), ``param_list`` entries must be non-empty strings, and the
  top-level ``level`` is not tied to grad_probe's own ``grad_level``.

This module imports no deep-learning framework.
"""

from __future__ import annotations

import bisect
import copy
import json
import math
import os
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Union

from probes.core.errors import ConfigError
from probes.core.hints import did_you_mean
from probes.core.rules import FREE_BENCHMARK_RULES
from probes.core.thresholds import FLOAT8_DTYPES

__all__ = [
    "ADD_NOISE_STYLES",
    "FREE_BENCHMARK_KEYS",
    "FUZZ_DEVICES",
    "FUZZ_LEVELS",
    "FUZZ_STAGES",
    "HANDLER_TYPES",
    "LEVELS",
    "PERT_MODES",
    "TASKS",
    "TOP_LEVEL_KEYS",
    "GRAD_LEVELS",
    "GRAD_PROBE_KEYS",
    "GRAD_PROBE_OWN_KEYS",
    "FreeBenchmarkConfig",
    "GradProbeConfig",
    "ProbeConfig",
    "load_config",
    "parse_index_list",
]

TASKS = ("free_benchmark", "grad_probe", "online_dispatch")
PERT_MODES = ("improve_precision", "add_noise", "bit_noise", "change_value", "no_change", "to_cpu")
HANDLER_TYPES = ("check", "fix")
FUZZ_STAGES = ("forward", "backward")
FUZZ_DEVICES = ("npu", "cpu")
FUZZ_LEVELS = ("L1",)
LEVELS = ("L0", "L1", "L2", "mix", "debug")
ADD_NOISE_STYLES = ("ulp", "reference")
GRAD_LEVELS = ("L0", "L1", "L2")

#: Keys of the ``"grad_probe"`` section (msprobe's).
GRAD_PROBE_KEYS = ("grad_level", "param_list", "bounds")
#: Our keys of the ``"grad_probe"`` section: off by default, so msprobe's files stay as they were.
GRAD_PROBE_OWN_KEYS = ("fp8_health",)
#: Bounds must fit an int64, as in the reference's check_bounds (so nan/inf are rejected too).
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

#: Largest rank/step number and largest expanded list, as in the reference.
INDEX_MAX = 1_000_000

#: Top-level keys this tool reads (overridable through ``load_config(overrides=...)``).
TOP_LEVEL_KEYS = ("task", "dump_path", "rank", "step", "level", "strict")

#: Keys of the ``"free_benchmark"`` section, in the reference's spelling ("list", not "api_list").
FREE_BENCHMARK_KEYS = (
    "scope",
    "list",
    "fuzz_device",
    "pert_mode",
    "handler_type",
    "fuzz_level",
    "fuzz_stage",
    "if_preheat",
    "preheat_step",
    "max_sample",
    "add_noise_style",
    "rule",
    "compiled_first",
    "compiled_every",
)

# msprobe keys that are legal in a shared config.json but mean nothing to this tool: accepted silently.
_IGNORED_TOP_LEVEL_KEYS = (
    "is_deterministic",
    "enable_dataloader",
    "acl_config",
    "async_dump",
    "precision",
    "framework",
)
# Sections of other tasks this tool implements: kept raw for their own parsers.
_EXTRA_SECTION_NAMES = tuple(t for t in TASKS if t != "free_benchmark")
# msprobe task sections this tool does not implement: accepted silently, dropped.
_MSPROBE_ONLY_TASKS = ("statistics", "tensor", "overflow_check", "run_ut", "structure", "exception_dump")
_KNOWN_TOP_LEVEL_KEYS = TOP_LEVEL_KEYS + _IGNORED_TOP_LEVEL_KEYS + TASKS + _MSPROBE_ONLY_TASKS

_RANGE_RE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")

PathSource = Union[str, "os.PathLike[str]"]


@dataclass(frozen=True)
class FreeBenchmarkConfig:
    """The ``"free_benchmark"`` section, validated. Defaults are the reference's (except max_sample: 20 as its docs say, not 15)."""

    scope: tuple[str, ...] = ()
    api_list: tuple[str, ...] = ()  # JSON key "list"
    fuzz_device: str = "npu"
    pert_mode: str = "improve_precision"
    handler_type: str = "check"
    fuzz_level: str = "L1"
    fuzz_stage: str = "forward"
    if_preheat: bool = False
    preheat_step: int = 15
    max_sample: int = 20
    add_noise_style: str = "ulp"  # our extension: "reference" keeps msprobe 8.3.3's add_noise
    # our extension: "reference" = msprobe's element-wise ratio rule (the drop-in default for a
    # config.json), "scaled" = the scale-aware rule the pytest plugin gates on
    rule: str = "reference"
    # our extension: which calls of each torch.compile graph are checked (probes/compiled): the
    # first `compiled_first`, then every `compiled_every`-th (0: none)
    compiled_first: int = 1
    compiled_every: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The section as JSON data with the reference's key names, so it can be fed back to load_config."""
        return {
            "scope": list(self.scope),
            "list": list(self.api_list),
            "fuzz_device": self.fuzz_device,
            "pert_mode": self.pert_mode,
            "handler_type": self.handler_type,
            "fuzz_level": self.fuzz_level,
            "fuzz_stage": self.fuzz_stage,
            "if_preheat": self.if_preheat,
            "preheat_step": self.preheat_step,
            "max_sample": self.max_sample,
            "add_noise_style": self.add_noise_style,
            "rule": self.rule,
            "compiled_first": self.compiled_first,
            "compiled_every": self.compiled_every,
        }


@dataclass(frozen=True)
class GradProbeConfig:
    """The ``"grad_probe"`` section, validated. Defaults are the reference's.

    ``bounds`` keeps each value exactly as parsed (an int stays an int), because the L2 CSV header
    is built from ``str()`` of each bound: ``-1`` -> ``(-inf, -1]``, ``1e-5`` -> ``1e-05``.
    Unlike the reference an empty ``bounds`` list is rejected (it gave a misaligned L2 CSV).
    """

    grad_level: str = "L1"
    param_list: tuple[str, ...] = ()  # () = every parameter
    bounds: tuple[float | int, ...] = (-1, 0, 1)
    # FP8 formats whose underflow / saturation columns end each CSV row; () keeps msprobe's format
    fp8_health: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The section as JSON data, so it can be fed back to load_config (``fp8_health`` only when
        set: a config without it round-trips to msprobe's keys)."""
        out: dict[str, Any] = {"grad_level": self.grad_level, "param_list": list(self.param_list),
                               "bounds": list(self.bounds)}
        if self.fp8_health:
            out["fp8_health"] = list(self.fp8_health)
        return out


@dataclass(frozen=True)
class ProbeConfig:
    """A whole validated config. Build it with :func:`load_config`; the constructor does not validate."""

    task: str
    dump_path: str
    rank: tuple[int, ...] = ()  # sorted, unique; () = all ranks
    step: tuple[int, ...] = ()  # sorted, unique; () = all steps
    level: str = "L1"
    strict: bool = False  # our extension: probe-internal errors raise instead of being recorded
    free_benchmark: FreeBenchmarkConfig = field(default_factory=FreeBenchmarkConfig)
    # Parsed whenever the config has a "grad_probe" section or the task is grad_probe, else None.
    # The raw section is also kept in extra_sections (to_dict writes the raw form, so the round
    # trip reproduces both).
    grad_probe: GradProbeConfig | None = None
    # Raw sections of other tasks (grad_probe, online_dispatch), kept for their own parsers.
    # Excluded from the hash because mappings are unhashable; still part of equality.
    extra_sections: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, hash=False)

    def selects_step(self, step: int) -> bool:
        """Whether the probe is active at ``step``; an empty filter selects every step."""
        return _selects(self.step, step)

    def selects_rank(self, rank: int) -> bool:
        """Whether the probe is active on ``rank``; an empty filter selects every rank."""
        return _selects(self.rank, rank)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form with the reference's key names (for summary.json).

        ``load_config(cfg.to_dict()) == cfg`` holds, so a run can be reproduced from its summary.
        """
        out: dict[str, Any] = {
            "task": self.task,
            "dump_path": self.dump_path,
            "rank": list(self.rank),
            "step": list(self.step),
            "level": self.level,
            "strict": self.strict,
            "free_benchmark": self.free_benchmark.to_dict(),
        }
        for name, section in self.extra_sections.items():
            out[name] = copy.deepcopy(dict(section))
        return out


def _selects(selected: tuple[int, ...], value: int) -> bool:
    # The tuples are sorted, so bisect keeps this O(log n) even for a "0-1000000" range.
    if not selected:
        return True
    i = bisect.bisect_left(selected, value)
    return i < len(selected) and selected[i] == value


# --------------------------------------------------------------------------------------------------
# helpers


def _is_int(value: object) -> bool:
    """A real int: JSON true/false arrive as bool, which is an int subclass, and must not count."""
    return isinstance(value, int) and not isinstance(value, bool)


def _type_name(value: object) -> str:
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


def _suggest(value: object, allowed: tuple[str, ...]) -> str:
    """The hint of a config error: one suggestion, since a key or a choice has one right spelling."""
    return did_you_mean(value, allowed, n=1) if isinstance(value, str) else ""


def _one_of(allowed: tuple[str, ...]) -> str:
    return "one of " + ", ".join(f'"{a}"' for a in allowed)


def _choice(key: str, value: object, allowed: tuple[str, ...], default: str) -> str:
    """A string that must be one of ``allowed``; null means ``default``."""
    if value is None:
        return default
    if not isinstance(value, str):
        raise ConfigError(
            key, value, f"a string, {_one_of(allowed)} (got a {_type_name(value)})", hint=f'write "{default}"'
        )
    if value not in allowed:
        raise ConfigError(key, value, _one_of(allowed), hint=_suggest(value, allowed))
    return value


def _bool(key: str, value: object, default: bool) -> bool:
    """A real JSON boolean; null means ``default``. Strings like "true" are rejected, as in the reference."""
    if value is None:
        return default
    if not isinstance(value, bool):
        hint = ""
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            hint = f"use JSON {value.strip().lower()} (without quotes)"
        raise ConfigError(key, value, f"true or false (got a {_type_name(value)})", hint=hint)
    return value


def _positive_int(key: str, value: object, default: int) -> int:
    """An int > 0 that is not a bool; null means ``default``."""
    if value is None:
        return default
    if not _is_int(value) or value <= 0:  # type: ignore[operator]
        raise ConfigError(key, value, f"an integer > 0 (not a boolean); the default is {default}")
    return value  # type: ignore[return-value]


def non_negative_int(key: str, value: object, default: int) -> int:
    """An int >= 0 that is not a bool; null means ``default``."""
    if value is None:
        return default
    if not _is_int(value) or value < 0:  # type: ignore[operator]
        raise ConfigError(key, value, f"an integer >= 0 (not a boolean); the default is {default}")
    return value  # type: ignore[return-value]


def _str_list(key: str, value: object) -> tuple[str, ...]:
    """A list of non-empty strings; null means ``()``."""
    if value is None:
        return ()
    if isinstance(value, str):
        raise ConfigError(
            key, value, "a list of API names, not a single string", hint=f"write [{json.dumps(value)}]"
        )
    if not isinstance(value, (list, tuple)):
        raise ConfigError(
            key, value, f"a list of API names (got a {_type_name(value)})", hint='write e.g. ["relu"]'
        )
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item.strip():
            raise ConfigError(
                f"{key}[{i}]", item, f"a non-empty string (an API name); {key} must be a list of strings"
            )
    return tuple(value)


# --------------------------------------------------------------------------------------------------
# rank / step


def parse_index_list(key: str, value: object) -> tuple[int, ...]:
    """Parse msprobe's ``rank``/``step`` syntax into a sorted tuple of unique ints.

    Elements are ints in [0, 1_000_000] (booleans rejected) or ``"a-b"`` strings with a <= b,
    expanded inclusively. ``null`` means ``()`` (= all). A bare value where a list belongs is
    an error rather than being guessed at: ``"1"`` could mean [1] or a typo.
    """
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        if _is_int(value):
            hint = f"write [{value}]"
        elif isinstance(value, str) and value.strip().isdigit():
            hint = f"write [{value.strip()}]"
        elif isinstance(value, str) and _RANGE_RE.match(value):
            hint = f"write [{json.dumps(value.strip())}]"
        else:
            hint = 'write e.g. [0, 1] or ["0-3"]'
        raise ConfigError(
            key, value, f'a list of integers and "a-b" ranges, not a {_type_name(value)}', hint=hint
        )
    allowed = f'an integer in [0, {INDEX_MAX}] or a range string "a-b" with 0 <= a <= b <= {INDEX_MAX}'
    result: set[int] = set()
    for i, item in enumerate(value):
        item_key = f"{key}[{i}]"
        if _is_int(item):
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
            raise ConfigError(item_key, item, f"{allowed} (got a {_type_name(item)})")
        if len(result) > INDEX_MAX:
            raise ConfigError(key, value, f"at most {INDEX_MAX} entries once ranges are expanded")
    return tuple(sorted(result))


# --------------------------------------------------------------------------------------------------
# loading


def _read_source(source: PathSource | Mapping[str, Any] | None) -> dict[Any, Any]:
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
        raise ConfigError("source", path, f"a JSON object at the top level (got a {_type_name(data)})")
    return data


def _warn_unknown(keys: Any, known: tuple[str, ...], prefix: str) -> None:
    """Unknown keys are warned about, never fatal: configs are shared with msprobe and other versions."""
    for key in keys:
        if key in known:
            continue
        suggestion = _suggest(key, known)
        msg = f"unknown config key {prefix}{key!r} is ignored; known keys: {', '.join(known)}" + (
            f"; {suggestion}" if suggestion else ""
        )
        warnings.warn(msg, UserWarning, stacklevel=3)


def _section(raw: Mapping[Any, Any], name: str) -> dict[Any, Any] | None:
    """A task section: absent or null -> None, an object -> a copy, anything else -> error."""
    value = raw.get(name)
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ConfigError(
            name,
            value,
            f"a JSON object of {name} settings (got a {_type_name(value)})",
            hint=f'write "{name}": {{...}}',
        )
    return dict(value)


def _apply_overrides(
    raw: dict[Any, Any], fb: dict[Any, Any], gp: dict[Any, Any], overrides: Mapping[str, Any]
) -> bool:
    """Merge ``overrides`` into the raw top level / task sections; they are validated afterwards.

    Returns whether a grad_probe key was set (which makes the grad_probe section present).
    """
    touched_gp = False
    gp_keys = GRAD_PROBE_KEYS + GRAD_PROBE_OWN_KEYS
    known = TOP_LEVEL_KEYS + FREE_BENCHMARK_KEYS + gp_keys
    for key, value in overrides.items():
        name = key
        if isinstance(key, str) and key.startswith("free_benchmark."):
            name = key[len("free_benchmark.") :]
            if name not in FREE_BENCHMARK_KEYS:
                name = key  # reported below as unknown
        elif isinstance(key, str) and key.startswith("grad_probe."):
            name = key[len("grad_probe.") :]
            if name not in gp_keys:
                name = key
        if name in TOP_LEVEL_KEYS:
            raw[name] = value
        elif name in FREE_BENCHMARK_KEYS:
            fb[name] = value
        elif name in gp_keys:
            gp[name] = value
            touched_gp = True
        else:
            raise ConfigError(
                "overrides",
                key,
                "a known key: " + ", ".join(known),
                hint=_suggest(key, known),
            )
    return touched_gp


def _task(value: object) -> str:
    if value is None:
        raise ConfigError(
            "task",
            value,
            f"required: {_one_of(TASKS)}",
            hint='add "task": "free_benchmark" to the config or pass task=...',
        )
    if not isinstance(value, str) or value not in TASKS:
        hint = (
            'msprobe tasks such as "statistics", "tensor" and "overflow_check" are not supported by this tool'
        )
        if isinstance(value, str) and value not in _MSPROBE_ONLY_TASKS:
            suggestion = _suggest(value, TASKS)
            hint = f"{suggestion} ({hint})" if suggestion else hint
        raise ConfigError("task", value, _one_of(TASKS), hint=hint)
    return value


def _dump_path(value: object) -> str:
    """Required, non-empty. Kept as given (no abspath) and not created: that happens at start()."""
    hint = 'add "dump_path": "./probe_output" to the config or pass dump_path=...'
    if value is None:
        raise ConfigError("dump_path", value, "required: a non-empty path string", hint=hint)
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise ConfigError(
            "dump_path", value, f"a non-empty path string (got a {_type_name(value)})", hint=hint
        )
    if not value.strip():
        raise ConfigError("dump_path", value, "a non-empty path string", hint=hint)
    return value


def _level(value: object, task: str) -> str:
    level = _choice("level", value, LEVELS, "L1")
    if task == "free_benchmark" and level != "L1":
        raise ConfigError(
            "level",
            level,
            'free_benchmark is an API-level (L1) tool, so level must be "L1"',
            hint='write "level": "L1" or remove the key',
        )
    return level


def _free_benchmark(fb: Mapping[Any, Any]) -> FreeBenchmarkConfig:
    """Validate the free_benchmark section: per-key types and values first, then combination rules."""
    p = "free_benchmark."
    d = FreeBenchmarkConfig()
    cfg = FreeBenchmarkConfig(
        scope=_str_list(p + "scope", fb.get("scope")),
        api_list=_str_list(p + "list", fb.get("list")),
        fuzz_device=_choice(p + "fuzz_device", fb.get("fuzz_device"), FUZZ_DEVICES, d.fuzz_device),
        pert_mode=_choice(p + "pert_mode", fb.get("pert_mode"), PERT_MODES, d.pert_mode),
        handler_type=_choice(p + "handler_type", fb.get("handler_type"), HANDLER_TYPES, d.handler_type),
        fuzz_level=_choice(p + "fuzz_level", fb.get("fuzz_level"), FUZZ_LEVELS, d.fuzz_level),
        fuzz_stage=_choice(p + "fuzz_stage", fb.get("fuzz_stage"), FUZZ_STAGES, d.fuzz_stage),
        if_preheat=_bool(p + "if_preheat", fb.get("if_preheat"), d.if_preheat),
        preheat_step=_positive_int(p + "preheat_step", fb.get("preheat_step"), d.preheat_step),
        max_sample=_positive_int(p + "max_sample", fb.get("max_sample"), d.max_sample),
        add_noise_style=_choice(
            p + "add_noise_style", fb.get("add_noise_style"), ADD_NOISE_STYLES, d.add_noise_style
        ),
        rule=_choice(p + "rule", fb.get("rule"), FREE_BENCHMARK_RULES, d.rule),
        compiled_first=non_negative_int(p + "compiled_first", fb.get("compiled_first"), d.compiled_first),
        compiled_every=non_negative_int(p + "compiled_every", fb.get("compiled_every"), d.compiled_every),
    )

    # to_cpu <=> cpu, both directions: "npu" means "the original call's device", which to_cpu
    # cannot use; and the CPU comparison path only knows how to judge to_cpu results.
    if cfg.pert_mode == "to_cpu" and cfg.fuzz_device != "cpu":
        raise ConfigError(
            p + "fuzz_device",
            cfg.fuzz_device,
            'free_benchmark.pert_mode "to_cpu" re-runs the API on the CPU and needs fuzz_device "cpu"',
            hint='set "fuzz_device": "cpu", or choose another pert_mode',
        )
    if cfg.fuzz_device == "cpu" and cfg.pert_mode != "to_cpu":
        raise ConfigError(
            p + "pert_mode",
            cfg.pert_mode,
            'free_benchmark.fuzz_device "cpu" allows only pert_mode "to_cpu"',
            hint='set "pert_mode": "to_cpu", or set "fuzz_device": "npu" to perturb on the original device',
        )
    if cfg.handler_type == "fix":
        # fix replaces the real output, so only perturbations that are more accurate may be used.
        if cfg.pert_mode not in ("improve_precision", "to_cpu"):
            raise ConfigError(
                p + "pert_mode",
                cfg.pert_mode,
                'handler_type "fix" replaces the real output, so pert_mode must be "improve_precision" or "to_cpu"',
                hint='use handler_type "check" to only report',
            )
        if cfg.fuzz_stage != "forward":
            raise ConfigError(
                p + "fuzz_stage",
                cfg.fuzz_stage,
                'handler_type "fix" works on forward outputs only, so fuzz_stage must be "forward"',
                hint='use handler_type "check" for the backward stage',
            )
        if cfg.if_preheat:
            raise ConfigError(
                p + "if_preheat",
                cfg.if_preheat,
                'preheat tunes the check thresholds and cannot be used with handler_type "fix"; it must be false',
                hint='set "if_preheat": false, or use handler_type "check"',
            )
    if cfg.if_preheat and cfg.rule == "scaled":
        raise ConfigError(
            p + "if_preheat",
            cfg.if_preheat,
            'preheat learns thresholds for the element-wise ratio rule; with "rule": "scaled" it must be false',
            hint='the scaled rule judges each output at its own scale and needs no warm-up: set "if_preheat": false, '
                 'or "rule": "reference" to tune msprobe\'s rule',
        )
    if cfg.fuzz_stage == "backward" and not cfg.api_list and not cfg.scope:
        raise ConfigError(
            p + "list",
            list(cfg.api_list),
            'a non-empty list or scope of APIs when free_benchmark.fuzz_stage is "backward" '
            "(each checked call costs two extra vector-Jacobian products)",
            hint='name the APIs to check, e.g. "list": ["matmul"], or call names in scope, e.g. '
                 '"scope": ["Functional.linear.0.backward"]',
        )
    if cfg.scope and cfg.api_list:
        raise ConfigError(
            p + "scope",
            list(cfg.scope),
            f"empty when free_benchmark.list is set (got list={list(cfg.api_list)!r}): scope and list conflict",
            hint="use only one of them: scope for exact API names, list for name substrings",
        )
    return cfg


def _grad_level(value: object) -> str:
    return _choice("grad_probe.grad_level", value, GRAD_LEVELS, GradProbeConfig.grad_level)


def _param_list(value: object) -> tuple[str, ...]:
    """Exact parameter names (``model.named_parameters()`` spelling); null or [] = every parameter."""
    key = "grad_probe.param_list"
    if value is None:
        return ()
    if isinstance(value, str):
        raise ConfigError(key, value, "a list of parameter names, not a single string", hint=f"write [{json.dumps(value)}]")
    if not isinstance(value, (list, tuple)):
        raise ConfigError(
            key, value, f"a list of parameter names (got a {_type_name(value)})", hint='write e.g. ["fc1.weight"]'
        )
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item:
            raise ConfigError(
                f"{key}[{i}]",
                item,
                f"a non-empty string (a name from model.named_parameters()); {key} must be a list of strings",
            )
    return tuple(value)


def _bounds(value: object) -> tuple[float | int, ...]:
    """Strictly ascending finite numbers within the int64 range; null means the default.

    The values are kept as given (int or float) because the CSV header prints them with str().
    """
    key = "grad_probe.bounds"
    default = GradProbeConfig.bounds
    if value is None:
        return default
    if not isinstance(value, (list, tuple)):
        raise ConfigError(
            key, value, f"a list of strictly ascending numbers (got a {_type_name(value)})", hint="write e.g. [-1, 0, 1]"
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
            raise ConfigError(item_key, item, f"{allowed} (got a {_type_name(item)})")
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


def _fp8_health(value: object) -> tuple[str, ...]:
    """FP8 format names, each once; null or [] = no FP8 columns. A list, not a switch, because the
    columns are per format and e4m3 (forward) and e5m2 (gradients) answer different questions."""
    key = "grad_probe.fp8_health"
    allowed = f"a list of FP8 formats, each once, from {_one_of(FLOAT8_DTYPES)}"
    example = 'write e.g. ["float8_e5m2", "float8_e4m3fn"]'
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise ConfigError(key, value, f"{allowed} (got a {_type_name(value)})", hint=example)
    for i, item in enumerate(value):
        if not isinstance(item, str) or item not in FLOAT8_DTYPES:
            spelled = f"float8_{item}" if isinstance(item, str) else ""
            hint = f'write "{spelled}"' if spelled in FLOAT8_DTYPES else example
            raise ConfigError(f"{key}[{i}]", item, allowed, hint=hint)
        if item in value[:i]:
            raise ConfigError(f"{key}[{i}]", item, f"{allowed}: {item!r} is listed twice")
    return tuple(value)


def _grad_probe(gp: Mapping[Any, Any]) -> GradProbeConfig:
    """Validate the grad_probe section (msprobe's checks, plus: empty ``bounds`` rejected)."""
    return GradProbeConfig(
        grad_level=_grad_level(gp.get("grad_level")),
        param_list=_param_list(gp.get("param_list")),
        bounds=_bounds(gp.get("bounds")),
        fp8_health=_fp8_health(gp.get("fp8_health")),
    )


def load_config(
    source: PathSource | Mapping[str, Any] | None = None,
    *,
    task: str | None = None,
    dump_path: str | os.PathLike[str] | None = None,
    step: object = None,
    overrides: Mapping[str, Any] | None = None,
) -> ProbeConfig:
    """Read and validate a config; raise ConfigError on the first invalid value.

    ``source`` is a path to a ``.json`` file, an already-parsed mapping, or None (empty config).
    Precedence, lowest first: the file, ``overrides``, then the ``task``/``dump_path``/``step``
    keyword arguments (None = not given). ``overrides`` takes top-level keys (``"rank"``,
    ``"level"``, ``"strict"``, ...) and free_benchmark / grad_probe keys either plainly
    (``"pert_mode"``, ``"grad_level"``) or dotted (``"free_benchmark.pert_mode"``,
    ``"grad_probe.bounds"``); every value is validated exactly like a file value.
    """
    raw = _read_source(source)
    _warn_unknown(raw.keys(), _KNOWN_TOP_LEVEL_KEYS, "")

    fb = _section(raw, "free_benchmark") or {}
    _warn_unknown(fb.keys(), FREE_BENCHMARK_KEYS, "free_benchmark.")
    gp = _section(raw, "grad_probe")
    gp_present = gp is not None
    gp = gp or {}
    _warn_unknown(gp.keys(), GRAD_PROBE_KEYS + GRAD_PROBE_OWN_KEYS, "grad_probe.")
    if overrides is not None:
        if not isinstance(overrides, Mapping):
            raise ConfigError("overrides", overrides, "a mapping of config keys to values")
        gp_present = _apply_overrides(raw, fb, gp, overrides) or gp_present
    extra: dict[str, Mapping[str, Any]] = {}
    for name in _EXTRA_SECTION_NAMES:
        section = (gp if gp_present else None) if name == "grad_probe" else _section(raw, name)
        if section is not None:
            extra[name] = MappingProxyType(section)
    if task is not None:
        raw["task"] = task
    if dump_path is not None:
        raw["dump_path"] = dump_path
    if step is not None:
        raw["step"] = step

    task_name = _task(raw.get("task"))
    return ProbeConfig(
        task=task_name,
        dump_path=_dump_path(raw.get("dump_path")),
        rank=parse_index_list("rank", raw.get("rank")),
        step=parse_index_list("step", raw.get("step")),
        level=_level(raw.get("level"), task_name),
        strict=_bool("strict", raw.get("strict"), False),
        free_benchmark=_free_benchmark(fb),
        grad_probe=_grad_probe(gp) if gp_present or task_name == "grad_probe" else None,
        extra_sections=MappingProxyType(extra),
    )
