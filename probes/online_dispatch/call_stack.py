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
_gettrace = sys.gettrace


def capture_stack() -> Any:
    """The user's frames (outside torch and this package), outermost first, without their source
    lines: cheap enough to take at every op whose judgement is deferred. Where this process has
    loaded the reference runner's extension they are walked in C and kept as code objects and
    instruction offsets, whose line numbers only a failing row reads (`frames_of`); while a trace
    function is set (a debugger, coverage) the lines are read at once, as the frames report them."""
    native = torch_reference_runner.loaded()
    if native is not None:
        if _gettrace() is None:
            return native.user_code_frames(sys._getframe(1), _SKIPPED)
        return native.user_frames(sys._getframe(1), _SKIPPED)
    return python_capture_stack(sys._getframe(1))


def frames_of(stack: Any) -> tuple[tuple[str, int, str], ...]:
    """((file, line, function), ...) of what capture_stack took."""
    return stack if isinstance(stack, tuple) else stack.resolve()


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


def format_stack(frames: Any) -> str:
    """The CSV's NPU_Stack_Info: [[file, line, function, source line], ...]."""
    return str([[fn, line, name, linecache.getline(fn, line).strip()] for fn, line, name in frames_of(frames)])


def user_stack() -> str:
    return format_stack(capture_stack())
