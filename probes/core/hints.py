"""Close-match hints for a mistyped name, so every error that rejects a name suggests the same way.

A wrong case is the commonest slip (``BF16``, ``Softmax``): it is matched exactly before the fuzzy
search. Dotted names (``torch.nn.functional.sofmax``) are also matched on their last part, and the
suggestion keeps the user's own prefix when a candidate has that spelling, so a hint reads like
what the user wrote.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["close_matches", "did_you_mean"]


def close_matches(word: str, candidates: Iterable[str], n: int = 3, cutoff: float = 0.6) -> list[str]:
    """Up to `n` candidates close to `word`, best first: same name ignoring case, then difflib's
    ratio over the whole name, then over the last dotted part."""
    pool = list(dict.fromkeys(candidates))
    if not isinstance(word, str) or not pool:
        return []
    folded = word.strip().lower()
    found = [c for c in pool if c.lower() == folded]
    found += difflib.get_close_matches(word, pool, n=n, cutoff=cutoff)
    if "." in word:
        by_last: dict[str, list[str]] = {}
        for c in pool:
            by_last.setdefault(c.rsplit(".", 1)[-1], []).append(c)
        prefix = word.rsplit(".", 1)[0].lower()
        for last in difflib.get_close_matches(word.rsplit(".", 1)[-1], list(by_last), n=n, cutoff=cutoff):
            # the user's own spelling of the prefix first: torch.nn.functional.sofmax -> torch.nn.functional.softmax
            found += sorted(by_last[last], key=lambda c: c.rsplit(".", 1)[0].lower() != prefix)
    return list(dict.fromkeys(found))[:n]


def did_you_mean(word: str, candidates: Iterable[str], n: int = 3, cutoff: float = 0.6, otherwise: str = "") -> str:
    """``did you mean "a" or "b"?`` for the close matches, else `otherwise`."""
    close = close_matches(word, candidates, n=n, cutoff=cutoff)
    if not close:
        return otherwise
    return "did you mean " + " or ".join(f'"{c}"' for c in close) + "?"
