"""PtdbgDispatch's arguments, declared once as the table :class:`DispatchOptions`: its signature,
the keys of the config's ``"online_dispatch"`` section, the checks and ``as_dict`` are read off it.

Everything is checked before anything is created (msprobe rejected a too-large ``process_num``
only after creating the run directory). Every invalid argument is a ConfigError naming it, the
value and what is allowed.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probes.core.config_fields import Field, keys_of, option, parse_fields, section_to_dict, signature_of
from probes.core.config_parsers import StrictChoice, non_negative_int
from probes.core.errors import ConfigError
from probes.core.hints import did_you_mean
from probes.core.rules import ONLINE_DISPATCH_RULES

__all__ = ["CONFIG_SECTION_KEYS", "DUMP_MODES", "SIGNATURE", "DispatchOptions", "check_config_section",
           "max_process_num", "validate"]

logger = logging.getLogger("probes.online_dispatch")

DUMP_MODES = ("OFF", "auto", "list", "all")
_TAG = re.compile(r"^[a-zA-Z0-9_-]+$")


def max_process_num() -> int:
    """The reference's bound: max((cpu_count + 1) // 4, 1)."""
    return max(((os.cpu_count() or 1) + 1) // 4, 1)


def _api_list(key: str, value: object, field: Field) -> tuple[str, ...]:
    """Only the type here: whether the names are aten ops needs torch, and is checked after the table."""
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)) or not all(isinstance(a, str) for a in value):
        raise ConfigError(key, value, "a list of aten op names (strings) such as [\"mm\", \"native_layer_norm\"]")
    return tuple(value)


def _debug(key: str, value: object, field: Field) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(key, value, "True or False")
    return value


def _dump_path(key: str, value: object, field: Field) -> Path:
    """The path resolved, not yet created: that is the last step, once every argument is valid."""
    if value is None or not isinstance(value, (str, os.PathLike)) or str(value) == "":
        raise ConfigError(key, value, "a directory path (str or path-like) where results are written",
                          hint="e.g. dump_path=\"./online_dispatch\"")
    return Path(value).expanduser().resolve()


def _tag(key: str, value: object, field: Field) -> str | None:
    if value is not None and (not isinstance(value, str) or not _TAG.match(value)):
        raise ConfigError(key, value, "None or a string of letters, digits, '_' and '-'")
    return value


def _process_num(key: str, value: object, field: Field) -> int:
    limit = max_process_num()
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
        raise ConfigError(key, value, f"an integer from 0 to {limit} (max((cpu_count + 1) // 4, 1) on this machine)",
                          hint="0 compares in this process")
    return value


def _background(key: str, value: object, field: Field) -> bool | str:
    if not isinstance(value, bool) and value != "auto":
        raise ConfigError(key, value, '"auto", True or False', hint=field.doc)
    return value  # type: ignore[return-value]


@dataclass(frozen=True)
class DispatchOptions:
    """PtdbgDispatch's validated arguments, in msprobe's order (new ones last); build it with
    :func:`validate`, as the defaults here are the signature's, not validated values."""

    dump_mode: str = option("dump_mode", StrictChoice(DUMP_MODES), "OFF",
                            "which compared ops are dumped: none, the failing ones, those in api_list, all")
    api_list: tuple[str, ...] = option("api_list", _api_list, None,
                                       'aten op packets as in dir(torch.ops.aten), for dump_mode="list"')
    debug: bool = option("debug", _debug, False, "log the options and the run directory")
    dump_path: Path = option("dump_path", _dump_path, None, "where the run directory is created")
    tag: str | None = option("tag", _tag, None, "added to the run directory's name")
    process_num: int = option("process_num", _process_num, 0,
                              "worker processes for the figures; 0 compares in this process")
    background: bool | str = option(
        "background", _background, "auto",
        "True compares in a background thread while the program goes on, False inline, "
        '"auto" picks the thread when it can overlap (an accelerator, or idle CPU cores)',
        extension=True)
    rule: str = option(
        "rule", StrictChoice(ONLINE_DISPATCH_RULES, explain=True), "both",
        '"both" fails an output when either rule fails it, "reference" applies msprobe\'s '
        'documented Cosine/MaxAbsErr rule alone, "scaled" the dtype-aware error at the '
        "output's scale alone",
        extension=True)
    compiled_first: int = option("compiled_first", non_negative_int, 1,
                                 "the first calls of each torch.compile graph that are compared", extension=True)
    compiled_every: int = option("compiled_every", non_negative_int, 0,
                                 "then every n-th call of each graph (0: none)", extension=True)

    def as_dict(self) -> dict[str, Any]:
        """The options as JSON data, for the run's summary and the debug log."""
        return section_to_dict(self)


#: PtdbgDispatch's signature: every option, positional or keyword, with its default.
SIGNATURE = signature_of(DispatchOptions)
#: Keys of the config's "online_dispatch" section: every option but dump_path, which is the
#: config's top-level one.
CONFIG_SECTION_KEYS = tuple(k for k in keys_of(DispatchOptions) if k != "dump_path")


def check_config_section(section: Mapping[str, Any]) -> None:
    """The config's "online_dispatch" section holds option names only; an unknown key is an error
    (not a warning, as elsewhere), because it would otherwise reach PtdbgDispatch as a TypeError."""
    unknown = sorted(set(section) - set(CONFIG_SECTION_KEYS))
    if unknown:
        raise ConfigError(f"online_dispatch.{unknown[0]}", section[unknown[0]], f"one of {', '.join(CONFIG_SECTION_KEYS)}")


def validate(*args: Any, **kwargs: Any) -> DispatchOptions:
    """PtdbgDispatch's arguments (as in :data:`SIGNATURE`) checked, then the dump path created."""
    try:
        bound = SIGNATURE.bind(*args, **kwargs)
    except TypeError as exc:  # as Python words it for a plain signature, naming the class
        raise TypeError(f"PtdbgDispatch() {exc}") from None
    bound.apply_defaults()
    options = DispatchOptions(**parse_fields(DispatchOptions, bound.arguments))
    _check_api_names(options.api_list, options.dump_mode)
    _create_dump_path(options.dump_path, bound.arguments["dump_path"])
    return options


def _aten_names() -> set[str]:
    """Every aten op packet registered with the dispatcher. dir(torch.ops.aten) is not that: it
    lists only the packets this process has already touched (they load lazily)."""
    import torch

    names = {n for n in dir(torch.ops.aten) if not n.startswith("__")}
    try:
        registered = torch._C._dispatch_get_all_op_names()
    except Exception:  # a torch without the private registry listing: fall back to a lazy lookup
        registered = []
    names.update(n[len("aten::"):].split(".", 1)[0] for n in registered if n.startswith("aten::"))
    return names


def _is_aten_op(name: str, known: set[str]) -> bool:
    if name in known:
        return True
    import torch

    try:
        return hasattr(torch.ops.aten, name)  # loads the packet when it exists
    except Exception:
        return False


def _check_api_names(api_list: tuple[str, ...], dump_mode: str) -> None:
    if dump_mode == "list" and not api_list:
        raise ConfigError("api_list", list(api_list), 'a non-empty list of aten op names when dump_mode="list"',
                          hint='name the ops to dump, e.g. api_list=["mm"], or use dump_mode="auto"')
    if api_list:
        known = _aten_names()
        for name in api_list:
            if not _is_aten_op(name, known):
                hint = did_you_mean(name, sorted(known), otherwise=(
                    "names are aten op packets without overload, as in dir(torch.ops.aten): \"mm\", \"add\", \"add_\""))
                raise ConfigError("api_list", name, "an aten op name", hint=hint)
        if dump_mode != "list":
            logger.warning('online_dispatch: api_list is used only with dump_mode="list" (dump_mode=%r)', dump_mode)


def _create_dump_path(path: Path, given: Any) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError("dump_path", str(given), "a directory that exists or can be created",
                          hint=f"{type(exc).__name__}: {exc}") from None
    if not path.is_dir() or not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError("dump_path", str(given), "a writable directory")
