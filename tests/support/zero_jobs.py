"""Per-rank jobs of the DeepSpeed ZeRO grad_probe tests (module-level, so spawned ranks import them).

One job trains tests/support/engines.py's MLP (with its small head) under DeepSpeed ZeRO stages 1, 2 and 3
in turn, in the same processes (one launch: DeepSpeed's import and start-up are the slow part): per
stage a run without the probe, one with grad_probe attached as a user attaches it, and optionally
one with a seeded sign flip, or with the FP8 health columns on a gradient with a seeded outlier. Each run counts the collectives issued through torch.distributed,
DeepSpeed's own included, from before the probe starts.

The environment DeepSpeed needs here is set inside the job: the CPU accelerator, and no
shared-memory all-reduce op (DeepSpeed compiles it with the system C++ compiler at its first
start, and only its inference all-reduce uses it; the build directory is a fresh temporary one so
the test can tell that nothing was compiled).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import engines
import torch
from multirank_jobs import CollectiveCounter

STEPS = 2
LR = 1e-2
#: the parameter and rank of the seeded sign flip, as the tests expect it
FLIP = ("l2.weight", 1, 1)  # (parameter, rank, step)
#: (parameter, rank): on that rank only, the probe cannot read its part of that gradient
FAIL = ("l2.weight", 1)
#: a clipping norm below the gradients' (about 0.13), so that clipping changes them
CLIP = 0.05
#: the formats of the run with grad_probe's FP8 health columns on
FP8 = ["float8_e5m2", "float8_e4m3fn"]
#: (parameter, value): in that run, at the last step, element 0 of the parameter's gradient is
#: set to the value (on the rank that holds it): an outlier, at whose scale the rest underflows
OUTLIER = ("l2.weight", 100.0)


def _deepspeed() -> Any:
    os.environ["DS_ACCELERATOR"] = "cpu"
    os.environ["TORCH_EXTENSIONS_DIR"] = tempfile.mkdtemp(prefix="zero_jobs_ext_")
    import deepspeed
    import deepspeed.ops

    # build_shm_op asks this table whether to compile the op; leaving it out keeps CI compiler-free
    deepspeed.ops.__dict__.setdefault("__compatible_ops__", {})["deepspeed_shm_comm"] = False
    return deepspeed


#: the runs of every stage: name -> options of _train (probe: written to {root}/stage{S}_{name})
RUNS: dict[str, dict[str, Any]] = {
    "plain": {"probe": False},
    "probed": {},
    "flipped": {"flip": True},
    "two_groups": {"groups": 2},  # DeepSpeed steps its inner optimizer once per group
    "clipped": {"clip": CLIP},  # DeepSpeed's clipping, inside engine.step()
    "two_groups_clipped": {"groups": 2, "clip": CLIP},  # the second group is read before its clipping
    "rank1": {"ranks": [1]},
    "attached_first": {"attach_first": True},  # the probe attached before deepspeed.initialize
    "slice_fails": {"fail": FAIL},
    "fp8": {"fp8": FP8, "outlier": True},  # each rank counts its part at the full parameter's amax
}


def ds_config(stage: int, clip: float | None = None) -> dict[str, Any]:
    world = torch.distributed.get_world_size()
    config = {"train_batch_size": engines.GLOBAL_BATCH, "train_micro_batch_size_per_gpu": engines.GLOBAL_BATCH // world,
              "gradient_accumulation_steps": 1, "zero_optimization": {"stage": stage},
              "zero_allow_untested_optimizer": True, "steps_per_print": 10**9, "wall_clock_breakdown": False}
    if clip is not None:
        config["gradient_clipping"] = clip
    return config


def param_groups(model: torch.nn.Module, groups: int) -> list[dict[str, Any]]:
    """One group, or two (weights, biases) with their own weight decay, as trainers often make."""
    if groups == 1:
        return [{"params": list(model.parameters())}]
    named = list(model.named_parameters())
    return [{"params": [p for n, p in named if n.endswith("weight")], "weight_decay": 0.1},
            {"params": [p for n, p in named if not n.endswith("weight")], "weight_decay": 0.0}]


def reference(dump: str | None, level: str = "L2", groups: int = 1, clip: float | None = None,
              fp8: list[str] | None = None, outlier: bool = False) -> list[float]:
    """The single-process run DeepSpeed's must equal: the same model, global batch and optimizer
    (and the same clipping, before the step)."""
    model = engines.build("plain", head=True)
    debugger = _attach(dump, model, level, fp8=fp8) if dump is not None else None
    opt = torch.optim.AdamW(param_groups(model, groups), lr=LR)
    losses = []
    try:
        for step in range(STEPS):
            loss = model(engines.global_batch(step)).square().mean()
            loss.backward()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            if outlier and step == STEPS - 1:
                dict(model.named_parameters())[OUTLIER[0]].grad.view(-1)[0] = OUTLIER[1]
            opt.step()
            opt.zero_grad()
            losses.append(float(loss.detach()))
    finally:
        if debugger is not None:
            debugger.stop()
    return losses


def _attach(dump: str, model: torch.nn.Module, level: str, ranks: list[int] | None = None,
            fp8: list[str] | None = None) -> Any:
    from probes.pytorch import PrecisionDebugger

    config: dict[str, Any] = {"task": "grad_probe", "dump_path": dump, "grad_probe": {"grad_level": level}}
    if ranks is not None:
        config["rank"] = ranks
    if fp8 is not None:
        config["grad_probe"]["fp8_health"] = fp8
    debugger = PrecisionDebugger(config=config, model=model)
    debugger.monitor(model)
    return debugger


def _flip_hook(stage: int, engine: Any, model: torch.nn.Module) -> Any:
    """A step pre-hook, registered before the probe's, that negates this rank's part of
    FLIP's parameter gradient at FLIP's step (a defect on one rank's partition only)."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    name, rank, at = FLIP
    p = dict(model.named_parameters())[name]
    zero = engine.optimizer
    calls = [0]

    def hook(_opt: Any, _args: Any, _kwargs: Any) -> None:
        step, calls[0] = calls[0], calls[0] + 1
        if step != at or torch.distributed.get_rank() != rank:
            return
        if stage == 3:
            group, start, count = zero.grad_position[zero.get_param_id(p)]
            zero.fp32_partitioned_groups_flat[group].grad.narrow(0, start, count).neg_()
        else:
            hp = p._hp_mapping.hp_fragment_address
            zero.single_partition_of_fp32_groups[p._hp_mapping.param_group_index].grad.narrow(
                0, hp.start, hp.numel).neg_()

    return register_optimizer_step_pre_hook(hook)


def _outlier_hook(model: torch.nn.Module) -> Any:
    """A step pre-hook, registered before the probe's, that sets OUTLIER's element in this
    rank's part of the gradient at the last step, when this rank's part holds it."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    from probes.backends import torch_zero

    name, value = OUTLIER
    p = dict(model.named_parameters())[name]
    calls = [0]

    def hook(_opt: Any, _args: Any, _kwargs: Any) -> None:
        step, calls[0] = calls[0], calls[0] + 1
        part = torch_zero.ZERO_PARAMS.slice(p) if step == STEPS - 1 else None
        if part is not None and part.index.start == 0 and part.local.numel():
            part.local.view(-1)[0] = value

    return register_optimizer_step_pre_hook(hook)


def _failing_slice(params: Any, broken: torch.Tensor) -> None:
    """Make ``params.slice`` raise for ``broken`` on this rank (undone by removing the attribute)."""
    read = type(params).slice

    def failing(p: Any) -> Any:
        if p is broken:
            raise RuntimeError("seeded: this rank's part cannot be read")
        return read(params, p)

    params.slice = failing


def _train(deepspeed: Any, stage: int, dump: str | None, level: str, probe: bool = True, flip: bool = False,
           groups: int = 1, clip: float | None = None, ranks: list[int] | None = None,
           attach_first: bool = False, fail: tuple[str, int] | None = None,
           fp8: list[str] | None = None, outlier: bool = False) -> dict[str, Any]:
    import torch.distributed as dist

    from probes.backends import torch_zero

    model = engines.build("plain", head=True)
    counter = CollectiveCounter()
    debugger = None
    seeded_handle = None
    try:
        if probe and attach_first:
            debugger = _attach(dump, model, level, ranks, fp8)
        engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(param_groups(model, groups), lr=LR),
                                          config=ds_config(stage, clip))
        if flip:
            seeded_handle = _flip_hook(stage, engine, model)
        if outlier:
            seeded_handle = _outlier_hook(model)
        if probe and not attach_first:
            debugger = _attach(dump, model, level, ranks, fp8)
        if fail is not None and dist.get_rank() == fail[1]:
            _failing_slice(torch_zero.ZERO_PARAMS, dict(model.named_parameters())[fail[0]])
        counter.calls.clear()  # from here on: the steps, DeepSpeed's collectives and the probe's
        losses = []
        for step in range(STEPS):
            loss = engine(engines.batch("ddp", step)).square().mean()  # this rank's slice of the batch
            engine.backward(loss)
            engine.step()
            losses.append(float(loss.detach()))
    finally:
        calls = counter.restore()
        if debugger is not None:
            debugger.stop()
        if seeded_handle is not None:
            seeded_handle.remove()
        vars(torch_zero.ZERO_PARAMS).pop("slice", None)
    return {"rank": dist.get_rank(), "losses": losses, "calls": calls}


def zero_job(root: str, stages: tuple[int, ...] = (1, 2, 3), runs: tuple[str, ...] = tuple(RUNS),
             level: str = "L2") -> dict[str, Any]:
    """Every run of ``runs`` (see RUNS) under each stage of ``stages``, in that order; a probed
    run writes to ``{root}/stage{S}_{name}``. Returns {stage: {run: its losses and collectives}}
    and ``compiled``: the files DeepSpeed's op builds left (none: nothing was compiled)."""
    deepspeed = _deepspeed()
    out: dict[Any, Any] = {}
    for stage in stages:
        out[stage] = {name: _train(deepspeed, stage, f"{root}/stage{stage}_{name}", level, **RUNS[name])
                      for name in runs}
    out["compiled"] = sorted(str(p) for p in Path(os.environ["TORCH_EXTENSIONS_DIR"]).rglob("*") if p.is_file())
    return out
