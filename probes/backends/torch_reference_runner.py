"""online_dispatch's reference runner: the float64 re-run of an op and its one-pass figures on a
native thread that never takes the GIL (torch_reference_runner.cpp), built on first use.

The probe's float64 re-runs are about twice the plain step on a CPU, so on a host with a core to
spare they are worth taking off the user's thread. A Python thread could not: every torch call
releases and retakes the GIL, and with the user's thread running Python between its ops, the two
threads handed the GIL over thousands of times a step (the reference thread made a Llama step
7.5x the plain one against 5.8x inline). The runner is a C++ thread: the user's thread submits the
overload, the reference's arguments (already float64 host copies) and the device's output leaves
in one call, and collects the reference output and the figures' sums later, in submission order;
the runner calls the op through the dispatcher as the OpOverload call does and takes the sums
with the host kernels' own function (passed by address), so the figures are the inline path's,
bit for bit.

The extension is compiled with torch.utils.cpp_extension (g++ and ninja, ~30 s on one core) in a
background thread the first time a process asks for it, in a folder of its own, and published in
the user's cache folder under a name made from the source and the torch and Python versions (an
atomic rename: processes and xdist workers share one build; two that start together both build).
Until it is ready, or without a compiler, or with MSPROBE_REFERENCE_RUNNER=0, `runner_module()` is
None and online_dispatch judges inline: the same rows.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.util
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from probes.backends import host_kernels

_SOURCE = Path(__file__).with_name("torch_reference_runner.cpp")
#: set to 0 (or off, false, no) to judge every op inline
SWITCH = "MSPROBE_REFERENCE_RUNNER"
log = logging.getLogger("probes.backends")
_state: dict[str, Any] = {}
_lock = threading.Lock()


#: why_not() while another process builds the extension (this one asks again at its next context)
ELSEWHERE = "being built by another process"
# a build marker older than this is a build that died with its process
_BUILD_SECONDS = 600


def runner_module(wait: bool = False) -> Any:
    """The compiled extension, or None: still building (started here the first time, in a
    background thread; `wait` waits for it, and for another process's build), or not to be had
    (`why_not`). While another process builds it, each call looks again."""
    while True:
        with _lock:
            if _state.get("why") == ELSEWHERE:  # that build may be done now
                _state.clear()
            if "module" not in _state:
                if os.environ.get(SWITCH, "1").strip().lower() in ("0", "off", "false", "no"):
                    _state["module"], _state["why"] = None, f"{SWITCH} switches it off"
                else:
                    _state["module"], _state["why"] = None, "building"
                    _state["builder"] = threading.Thread(target=_build, name="msprobe-runner-build", daemon=True)
                    _state["builder"].start()
            builder = _state.get("builder")
        if not wait:
            return _state["module"]
        if builder is not None:
            builder.join()
        if _state["module"] is not None or _state.get("why") != ELSEWHERE:
            return _state["module"]
        time.sleep(1.0)


def loaded() -> Any:
    """The extension if this process has loaded it, else None (never starts a build)."""
    return _state.get("module")


def why_not() -> str | None:
    """Why runner_module() is None ("building" while it builds; None once it is loaded)."""
    return _state.get("why", "not asked for")


def reset() -> None:
    """Forget the loaded extension (tests: the next runner_module() reads the switch again)."""
    with _lock:
        _state.clear()


def _build() -> None:
    try:
        module = _load()
    except Exception as exc:  # a probe never fails for want of a faster path
        _state["module"], _state["why"] = None, f"the reference runner could not be built or loaded: {exc!r}"
        log.info("probes: online_dispatch's reference runner not in use (%s); ops are judged inline", _state["why"])
        return
    _state["module"], _state["why"] = module, None if module is not None else ELSEWHERE


def _load() -> Any:
    """The extension, built here if no process has built it; None while another process builds it
    (a marker file beside the library says which: short test processes would otherwise each
    start a build of their own)."""
    import torch

    key = hashlib.sha256(b"\0".join([_SOURCE.read_bytes(), torch.__version__.encode(),
                                     sys.version.encode()])).hexdigest()[:16]
    name = f"msprobe_reference_runner_{key}"
    target = host_kernels.cache_folder() / f"{name}.so"
    if not target.exists():
        marker = target.with_suffix(".building")
        target.parent.mkdir(parents=True, exist_ok=True)
        if not _claim(marker):
            return None
        try:
            return _compile(name, target)
        finally:
            marker.unlink(missing_ok=True)
    spec = importlib.util.spec_from_file_location(name, target)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _claim(marker: Path) -> bool:
    """Create the build marker (with this process's id); False when a live process holds it."""
    for _ in range(2):
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            if _held(marker):
                return False
            marker.unlink(missing_ok=True)  # a build that died with its process
            continue
        with os.fdopen(fd, "w") as fh:
            fh.write(str(os.getpid()))
        return True
    return False


def _held(marker: Path) -> bool:
    try:
        pid = int(marker.read_text() or "0")
        age = time.time() - marker.stat().st_mtime
    except (OSError, ValueError):
        return True  # being written this moment
    if age > _BUILD_SECONDS or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def _compile(name: str, target: Path) -> Any:
    """Build in a folder of this process's own (torch's builder locks its folder with a file that
    a process killed mid-build would leave behind for every later one), then publish the library
    by an atomic rename: processes beside this one load either none or the whole of it."""
    from torch.utils import cpp_extension

    folder = target.parent
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("msprobe_reference_runner_*-build-*"):  # left by processes that did not finish
        if time.time() - old.stat().st_mtime > 3600:
            shutil.rmtree(old, ignore_errors=True)
    build = Path(tempfile.mkdtemp(prefix=f"{name}-build-", dir=folder))
    try:
        module = cpp_extension.load(name, [str(_SOURCE)], extra_cflags=["-O2"], build_directory=str(build),
                                    verbose=False)
        os.replace(build / f"{name}.so", target)
    finally:
        shutil.rmtree(build, ignore_errors=True)
    return module


_runners: dict[int, Any] = {}  # pid -> the process's runner (a forked child starts its own)


def _shared_runner(module: Any) -> Any:
    """The process's runner thread: started once (a thread's first ops cost milliseconds of
    set-up), idle between uses (waiting on a condition, no CPU), stopped at exit."""
    pid = os.getpid()
    with _lock:
        runner = _runners.get(pid)
        if runner is None:
            from probes.backends.torch_kernels import KERNEL_MAX_ELEMENTS

            addresses = host_kernels.dispatch_parts_addresses() or (0, 0, 0)
            runner = _runners[pid] = module.Runner(*addresses, KERNEL_MAX_ELEMENTS)
            atexit.register(_stop, pid)
    return runner


def _stop(pid: int) -> None:
    if os.getpid() == pid and pid in _runners:
        _runners.pop(pid).stop()


class ReferenceRunner:
    """One queue on the process's runner thread: ops submitted by one thread, collected by it in
    submission order (`submit`, `submit_python`, `ready`, `next`, `pending`)."""

    def __init__(self, module: Any) -> None:
        channel = module.Channel(_shared_runner(module))
        self.submit = channel.submit
        self.submit_python = channel.submit_python
        self.ready = channel.ready
        self.next = channel.next
        self.pending = channel.pending
        self._index = module.operator_index

    def index(self, func: Any) -> int:
        """The runners' index of an overload (the same for every runner of the process), -1 when
        the dispatcher does not know it by name."""
        schema = func._schema
        return self._index(schema.name, schema.overload_name)
