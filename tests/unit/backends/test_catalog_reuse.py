"""The torch API catalog is read afresh for every probe, but its classifications and wrappers are
made once per process: a pytest session starts one probe per test."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from probes.backends.torch_apis import TorchApiPatcher, build_catalog


def _by_key(catalog):
    return {m.key: m for m in catalog}


def _passing(meta, original, args, kwargs):
    return original(*args, **kwargs)


def test_an_unchanged_api_keeps_its_meta_and_wrapper_across_catalogs():
    first = _by_key(build_catalog())
    patcher = TorchApiPatcher(tuple(first.values()))
    patcher.install(_passing)
    try:
        wrapper = F.gelu
    finally:
        patcher.uninstall()
    second = _by_key(build_catalog())
    assert second["Functional.gelu"] is first["Functional.gelu"]
    assert second["Functional.gelu"].wrapper is wrapper
    assert F.gelu is first["Functional.gelu"].original  # put back


def test_an_api_a_library_patched_since_is_read_again_and_its_patch_restored(monkeypatch):
    before = _by_key(build_catalog())["Functional.gelu"]

    def patched_gelu(x, approximate="none"):
        return before.original(x, approximate=approximate)

    monkeypatch.setattr(F, "gelu", patched_gelu)
    meta = _by_key(build_catalog())["Functional.gelu"]
    assert meta is not before and meta.original is patched_gelu
    seen = []
    patcher = TorchApiPatcher((meta,))
    patcher.install(lambda m, original, args, kwargs: seen.append(m.key) or original(*args, **kwargs))
    try:
        F.gelu(torch.ones(2))
    finally:
        patcher.uninstall()
    assert seen == ["Functional.gelu"]
    assert F.gelu is patched_gelu  # the library's function, not the one an earlier catalog saw


def test_a_catalog_built_while_the_wrappers_are_installed_restores_the_originals():
    catalog = build_catalog()
    patcher = TorchApiPatcher(catalog)
    patcher.install(_passing)
    try:
        during = _by_key(build_catalog())["Torch.matmul"]
    finally:
        patcher.uninstall()
    assert during.original is torch._C._VariableFunctions.matmul
    assert torch.matmul is torch._C._VariableFunctions.matmul


def test_the_catalog_is_handed_out_again_until_an_owner_gains_a_name(monkeypatch):
    first = build_catalog()
    assert build_catalog() is first

    def my_activation(x):
        return x * 2

    monkeypatch.setattr(F, "my_activation", my_activation, raising=False)
    grown = _by_key(build_catalog())
    assert grown["Functional.my_activation"].original is my_activation
