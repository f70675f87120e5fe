"""Golden-file regression: compare a run's precision results with ones stored under ``golden/``.

Modelled on pytest-regressions: one shared check routine serves every kind of result, a missing
golden fails with the command that creates it, ``--msprobe-regen-golden`` (``regen=True``) writes
the golden and fails the test once so that nobody accepts new figures without looking at them,
and a failure prints statistics (golden figure, new figure, allowed bound, counts), worst first.

Layout: ``{root}/{name}/meta.json`` (kind, the versions and device that made it, the hardware
identity it was measured on, the date) plus the kind's content files (see :mod:`pytest_msprobe.golden.kinds`). Every file is deterministic:
the same data gives the same bytes, so regenerating an unchanged golden leaves ``git diff``
empty. The date comes from ``SOURCE_DATE_EPOCH`` when set (the reproducible-builds convention),
and a regeneration that changes neither the content nor the versions keeps the files untouched.

Plugin-agnostic and framework-free (numpy only): the caller passes the torch/mindspore version
and the device in ``provenance``, the hardware identity (probes.backends.hardware) in ``hardware``.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

from probes.core.errors import ConfigError
from probes.core.versions import versions
from probes.core.writers import write_bytes_atomic, write_text_atomic
from pytest_msprobe.golden import kinds

META = "meta.json"
FORMAT_VERSION = 1
REGEN_OPTION = "--msprobe-regen-golden"
MAX_ITEM_LINES = 10
MAX_INFO_ITEMS = 5

_NAME_PART = re.compile(r"^[A-Za-z0-9._-]+$")
_NAME_MAX = 200
_NAME_ALLOWED = ("a relative path of letters, digits and . _ - separated by single '/' "
                 "(no '.' or '..' parts, no leading or trailing '/')")

PathLike = Union[str, "os.PathLike[str]"]


@dataclass
class GoldenOutcome:
    """What one golden check found. ``details`` is JSON-serialisable (summary.json, xdist)."""

    ok: bool
    regenerated: bool
    message: str
    details: dict[str, Any] = field(default_factory=dict)


def validate_name(name: object) -> str:
    """The golden's folder under the store root, as given; ConfigError unless it is a safe
    relative path (it becomes a directory name, so it must not climb out of the store)."""
    if not isinstance(name, str) or not name or len(name) > _NAME_MAX:
        raise ConfigError("golden name", name, _NAME_ALLOWED + f", 1 to {_NAME_MAX} characters")
    parts = name.split("/")
    if any(p in ("", ".", "..") or not _NAME_PART.match(p) for p in parts):
        raise ConfigError("golden name", name, _NAME_ALLOWED)
    return name


def base_versions() -> dict[str, str]:
    """The versions every golden records; the caller adds its framework and device."""
    return versions("numpy", "probes")


def describe_made_with(made_with: dict[str, Any]) -> str:
    """``torch 2.13.0 on cpu, python 3.11.7, numpy 2.4.6, probes 0.1.0``: the caller's entries
    first (they are what usually explains a difference), the device as ``on X``."""
    base = ("python", "numpy", "probes")
    device = made_with.get("device")
    extra = [f"{k} {v}" for k, v in sorted(made_with.items()) if k not in base and k != "device"]
    if device is not None:
        if extra:
            extra[-1] += f" on {device}"
        else:
            extra.append(f"on {device}")
    return ", ".join(extra + [f"{k} {made_with[k]}" for k in base if k in made_with])


class GoldenStore:
    """Golden files under ``root`` (``golden/`` beside the tests, usually)."""

    def __init__(self, root: PathLike, regen: bool = False, provenance: dict[str, Any] | None = None,
                 hardware: dict[str, str] | None = None) -> None:
        if provenance is not None and not isinstance(provenance, dict):
            raise ConfigError("provenance", provenance, "a dict such as {'torch': '2.13.0', 'device': 'cpu'} or None")
        for key, value in (provenance or {}).items():
            if not isinstance(key, str) or not isinstance(value, (str, int, float, bool)):
                raise ConfigError(f"provenance[{key!r}]", value, "a str key with a str or number value")
        self.root = Path(root)
        self.regen = bool(regen)
        self.made_with = {**base_versions(), **{k: str(v) for k, v in (provenance or {}).items()}}
        self.hardware = {str(k): str(v) for k, v in (hardware or {}).items()}

    def folder(self, name: str) -> Path:
        return self.root / validate_name(name)

    # -- the kinds, one line each: what users call ----------------------------------------
    def check_free_benchmark(self, name: str, apis: dict[str, Any], margin: float = kinds.FB_MARGIN,
                             margin_abs: float = kinds.FB_MARGIN_ABS) -> GoldenOutcome:
        """Per-API worst max_rel against the golden's (rule: :func:`pytest_msprobe.golden.kinds.fb_bound`)."""
        return self.check("free_benchmark", name, apis, margin=margin, margin_abs=margin_abs)

    def check_grad_run(self, name: str, dump_dir: PathLike, first_step_min: float = kinds.FIRST_STEP_MIN,
                       max_drop: float = kinds.MAX_DROP, rtol: float = kinds.GRAD_RTOL,
                       atol: float = kinds.GRAD_ATOL) -> GoldenOutcome:
        """A grad_probe dump (rank folder or dump root, every rank) against the golden run: gradient
        directions by the 0.97/0.03 rule, max/min/norm within ``atol + rtol * |golden|``."""
        return self.check("grad_probe", name, dump_dir, first_step_min=first_step_min, max_drop=max_drop, rtol=rtol,
                          atol=atol)

    def check_online_dispatch(self, name: str, failing_ops: list[dict[str, Any]]) -> GoldenOutcome:
        """Failing ops against the golden's: a failing op the golden does not list fails."""
        return self.check("online_dispatch", name, failing_ops)

    # -- the shared routine ----------------------------------------------------------------
    def check(self, kind: str | kinds.Kind, name: str, result: Any, **options: Any) -> GoldenOutcome:
        """`result` (what the kind's snapshot reads: a free_benchmark ``apis`` dict, a grad_probe
        dump folder, failing ops) against golden `name`. `kind` is a task name
        (:data:`pytest_msprobe.golden.kinds.KINDS`) or a Kind; `options` are the kind's (margins,
        tolerances), validated before the result is read. Under ``regen`` the golden is written
        instead, and the outcome fails so that new figures are looked at before they are trusted."""
        kind = kinds.kind_for(kind)
        if kind.snapshot is None or kind.compare is None:
            raise TypeError(f"golden kind {kind.name!r} is written, not checked: it has no snapshot or compare")
        settings = kind.options(**options)
        snapshot = kind.snapshot(result)
        folder = self.folder(name)
        shown = _shown_path(folder)
        details: dict[str, Any] = {"name": name, "kind": kind.name, "path": str(folder), "this_run": self.made_with}
        if self.regen:
            changed = self._write(name, folder, kind, snapshot)
            note = "" if changed else " (unchanged: identical content and versions)"
            return GoldenOutcome(False, True, f"golden {name} written to {shown}/{note}; rerun without {REGEN_OPTION}",
                                 dict(details, changed=changed))
        meta_path = folder / META
        if not meta_path.is_file():
            return GoldenOutcome(False, False, (
                f"golden {name} ({kind.name}) not found: {shown}/{META} does not exist.\n"
                f"Create it: run pytest {REGEN_OPTION} (this test fails once while it writes {shown}/), "
                f"then review and commit {shown}/."), dict(details, missing=True))
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            if meta.get("kind") != kind.name:
                return GoldenOutcome(False, False, (
                    f"golden {name} holds a {meta.get('kind')!r} result, but this check is {kind.name!r}: use "
                    f"another name, or rerun with {REGEN_OPTION} to replace it."), dict(details, golden_kind=meta.get("kind")))
            golden = kind.load(folder)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return GoldenOutcome(False, False, (
                f"golden {name}: cannot read {shown}/: {type(exc).__name__}: {exc}\n"
                f"Rewrite it with pytest {REGEN_OPTION}, then review and commit {shown}/."), dict(details, unreadable=str(exc)))
        judged: kinds.Comparison = kind.compare(golden, snapshot, **settings)
        made_with = meta.get("made_with", {})
        details.update(made_with=made_with, created=meta.get("created"), counts=judged.counts, rule=judged.rule,
                       failures=[f.to_dict() for f in judged.failures], info=judged.info, data=judged.data)
        provenance = (f"golden made with {describe_made_with(made_with)} ({meta.get('created', 'date unknown')}); "
                      f"this run: {'the same' if made_with == self.made_with else describe_made_with(self.made_with)}"
                      + _hardware_note(meta.get("hardware"), self.hardware))
        info_line = []
        if judged.info:
            more = f"; and {len(judged.info) - MAX_INFO_ITEMS} more" if len(judged.info) > MAX_INFO_ITEMS else ""
            info_line = [f"also (not failures): {'; '.join(judged.info[:MAX_INFO_ITEMS])}{more}"]
        if not judged.failures:
            lines = [f"golden {name} ({kind.name}): {judged.headline}", *info_line, provenance]
            return GoldenOutcome(True, False, "\n".join(lines), details)
        lines = [f"golden {name} ({kind.name}) regressed: {judged.headline}"]
        ordered = sorted(judged.failures, key=lambda f: f.rank, reverse=True)
        lines += [f"  {f.text}" for f in ordered[:MAX_ITEM_LINES]]
        if len(ordered) > MAX_ITEM_LINES:
            lines.append(f"  ... and {len(ordered) - MAX_ITEM_LINES} more (details['failures'])")
        lines.append(f"rule: {judged.rule}")
        lines += info_line
        lines.append(provenance)
        lines.append(f"golden: {shown}/ ; if the change is intended: pytest {REGEN_OPTION}, then review and commit "
                     f"{shown}/")
        return GoldenOutcome(False, False, "\n".join(lines), details)

    def write(self, name: str, kind: kinds.Kind, snapshot: Any) -> bool:
        """Write golden `name` of `kind` now (a session-level golden such as the API catalogue's,
        gathered from many tests); False when content and versions were already the same."""
        return self._write(name, self.folder(name), kind, snapshot)

    def _write(self, name: str, folder: Path, kind: kinds.Kind, snapshot: Any) -> bool:
        """Write content files then meta.json (each atomically, so a reader that sees the new
        meta sees the new content); False when nothing had to change. Other files in the folder
        (nested goldens such as ``name/sub``) are left alone; the previous version's own files
        that this one no longer has are removed."""
        files = kind.render(snapshot)
        meta_path = folder / META
        old_meta: dict[str, Any] = {}
        if meta_path.is_file():
            try:
                old_meta = json.loads(meta_path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                old_meta = {}
        same_content = (old_meta.get("kind") == kind.name and old_meta.get("made_with") == self.made_with
                        and old_meta.get("hardware", {}) == self.hardware
                        and old_meta.get("files") == sorted(files)
                        and all(_read_bytes(folder / f) == data for f, data in files.items()))
        if same_content:
            return False
        meta = {"format": FORMAT_VERSION, "name": name, "kind": kind.name, "created": _today(),
                "made_with": self.made_with, "files": sorted(files)}
        if self.hardware:
            meta["hardware"] = self.hardware
        folder.mkdir(parents=True, exist_ok=True)
        for fname, data in sorted(files.items()):
            write_bytes_atomic(folder / fname, data)
        for stale in old_meta.get("files", []) if isinstance(old_meta.get("files"), list) else []:
            if isinstance(stale, str) and stale not in files and _NAME_PART.match(stale) and stale != META:
                try:
                    (folder / stale).unlink()
                except OSError:
                    pass
        write_text_atomic(meta_path, json.dumps(meta, indent=2, sort_keys=True) + "\n")
        return True


def _hardware_note(golden: Any, this: dict[str, str]) -> str:
    """'; measured on another machine: ...' when the golden's hardware identity is not this run's."""
    if not this or not isinstance(golden, dict) or golden.get("key") == this.get("key"):
        return ""
    return (f"; measured on another machine: {golden.get('description', golden.get('key', 'unrecorded'))}, "
            f"this one: {this.get('description', this.get('key'))}")


def _today() -> str:
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if epoch and epoch.strip().isdigit():
        return _dt.datetime.fromtimestamp(int(epoch), _dt.timezone.utc).date().isoformat()
    return _dt.datetime.now(_dt.timezone.utc).date().isoformat()


def _read_bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def _shown_path(path: Path) -> str:
    """Relative to the working directory when below it (what the user types), else absolute."""
    try:
        return path.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except (ValueError, OSError):
        return path.as_posix()
