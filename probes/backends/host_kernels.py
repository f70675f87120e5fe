"""One-pass C kernels for the probes' hottest element-wise work on host memory, built on first use.

free_benchmark edits each checked call's input (add_noise / bit_noise: a band test and an add or
xor of the bit patterns) and measures each output pair (the ratio rule's max and min of
max(|a|, tol) / max(|b|, tol) and min of a*b; the scaled rule's max |a - b|; no_change's
equality). NumPy does each as two to nine passes with a temporary per pass (the band edit ~21 us
and the ratio figures ~50 us at 32K float32 elements on an AVX2 core); a loop that reads the
elements once does them in ~10 and ~15 us. On a small transformer's training step those passes
were a third of what add_noise added. online_dispatch measures each compared output against its
float64 reference: the difference's extrema and three sums, in one pass instead of six, without
a float64 copy of the difference (the sums in a fixed order of four partial sums, which
host_arrays.dispatch_parts gives without a compiler). grad_probe takes each CPU gradient's max,
min and sum of squares and writes its signs in one pass (its sum in eight partial sums;
host_figures.one_pass_figures without a compiler).

The kernels (host_kernels.c) are C99 with GCC/Clang vector types, compiled with the system's C
compiler the first time a process needs them, without -march or fast-math: every operation is
exact IEEE arithmetic, so every result is the one NumPy's passes give, on any CPU (tests compare
the two bit for bit). The library is kept in the user's cache folder under a name made from the
source, the flags, the compiler and the platform, and written there by an atomic rename, so
processes and xdist workers share one build (a library is never written in place: a process that
has it loaded keeps its mapping). Without a compiler, or when the build or the load fails, or with
MSPROBE_HOST_KERNELS=0, `kernels()` is None and the callers keep NumPy's passes: the same
results, slower. `why_not()` says which (and it is logged once, at INFO).
"""

from __future__ import annotations

import atexit
import ctypes
import hashlib
import logging
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

_SOURCE = Path(__file__).with_name("host_kernels.c")
_FLAGS = ("-O3", "-std=gnu99", "-fPIC", "-shared", "-ffp-contract=off")
#: set to 0 (or off, false, no) to keep NumPy's passes
SWITCH = "MSPROBE_HOST_KERNELS"
_P, _N = ctypes.c_void_p, ctypes.c_ssize_t
_UNSIGNED = {16: ctypes.c_uint16, 32: ctypes.c_uint32, 64: ctypes.c_uint64}
# edit_band's functions: (op, bit width) -> the C symbol
_BAND_NAMES = {(op, w): f"band_{short}_{w}" for op, short in (("add", "add"), ("bitwise_xor", "xor")) for w in (16, 32, 64)}
_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "ratio_figures_f32": (ctypes.c_int, [_P, _P, _N, ctypes.c_float, ctypes.POINTER(ctypes.c_double)]),
    "ratio_figures_f64": (ctypes.c_int, [_P, _P, _N, ctypes.c_double, ctypes.POINTER(ctypes.c_double)]),
    "max_abs_diff_f32": (ctypes.c_int, [_P, _P, _N, ctypes.POINTER(ctypes.c_double)]),
    "max_abs_diff_f64": (ctypes.c_int, [_P, _P, _N, ctypes.POINTER(ctypes.c_double)]),
    "all_equal_f32": (ctypes.c_int, [_P, _P, _N]),
    "all_equal_f64": (ctypes.c_int, [_P, _P, _N]),
    "all_equal_h16": (ctypes.c_int, [_P, _P, _N, ctypes.c_uint16]),
    "all_equal_bytes": (ctypes.c_int, [_P, _P, ctypes.c_size_t]),
    **{f"dispatch_parts_{kind}": (ctypes.c_int, [_P, _P, _N, ctypes.POINTER(ctypes.c_double)])
       for kind in ("f32", "f64", "bf16")},
    **{f"grad_figures_{kind}": (ctypes.c_int, [_P, _N, _P, ctypes.POINTER(ctypes.c_double)]) for kind in ("f32", "f64")},
    **{name: (None, [_P, _P, _N, _UNSIGNED[w], _UNSIGNED[w], _UNSIGNED[w]]) for (_op, w), name in _BAND_NAMES.items()},
}
_state: dict[str, Any] = {}
log = logging.getLogger("probes.backends")
# the figures' landing place, one per thread (ctypes releases the GIL during a call)
_OUT_TYPE = ctypes.c_double * 5
_per_thread = threading.local()


def kernels() -> Any:
    """The loaded library (its functions typed as in _SIGNATURES), or None: keep NumPy's passes."""
    if "lib" not in _state:
        try:
            _state["lib"], _state["why"] = _load()
        except Exception as exc:  # a probe never fails for want of a faster loop
            _state["lib"], _state["why"] = None, f"the kernels could not be built or loaded: {exc!r}"
        if _state["why"] is not None:
            log.info("probes: host kernels not in use (%s); NumPy's passes give the same results, slower",
                     _state["why"])
    return _state["lib"]


def ratio_figures(itemsize: int, a: int, b: int, n: int, tol: float) -> list[float] | None:
    """[max r, min r, min a*b] of n float32 (itemsize 4) or float64 (8) pairs at addresses a and b
    (the ratio rule's figures, NaN where NumPy's max or min would be), or None without kernels."""
    lib = kernels()
    if lib is None:
        return None
    out = _out()
    flags = (lib.ratio_figures_f32 if itemsize == 4 else lib.ratio_figures_f64)(a, b, n, tol, out)
    figures = out[:3]
    if flags & 1:
        figures[0] = figures[1] = math.nan
    if flags & 2:
        figures[2] = math.nan
    return figures


def max_abs_diff(itemsize: int, a: int, b: int, n: int) -> float | None:
    """max |a - b| over n float32 (itemsize 4) or float64 (8) pairs, the difference rounded to
    their dtype (NaN where a difference is), or None without kernels."""
    lib = kernels()
    if lib is None:
        return None
    out = _out()
    flags = (lib.max_abs_diff_f32 if itemsize == 4 else lib.max_abs_diff_f64)(a, b, n, out)
    return math.nan if flags else out[0]


def dispatch_parts(kind: str, dev: int, ref: int, n: int) -> list[float] | None:
    """[r.r, r.d, d.d, max d, min d] of n device elements at `dev` ("f32", "f64" or "bf16") and
    their float64 references at `ref`, d = dev - ref in float64, the sums in the order
    host_arrays.dispatch_parts gives (NaN max and min where some d is NaN), or None without kernels."""
    lib = kernels()
    if lib is None:
        return None
    out = _out()
    flags = _state["parts"][kind](dev, ref, n, out)
    parts = out[:]
    if flags:
        parts[3] = parts[4] = math.nan
    return parts


def dispatch_parts_addresses() -> tuple[int, int, int] | None:
    """The addresses of dispatch_parts' float32, float64 and bfloat16 functions (for the reference
    runner, which calls the same machine code off the GIL), or None without kernels."""
    if kernels() is None:
        return None
    parts = _state["parts"]
    return tuple(ctypes.cast(parts[kind], ctypes.c_void_p).value for kind in ("f32", "f64", "bf16"))


def grad_figures(itemsize: int, g: int, n: int, signs: int) -> list[float] | None:
    """[max, min, sum of squares] of n float32 (itemsize 4) or float64 (8) gradient elements at `g`
    (the squares in float64, summed in the order host_figures.one_pass_figures gives; NaN max and
    min where an element is NaN), their signs g > 0 written as n bytes at `signs`; None without
    kernels."""
    lib = kernels()
    if lib is None:
        return None
    out = _out()
    flags = (lib.grad_figures_f32 if itemsize == 4 else lib.grad_figures_f64)(g, n, signs, out)
    figures = out[:3]
    if flags:
        figures[0] = figures[1] = math.nan
    return figures


def _out() -> Any:
    out = getattr(_per_thread, "out", None)
    if out is None:
        out = _per_thread.out = _OUT_TYPE()
    return out


def edit_band(op: str, itemsize: int, src: int, dst: int, n: int, above: int, below: int) -> bool:
    """Write n elements of `itemsize` bytes (bit patterns of floats) from `src` to `dst`, each
    `op` ("add" or "bitwise_xor") 1 where above < its magnitude code < below; False without kernels."""
    lib = kernels()
    if lib is None:
        return False
    fn, mask = _state["band"][op, itemsize]
    fn(src, dst, n, mask, above, below)
    return True


def all_equal(kind: str, a: int, b: int, n: int) -> bool | None:
    """Whether n elements at addresses a and b are equal as `a == b` reads them (NaN differs from
    NaN, -0.0 equals 0.0), or None without kernels. kind: "f32", "f64", "f16" or "bf16" (their
    bit patterns), or "bytes" (n bytes: integers and bools)."""
    lib = kernels()
    if lib is None:
        return None
    if kind == "f32":
        return bool(lib.all_equal_f32(a, b, n))
    if kind == "f64":
        return bool(lib.all_equal_f64(a, b, n))
    if kind == "bytes":
        return bool(lib.all_equal_bytes(a, b, n))
    return bool(lib.all_equal_h16(a, b, n, 0x7C00 if kind == "f16" else 0x7F80))


def why_not() -> str | None:
    """Why kernels() is None (None when they are loaded)."""
    kernels()
    return _state["why"]


def reset() -> None:
    """Forget the loaded library, so the next kernels() reads the switch and builds again (tests)."""
    _state.clear()


def _load() -> tuple[Any, str | None]:
    if os.environ.get(SWITCH, "1").strip().lower() in ("0", "off", "false", "no"):
        return None, f"{SWITCH} switches them off"
    compiler = _compiler()
    if compiler is None:
        return None, "no C compiler found ($CC, cc, gcc or clang)"
    source = _SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([source, " ".join(compiler + list(_FLAGS)).encode(),
                                     sys.platform.encode(), os.uname().machine.encode()
                                     if hasattr(os, "uname") else b""])).hexdigest()[:16]
    name = f"host_kernels-{key}.so"
    try:
        target = _build(compiler, cache_folder(), name)
        lib = None if isinstance(target, str) else ctypes.CDLL(str(target))
    except OSError:  # no writable cache folder (a read-only home), or a cached build this machine
        # cannot load (a home shared with another system): a private folder of this process
        private = tempfile.mkdtemp(prefix="msprobe-kernels-")
        atexit.register(shutil.rmtree, private, True)  # (a loaded library may go: its mapping stays)
        target = _build(compiler, Path(private), name)
        lib = None if isinstance(target, str) else ctypes.CDLL(str(target))
    if lib is None:
        return None, target
    for symbol, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, symbol)
        fn.restype, fn.argtypes = restype, argtypes
    # edit_band's function and magnitude mask per (op, itemsize), looked up once
    _state["parts"] = {kind: getattr(lib, f"dispatch_parts_{kind}") for kind in ("f32", "f64", "bf16")}
    _state["band"] = {(op, w // 8): (getattr(lib, name), (1 << (w - 1)) - 1) for (op, w), name in _BAND_NAMES.items()}
    return lib, None


def _build(compiler: list[str], folder: Path, name: str) -> Path | str:
    """The library's path in `folder`, compiled there unless present; a str: why not."""
    target = folder / name
    if target.exists():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
    os.close(fd)
    try:
        done = subprocess.run([*compiler, *_FLAGS, "-o", tmp, str(_SOURCE)], capture_output=True, text=True,
                              timeout=120)
        if done.returncode != 0:
            return f"{' '.join(compiler)} failed: {done.stderr.strip()[-500:]}"
        os.replace(tmp, target)  # atomic: a process beside this one loads either build, whole
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def _compiler() -> list[str] | None:
    given = os.environ.get("CC")
    if given:
        return shlex.split(given)
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return [found]
    return None


def cache_folder() -> Path:
    """Where the probes keep what they compile (shared by processes and xdist workers)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pytest-msprobe"
