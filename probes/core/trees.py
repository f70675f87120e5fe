"""Walking nested outputs and arguments (tuples, lists, dicts, named tuples, torch.return_types).

Framework-neutral: the caller says what a leaf is. Paths are tuples of indices/keys; the CSV's
output_index is the path joined with dots ("0", "1.values").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

Path = tuple[Any, ...]


def iter_leaves(tree: Any, path: Path = ()) -> Iterator[tuple[Path, Any]]:
    """Depth-first leaves with their paths; dict values in insertion order."""
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from iter_leaves(v, path + (k,))
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            yield from iter_leaves(v, path + (i,))
    else:
        yield path, tree


def rebuild(container: Any, items: list[Any]) -> Any:
    """A container of the same type holding `items` (tuple subclasses such as named tuples and
    torch.return_types structseqs keep their type)."""
    if isinstance(container, list):
        return list(items)
    kind = type(container)
    if kind is tuple:
        return tuple(items)
    if hasattr(container, "_fields"):  # namedtuple
        return kind(*items)
    try:
        return kind(items)  # structseq (torch.return_types.max) takes a sequence
    except TypeError:
        return tuple(items)


def tree_map(fn: Callable[[Any], Any], tree: Any) -> Any:
    """Apply fn to every leaf, rebuilding containers; returns the same object when nothing changed."""
    if isinstance(tree, dict):
        new = {k: tree_map(fn, v) for k, v in tree.items()}
        if all(new[k] is tree[k] for k in tree):
            return tree
        return type(tree)(new) if type(tree) is not dict else new
    if isinstance(tree, (list, tuple)):
        items = [tree_map(fn, v) for v in tree]
        if all(a is b for a, b in zip(items, tree)):
            return tree
        return rebuild(tree, items)
    return fn(tree)


def replace_at(tree: Any, path: Path, value: Any) -> Any:
    """A copy of `tree` with the leaf at `path` replaced; containers off the path are shared."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(tree, dict):
        new = dict(tree)
        new[head] = replace_at(tree[head], rest, value)
        return new if type(tree) is dict else type(tree)(new)
    items = list(tree)
    items[head] = replace_at(items[head], rest, value)
    return rebuild(tree, items)


def format_path(path: Path) -> str | int | None:
    """The CSV output_index: None for a bare leaf, the int for one level, dotted beyond."""
    if not path:
        return None
    if len(path) == 1 and isinstance(path[0], int):
        return path[0]
    return ".".join(str(p) for p in path)
