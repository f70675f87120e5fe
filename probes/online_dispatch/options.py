"""PtdbgDispatch's arguments, validated before anything is created (msprobe rejected a
too-large ``process_num`` only after creating the run directory).

Every invalid argument is a ConfigError naming it, the value and what is allowed.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probes.core.config import non_negative_int
from probes.core.errors import ConfigError
from probes.core.hints import did_you_mean
from probes.core.rules import ONLINE_DISPATCH_RULES

logger = logging.getLogger("probes.online_dispatch")

DUMP_MODES = ("OFF", "auto", "list", "all")
_TAG = re.compile(r"^[a-zA-Z0-9_-]+$")


def max_process_num() -> int:
    """The reference's bound: max((cpu_count + 1) // 4, 1)."""
    return max(((os.cpu_count() or 1) + 1) // 4, 1)


@dataclass(frozen=True)
class DispatchOptions:
    dump_mode: str
    api_list: tuple[str, ...]
    dump_path: Path
    tag: str | None
    process_num: int
    debug: bool
    background: bool | str = "auto"
    rule: str = "both"
    # which calls of each torch.compile graph are compared (probes/compiled): the first
    # `compiled_first`, then every `compiled_every`-th (0: none)
    compiled_first: int = 1
    compiled_every: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"dump_mode": self.dump_mode, "api_list": list(self.api_list), "dump_path": str(self.dump_path),
                "tag": self.tag, "process_num": self.process_num, "debug": self.debug, "background": self.background,
                "rule": self.rule, "compiled_first": self.compiled_first, "compiled_every": self.compiled_every}


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


def _check_api_list(api_list: Any, dump_mode: str) -> tuple[str, ...]:
    if api_list is None:
        api_list = []
    if not isinstance(api_list, (list, tuple)) or not all(isinstance(a, str) for a in api_list):
        raise ConfigError("api_list", api_list, "a list of aten op names (strings) such as [\"mm\", \"native_layer_norm\"]")
    if dump_mode == "list" and not api_list:
        raise ConfigError("api_list", api_list, 'a non-empty list of aten op names when dump_mode="list"',
                          hint='name the ops to dump, e.g. api_list=["mm"], or use dump_mode="auto"')
    if api_list:
        known = _aten_names()
        for name in api_list:
            if not _is_aten_op(name, known):
                hint = did_you_mean(name, sorted(known), otherwise=(
                    "names are aten op packets without overload, as in dir(torch.ops.aten): \"mm\", \"add\", \"add_\""))
                raise ConfigError("api_list", name, "an aten op name", hint=hint)
    return tuple(api_list)


def _check_dump_path(dump_path: Any) -> Path:
    if dump_path is None or not isinstance(dump_path, (str, os.PathLike)) or str(dump_path) == "":
        raise ConfigError("dump_path", dump_path, "a directory path (str or path-like) where results are written",
                          hint="e.g. dump_path=\"./online_dispatch\"")
    path = Path(dump_path).expanduser().resolve()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError("dump_path", str(dump_path), "a directory that exists or can be created",
                          hint=f"{type(exc).__name__}: {exc}") from None
    if not path.is_dir() or not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError("dump_path", str(dump_path), "a writable directory")
    return path


def validate(dump_mode: Any, api_list: Any, dump_path: Any, tag: Any, process_num: Any, debug: Any,
             background: Any = "auto", rule: Any = "both", compiled_first: Any = 1,
             compiled_every: Any = 0) -> DispatchOptions:
    if not isinstance(dump_mode, str) or dump_mode not in DUMP_MODES:
        raise ConfigError("dump_mode", dump_mode, "one of " + ", ".join(f'"{m}"' for m in DUMP_MODES),
                          hint=did_you_mean(dump_mode, DUMP_MODES, n=1) if isinstance(dump_mode, str) else "")
    if not isinstance(debug, bool):
        raise ConfigError("debug", debug, "True or False")
    if not isinstance(background, bool) and background != "auto":
        raise ConfigError("background", background, '"auto", True or False',
                          hint="True compares in a background thread while the program goes on, False inline, "
                               '"auto" picks the thread when it can overlap (an accelerator, or idle CPU cores)')
    if not isinstance(rule, str) or rule not in ONLINE_DISPATCH_RULES:
        raise ConfigError("rule", rule, "one of " + ", ".join(f'"{r}"' for r in ONLINE_DISPATCH_RULES),
                          hint='"both" fails an output when either rule fails it, "reference" applies msprobe\'s '
                               'documented Cosine/MaxAbsErr rule alone, "scaled" the dtype-aware error at the '
                               "output's scale alone")
    if tag is not None and (not isinstance(tag, str) or not _TAG.match(tag)):
        raise ConfigError("tag", tag, "None or a string of letters, digits, '_' and '-'")
    limit = max_process_num()
    if isinstance(process_num, bool) or not isinstance(process_num, int) or not 0 <= process_num <= limit:
        raise ConfigError("process_num", process_num,
                          f"an integer from 0 to {limit} (max((cpu_count + 1) // 4, 1) on this machine)",
                          hint="0 compares in this process")
    names = _check_api_list(api_list, dump_mode)
    if names and dump_mode != "list":
        logger.warning('online_dispatch: api_list is used only with dump_mode="list" (dump_mode=%r)', dump_mode)
    first = non_negative_int("compiled_first", compiled_first, 1)
    every = non_negative_int("compiled_every", compiled_every, 0)
    path = _check_dump_path(dump_path)
    return DispatchOptions(dump_mode, names, path, tag, process_num, debug, background, rule, first, every)
