"""Matching two runs' parameter names that differ only by the modules wrappers put in front of a
model's own (DDP's ``module.``, torch.compile's ``_orig_mod.``, FSDP's and activation
checkpointing's), so that a wrapped run still compares with an unwrapped one.
"""

from __future__ import annotations

from collections.abc import Callable

from probes.grad_probe.dump_reader import StepCsv

#: module names that wrappers put in front of a model's own parameter names
WRAPPER_PREFIXES = ("module.", "_orig_mod.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")
_WRAPPER_PARTS = frozenset(p.rstrip(".") for p in WRAPPER_PREFIXES)


def unwrapped(name: str) -> str:
    """The name without wrapper components (``module.l1.weight`` -> ``l1.weight``; a component
    that merely contains one, ``submodule``, stays)."""
    *modules, leaf = name.split(".")
    return ".".join([p for p in modules if p not in _WRAPPER_PARTS] + [leaf])


def wrapper_aliases(names_a: list[str], names_b: list[str]) -> dict[str, str]:
    """{name in run b: name in run a} for parameters whose names differ only by wrapper prefixes,
    when that pairs them one to one (otherwise nothing is renamed)."""
    only_a, only_b = set(names_a) - set(names_b), set(names_b) - set(names_a)
    if not only_a or not only_b:
        return {}
    by_a = {unwrapped(n): n for n in only_a}
    by_b = {unwrapped(n): n for n in only_b}
    if len(by_a) != len(only_a) or len(by_b) != len(only_b):
        return {}
    return {n: by_a[unwrapped(n)] for n in names_b if n in only_b and unwrapped(n) in by_a}


def first_params(step_csv: Callable[[str, int], StepCsv | None], side: str, steps: list[int]) -> list[str]:
    """The parameters of a run's lowest numbered step that has a non-empty CSV: the names the
    aliases are made from."""
    for n in steps:
        c = step_csv(side, n)
        if c is not None and c.params:
            return c.params
    return []


def renamed_csv(c: StepCsv | None, aliases: dict[str, str]) -> StepCsv | None:
    """The CSV with run b's names read as run a's."""
    if c is None:
        return None
    return StepCsv([aliases.get(p, p) for p in c.params],
                   None if c.md5 is None else {aliases.get(p, p): v for p, v in c.md5.items()},
                   {aliases.get(p, p): v for p, v in c.shape.items()})
