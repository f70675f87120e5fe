"""The user's frames of an op call, for a failing row's NPU_Stack_Info.

Taking the frames and formatting them are apart because a deferred op (judged in the reference
thread or a worker) must take its frames when it runs, on the user's thread, while only a failing
op pays for reading the source lines.
"""

from __future__ import annotations

import linecache
import os
import sys
from typing import Any

import torch

from probes.backends import torch_reference_runner

_TORCH_DIR = os.path.dirname(torch.__file__)
_PROBES_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SKIPPED = (_TORCH_DIR, _PROBES_DIR)


def capture_stack() -> tuple[tuple[str, int, str], ...]:
    """The user's frames (outside torch and this package), outermost first, without their source
    lines: cheap enough to take at every op whose judgement is deferred (walked in C by the
    reference runner's extension where this process has loaded it: the same frames)."""
    native = torch_reference_runner.loaded()
    if native is not None:
        return native.user_frames(sys._getframe(1), _SKIPPED)
    return python_capture_stack(sys._getframe(1))


def python_capture_stack(f: Any) -> tuple[tuple[str, int, str], ...]:
    """capture_stack's walk from frame `f` outwards, in Python."""
    frames = []
    while f is not None:
        filename = f.f_code.co_filename
        if not filename.startswith(_SKIPPED):
            frames.append((filename, f.f_lineno, f.f_code.co_name))
        f = f.f_back
    frames.reverse()
    return tuple(frames)


def format_stack(frames: tuple[tuple[str, int, str], ...]) -> str:
    """The CSV's NPU_Stack_Info: [[file, line, function, source line], ...]."""
    return str([[fn, line, name, linecache.getline(fn, line).strip()] for fn, line, name in frames])


def user_stack() -> str:
    return format_stack(capture_stack())
