"""Which public torch namespaces free_benchmark hooks (issue 13 part 3): torch.masked among them."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from probes.backends import api_exclusions
from probes.backends.torch_apis import build_catalog
from probes.pytorch import PrecisionDebugger


def _catalog() -> dict[str, object]:
    return {m.key: m for m in build_catalog()}


def test_catalog_covers_the_public_math_namespaces():
    cat = _catalog()
    for key in (
        "Torch.masked.softmax", "Torch.masked.log_softmax", "Torch.masked.normalize", "Torch.masked.sum",
        "Torch.masked.mean", "Torch.masked.var", "Torch.masked.std", "Torch.masked.norm",
        "Torch.masked.logsumexp", "Torch.masked.amax",
        "Torch.linalg.norm", "Torch.linalg.solve", "Torch.fft.fft", "Torch.fft.rfft", "Torch.special.erf",
        "Torch.special.logsumexp", "Functional.gelu", "Functional.softmax", "Functional.layer_norm",
        "Torch.matmul", "Tensor.__add__", "Tensor.softmax",
    ):
        assert key in cat, key
        assert cat[key].exclusion is None, (key, cat[key].exclusion)
    assert len(cat) == len(build_catalog())  # names are unique: qualified, no collisions (not torch.norm vs torch.linalg.norm)


def test_masked_constructors_and_accessors_are_not_rerun():
    cat = _catalog()
    assert cat["Torch.masked.masked_tensor"].exclusion == api_exclusions.DATA_MOVEMENT
    assert cat["Torch.masked.as_masked_tensor"].exclusion == api_exclusions.DATA_MOVEMENT
    assert cat["Torch.masked.is_masked_tensor"].exclusion == api_exclusions.ACCESSOR
    assert not any(k.startswith("Torch.masked.MaskedTensor") or k == "Torch.masked.maskedtensor" for k in cat)


def test_masked_softmax_is_checked_in_bf16_and_hooks_are_restored(fb_config):
    originals = {n: getattr(torch.masked, n) for n in ("softmax", "log_softmax", "normalize", "sum")}
    x = torch.randn(4, 33, dtype=torch.bfloat16) * 4
    mask = torch.rand(4, 33) > 0.3

    dbg = PrecisionDebugger(config=fb_config(pert_mode="improve_precision"))
    dbg.start()
    assert torch.masked.softmax is not originals["softmax"]  # wrapped while running
    out = torch.masked.softmax(x, -1, mask=mask)
    torch.masked.log_softmax(x, -1, mask=mask)
    torch.masked.normalize(x, 2.0, -1, mask=mask)
    torch.masked.sum(x, -1, mask=mask)
    dbg.stop()

    for n, fn in originals.items():
        assert getattr(torch.masked, n) is fn
    summary = dbg.summary()
    apis = summary["apis"]
    for key in ("Torch.masked.softmax", "Torch.masked.log_softmax", "Torch.masked.normalize", "Torch.masked.sum"):
        assert apis[key]["checked"] >= 1, (key, apis.get(key))
        assert apis[key]["dtypes"] == ["torch.bfloat16"]
    # outermost only: the torch/Tensor calls made inside torch.masked are not checked separately
    assert set(apis) == {"Torch.masked.softmax", "Torch.masked.log_softmax", "Torch.masked.normalize",
                         "Torch.masked.sum"}
    assert summary["errors"] == []
    # check mode returns the original result
    assert torch.equal(out, originals["softmax"](x, -1, mask=mask))


def test_masked_names_are_selectable_by_list(fb_config):
    x = torch.randn(3, 20, dtype=torch.bfloat16)
    mask = torch.ones(3, 20, dtype=torch.bool)
    dbg = PrecisionDebugger(config=fb_config(pert_mode="improve_precision", list=["masked.softmax"]))
    with dbg:
        torch.masked.softmax(x, -1, mask=mask)
        F.softmax(x, -1)
        torch.masked.log_softmax(x, -1, mask=mask)
    assert set(dbg.summary()["apis"]) == {"Torch.masked.softmax"}
