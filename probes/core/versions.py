"""The versions a result depends on, read one way for every file that records them (goldens,
summary.json, reports): a module's own ``__version__`` when it is imported (what actually ran),
else the installed distribution's metadata; libraries that are neither are left out."""

from __future__ import annotations

import platform
import sys
from importlib import metadata

__all__ = ["FRAMEWORKS", "imported_frameworks", "versions"]

#: the frameworks (and the NPU adapter) whose version decides a number
FRAMEWORKS = ("torch", "mindspore", "torch_npu")


def imported_frameworks() -> list[str]:
    """The frameworks this process has imported: only those can have made its numbers."""
    return [m for m in FRAMEWORKS if m in sys.modules]


def versions(*names: str, python: bool = True) -> dict[str, str]:
    """``{"python": ..., name: version, ...}`` for the named modules or distributions."""
    out = {"python": platform.python_version()} if python else {}
    for name in names:
        module = sys.modules.get(name)
        version = getattr(module, "__version__", None) if module is not None else None
        if version is None:
            try:
                version = metadata.version(name)
            except metadata.PackageNotFoundError:
                continue
        out[name] = str(version)
    return out
