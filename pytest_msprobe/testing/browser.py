"""Headless Chromium for tests of an HTML page: the way report.html's own test checks that the page
really displays (a picture of the requested size that is not blank), which no parser can tell.

The browser forks helper processes (zygote, GPU, renderers) that outlive a plain kill of the
main one; a run that does not finish in time is killed with its whole process group.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from probes.core.errors import ConfigError

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
SCREENSHOT_TIMEOUT_S = 60.0


def find_chromium() -> str | None:
    """The first Chromium-like browser on PATH, or None."""
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def screenshot(html_path: str | os.PathLike[str], png_path: str | os.PathLike[str], width: int = 1280,
               height: int = 2000, timeout: float = SCREENSHOT_TIMEOUT_S, browser: str | None = None) -> Path:
    """Render ``html_path`` in headless Chromium into a ``width`` x ``height`` PNG.

    Raises FileNotFoundError when no browser is found, TimeoutError when it does not finish in
    ``timeout`` seconds (the browser and its helper processes are killed), RuntimeError when it
    writes no picture.
    """
    for key, value in (("width", width), ("height", height)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= 16384:
            raise ConfigError(key, value, "an integer in [1, 16384] (pixels)")
    exe = browser or find_chromium()
    if exe is None:
        raise FileNotFoundError(f"no headless Chromium on PATH (looked for {', '.join(CHROMIUM_NAMES)}); "
                                "install one, e.g. `apt-get install chromium`")
    png = Path(png_path).resolve()
    png.parent.mkdir(parents=True, exist_ok=True)
    if png.exists():
        png.unlink()  # a stale picture must not pass for a new one
    uri = Path(html_path).resolve().as_uri()
    with tempfile.TemporaryDirectory(prefix="msprobe-chromium-") as profile:
        cmd = [exe, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars", "--no-first-run",
               "--no-default-browser-check", "--disable-extensions", "--force-device-scale-factor=1",
               f"--user-data-dir={profile}", f"--screenshot={png}", f"--window-size={width},{height}", uri]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=(os.name == "posix"))
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_tree(proc)
            raise TimeoutError(f"{exe} did not finish the screenshot of {uri} in {timeout} s") from None
    if not png.is_file():
        tail = err.decode("utf-8", "replace").strip()[-2000:]
        raise RuntimeError(f"{exe} exited with {proc.returncode} and wrote no screenshot to {png}:\n{tail}")
    return png


def _kill_tree(proc: subprocess.Popen) -> None:
    """Kill the session the browser leads (its helpers with it), then reap it."""
    try:
        if os.name == "posix":
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
    except ProcessLookupError:
        pass
    proc.communicate()
