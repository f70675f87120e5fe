"""torch_rerun.replayed is replay.replay over the torch backend's own methods, in one frame: the
same random numbers drawn by the re-run, the user's stream and grad mode put back, on success and
on error."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from probes.backends.torch_backend import BACKEND  # noqa: E402
from probes.free_benchmark import replay  # noqa: E402


class _Methods:
    """The backend as replay.replay sees it without `replayed`: its snapshot, restore and no_grad."""

    rng_snapshot = staticmethod(BACKEND.rng_snapshot)
    rng_restore = staticmethod(BACKEND.rng_restore)
    no_grad = staticmethod(BACKEND.no_grad)


def _run(backend, fails: bool) -> tuple[torch.Tensor | None, torch.Tensor, bool, bool]:
    torch.manual_seed(7)
    x = torch.randn(3, requires_grad=True)
    snapshot = BACKEND.rng_snapshot(())
    torch.rand(3)  # the user's call drew numbers: the re-run draws the same ones

    def rerun(t):
        drawn = torch.rand(3) + t
        if fails:
            raise ValueError("the re-run failed")
        return drawn, torch.is_grad_enabled()

    out, grad_inside = None, None
    try:
        out, grad_inside = replay.replay(backend, snapshot, rerun, (x,), {})
    except ValueError:
        pass
    return out, torch.rand(4), grad_inside, torch.is_grad_enabled()  # the stream goes on as without the re-run


@pytest.mark.parametrize("fails", [False, True])
def test_replayed_is_replay_over_the_backends_methods(fails):
    assert getattr(BACKEND, "replayed", None) is not None
    fast, general = _run(BACKEND, fails), _run(_Methods(), fails)
    for a, b in zip(fast, general, strict=True):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b)
        else:
            assert a == b
    assert fast[3] is True and (fails or fast[2] is False)
