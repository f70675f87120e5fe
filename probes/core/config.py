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

Each section is declared once, as a table (probes.core.config_free_benchmark,
probes.core.config_grad_probe; online_dispatch's in probes.online_dispatch.options), and this
module, the public one, puts the top level and the sections together. It imports no
deep-learning framework.
"""

from __future__ import annotations

import bisect
import copy
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from probes.core.config_fields import (
    Field,
    keys_of,
    one_of,
    option,
    parse_fields,
    section_to_dict,
    suggest,
    type_name,
)
from probes.core.config_free_benchmark import (
    ADD_NOISE_STYLES,
    FREE_BENCHMARK_KEYS,
    FUZZ_DEVICES,
    FUZZ_LEVELS,
    FUZZ_STAGES,
    HANDLER_TYPES,
    PERT_MODES,
    FreeBenchmarkConfig,
    parse_free_benchmark,
)
from probes.core.config_grad_probe import (
    GRAD_LEVELS,
    GRAD_PROBE_KEYS,
    GRAD_PROBE_OWN_KEYS,
    GradProbeConfig,
    parse_grad_probe,
)
from probes.core.config_parsers import INDEX_MAX, Choice, boolean, index_list, parse_index_list
from probes.core.config_source import PathSource, raw_section, read_source, warn_unknown
from probes.core.errors import ConfigError

__all__ = [
    "ADD_NOISE_STYLES",
    "FREE_BENCHMARK_KEYS",
    "FUZZ_DEVICES",
    "FUZZ_LEVELS",
    "FUZZ_STAGES",
    "HANDLER_TYPES",
    "INDEX_MAX",
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
LEVELS = ("L0", "L1", "L2", "mix", "debug")

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


def _task(key: str, value: object, f: Field) -> str:
    if value is None:
        raise ConfigError(
            key,
            value,
            f"required: {one_of(TASKS)}",
            hint='add "task": "free_benchmark" to the config or pass task=...',
        )
    if not isinstance(value, str) or value not in TASKS:
        hint = (
            'msprobe tasks such as "statistics", "tensor" and "overflow_check" are not supported by this tool'
        )
        if isinstance(value, str) and value not in _MSPROBE_ONLY_TASKS:
            suggestion = suggest(value, TASKS)
            hint = f"{suggestion} ({hint})" if suggestion else hint
        raise ConfigError(key, value, one_of(TASKS), hint=hint)
    return value


def _dump_path(key: str, value: object, f: Field) -> str:
    """Required, non-empty. Kept as given (no abspath) and not created: that happens at start()."""
    hint = 'add "dump_path": "./probe_output" to the config or pass dump_path=...'
    if value is None:
        raise ConfigError(key, value, "required: a non-empty path string", hint=hint)
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise ConfigError(key, value, f"a non-empty path string (got a {type_name(value)})", hint=hint)
    if not value.strip():
        raise ConfigError(key, value, "a non-empty path string", hint=hint)
    return value


@dataclass(frozen=True)
class ProbeConfig:
    """A whole validated config. Build it with :func:`load_config`; the constructor does not validate.

    The top-level keys are a table like the sections' (see probes.core.config_fields)."""

    task: str = option("task", _task, doc="the tool to run; no default, as this tool lacks msprobe's")
    dump_path: str = option("dump_path", _dump_path, doc="kept as given; created when the probe starts")
    rank: tuple[int, ...] = option("rank", index_list, (), "sorted, unique; () = all ranks")
    step: tuple[int, ...] = option("step", index_list, (), "sorted, unique; () = all steps")
    level: str = option("level", Choice(LEVELS), "L1", 'free_benchmark is API-level and needs "L1"')
    strict: bool = option("strict", boolean, False, "probe-internal errors raise instead of being recorded",
                          extension=True)
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
        out = section_to_dict(self)
        out["free_benchmark"] = self.free_benchmark.to_dict()
        for name, section in self.extra_sections.items():
            out[name] = copy.deepcopy(dict(section))
        return out


#: Top-level keys this tool reads (overridable through ``load_config(overrides=...)``).
TOP_LEVEL_KEYS = keys_of(ProbeConfig)
_KNOWN_TOP_LEVEL_KEYS = TOP_LEVEL_KEYS + _IGNORED_TOP_LEVEL_KEYS + TASKS + _MSPROBE_ONLY_TASKS


def _selects(selected: tuple[int, ...], value: int) -> bool:
    # The tuples are sorted, so bisect keeps this O(log n) even for a "0-1000000" range.
    if not selected:
        return True
    i = bisect.bisect_left(selected, value)
    return i < len(selected) and selected[i] == value


def _check_level(level: str, task: str) -> None:
    if task == "free_benchmark" and level != "L1":
        raise ConfigError(
            "level",
            level,
            'free_benchmark is an API-level (L1) tool, so level must be "L1"',
            hint='write "level": "L1" or remove the key',
        )


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
                hint=suggest(key, known),
            )
    return touched_gp


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
    raw = read_source(source)
    warn_unknown(raw.keys(), _KNOWN_TOP_LEVEL_KEYS, "")

    fb = raw_section(raw, "free_benchmark") or {}
    warn_unknown(fb.keys(), FREE_BENCHMARK_KEYS, "free_benchmark.")
    gp = raw_section(raw, "grad_probe")
    gp_present = gp is not None
    gp = gp or {}
    warn_unknown(gp.keys(), GRAD_PROBE_KEYS + GRAD_PROBE_OWN_KEYS, "grad_probe.")
    if overrides is not None:
        if not isinstance(overrides, Mapping):
            raise ConfigError("overrides", overrides, "a mapping of config keys to values")
        gp_present = _apply_overrides(raw, fb, gp, overrides) or gp_present
    extra: dict[str, Mapping[str, Any]] = {}
    for name in _EXTRA_SECTION_NAMES:
        section = (gp if gp_present else None) if name == "grad_probe" else raw_section(raw, name)
        if section is not None:
            extra[name] = MappingProxyType(section)
    if task is not None:
        raw["task"] = task
    if dump_path is not None:
        raw["dump_path"] = dump_path
    if step is not None:
        raw["step"] = step

    top = parse_fields(ProbeConfig, raw)
    _check_level(top["level"], top["task"])
    return ProbeConfig(
        **top,
        free_benchmark=parse_free_benchmark(fb),
        grad_probe=parse_grad_probe(gp) if gp_present or top["task"] == "grad_probe" else None,
        extra_sections=MappingProxyType(extra),
    )
