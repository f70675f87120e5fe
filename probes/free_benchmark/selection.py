"""Which calls free_benchmark checks: msprobe's `scope` (exact call names) and `list`
(substrings of them), decided once per API where the call counter cannot change the answer, so
the per-call path of an unselected API builds no name."""

from __future__ import annotations

import itertools
import logging
import re
from collections.abc import Collection, Iterable

from probes.core.errors import ConfigError
from probes.core.hints import did_you_mean
from probes.free_benchmark.backward import PASS_ENTRIES

log = logging.getLogger("probes.free_benchmark")

_CALL_INDEX = re.compile(r"\.\d+$")

# the excluded casts whose FP8 results get their range use recorded (the values before the cast
# are only at hand there)
FP8_CASTS = frozenset({"Tensor.to"})


class Selection:
    """msprobe's scope/list filter: scope = exact full names, list = substrings of them."""

    def __init__(self, scope: tuple[str, ...], api_list: tuple[str, ...], stage: str = "forward") -> None:
        self.suffix = "." + stage  # names are {key}.{index}.{stage}
        self.scope = frozenset(scope)
        self.scope_keys = frozenset(s.rsplit(".", 2)[0] for s in scope)
        self.api_list = api_list
        self.plain = tuple(e for e in api_list if not any(c.isdigit() for c in e))
        self.counted = tuple(e for e in api_list if any(c.isdigit() for c in e))
        self._cache: dict[str, bool | None] = {}
        if stage == "backward":  # never False: the hooks must see the passes they run and the FP8 casts
            self._cache.update(dict.fromkeys(PASS_ENTRIES | FP8_CASTS))  # of their matmuls (backward.py)

    def static(self, key: str) -> bool | None:
        """True/False when the decision is the same for every call of the API, None when the
        call counter matters."""
        if key in self._cache:
            return self._cache[key]
        if self.scope:
            decision: bool | None = None if key in self.scope_keys else False
        elif not self.api_list:
            decision = True
        elif any(e in key + "." or e in self.suffix for e in self.plain):
            decision = True
        else:
            decision = None if self.counted else False
        self._cache[key] = decision
        return decision

    def selects(self, key: str, name: str) -> bool:
        decision = self.static(key)
        if decision is not None:
            return decision
        if self.scope:
            return name in self.scope
        return any(e in name for e in self.counted)

    def unmatched(self, keys: list[str]) -> list[str]:
        """list/scope entries that can select no API of the catalog (typos)."""
        bad = []
        for e in self.api_list:
            probe = _CALL_INDEX.sub("", e.split(".forward")[0].split(".backward")[0])  # softsign.1 -> softsign
            if not any(e in k + "." or e in self.suffix or probe in k + "." or k.startswith(probe) for k in keys):
                bad.append(e)
        for s in self.scope:
            if s.rsplit(".", 2)[0] not in keys:
                bad.append(s)
        return bad


def reject_unmatched(key: str, unmatched: Iterable[str], names: Collection[str], allowed: str, example: str,
                     cutoff: float = 0.6) -> None:
    """Refuse the first `list`/`scope` entry (under config `key`) that selects no API: a typo
    would otherwise check nothing and pass. The error says what `allowed` entries are and suggests
    the closest of `names` (the call's stage left off), else shows an `example`."""
    for entry in unmatched:
        hint = did_you_mean(entry.split(".forward")[0], names, cutoff=cutoff, otherwise=example)
        raise ConfigError(key, entry, allowed, hint)


def note_never_rerun(selected: Iterable[tuple[str, str]], most: int = 20) -> None:
    """Log the selected APIs that are excluded anyway (name, reason), so a user who listed one is
    told why it has no row; a broad substring list stops at `most`."""
    for name, reason in itertools.islice(selected, most):
        log.info("free_benchmark: %s is selected but is never re-run: %s", name, reason)
