"""The PyTorch gradient monitor: per-parameter gradient statistics just before each optimizer step.

``GradMonitor(config, model_or_params, optimizers=None)`` writes, for every selected step,
``{dump_path}/rank{R}/grad_summary_{N}.csv`` (and at L1/L2 ``rank{R}/step{N}/{param}.npy``) in the
reference's format (see :mod:`probes.grad_probe.csv_format`), plus ``rank{R}/summary.json``.

Differences from msprobe 8.3.3:

* Only the model's own optimizers are hooked (the reference hooked every optimizer of the process,
  for good, so other optimizers and repeated ``monitor()`` calls advanced its step). With ``optimizers=`` given, each gets an
  ``optimizer.register_step_pre_hook``; otherwise one global step pre-hook is installed whose
  handler ignores every optimizer holding none of the monitored parameters. Steps are counted per
  optimizer. **Step number with several optimizers:** the monitor's step N is the number of
  ``step()`` calls already entered by the *lead* optimizer, the first of the model's optimizers
  that stepped; the statistics of all selected parameters are taken in the lead's pre-hook, and
  the other optimizers' steps only advance their own counters. So a model with one optimizer per
  layer gives steps 0, 1, 2 … once per iteration, not once per optimizer. Calling ``monitor()``
  again adds parameters/optimizers without adding hooks; :meth:`GradMonitor.stop` removes every
  hook handle.
* The rank is resolved at the first hook call, not at ``monitor()`` time (where, before
  ``init_process_group``, every rank wrote ``rank0``). The rank filter
  applies whether or not a process group exists (rank 0 without one), as for free_benchmark.
* Statistics in float64 on the gradient's device (not in the gradient's dtype rounded to float32),
  one host transfer per device per step; empty gradients give a row of NaN statistics instead of
  an exception.
* A parameter whose gradient is None is logged once (not every step); it has no CSV row
  and is listed per step in ``summary.json`` ``params_without_grad``.
* ``param_list`` names matching no parameter raise ConfigError with close matches (the reference
  ignores them silently).
* Errors inside the hook are recorded in ``summary.json`` ``errors`` and never reach the training
  loop unless ``config.strict``.
* ``param.main_grad`` (Megatron-style fp32 main gradient) is read when present and not None,
  else ``param.grad``. Sparse gradients are densified first.
"""

from __future__ import annotations

import logging
import math
import sys
import weakref
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from probes.backends import torch_shards, torch_xp
from probes.backends.torch_backend import BACKEND, widest_float
from probes.core.config import ProbeConfig
from probes.core.errors import ProbeError
from probes.grad_probe import csv_format, stats
from probes.grad_probe.monitor_common import MAX_ERRORS, SUMMARY_INTERVAL_S, MonitorBase, check_param_list  # noqa: F401 - MAX_ERRORS, SUMMARY_INTERVAL_S re-exported

__all__ = ["GradMonitor"]

log = logging.getLogger("probes.grad_probe")


class GradMonitor(MonitorBase):
    """Gradient statistics of a model's parameters, taken just before each optimizer step.

    ``model_or_params``: an ``nn.Module`` (its ``named_parameters()``), an ``Optimizer`` (its
    parameters, and that optimizer is the one hooked), a mapping name -> parameter, or an iterable
    of ``(name, parameter)`` pairs or of bare parameters (named by position). ``optimizers``: an
    optimizer or a list of them to hook; None = find the model's optimizers when they step.
    """

    framework = "pytorch"

    def __init__(
        self,
        config: ProbeConfig,
        model_or_params: Any = None,
        optimizers: Any = None,
        *,
        backend: Any = BACKEND,
    ) -> None:
        self._init_common(config)
        self.backend = backend

        self._names: dict[int, str] = {}  # id(param) -> name, every registered parameter
        self._params: list[tuple[str, torch.Tensor]] = []  # every registered parameter, in order
        self._explicit: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()
        self._owner_cache: weakref.WeakKeyDictionary[torch.optim.Optimizer, bool] = weakref.WeakKeyDictionary()
        self._counts: weakref.WeakKeyDictionary[torch.optim.Optimizer, int] = weakref.WeakKeyDictionary()
        self._lead: weakref.ref[torch.optim.Optimizer] | None = None
        self._handles: list[Any] = []
        self._global_handle: Any = None
        self._logged_none: set[str] = set()

        if model_or_params is not None or optimizers is not None:
            self.monitor(model_or_params, optimizers)

    # ------------------------------------------------------------------ setup
    def monitor(
        self, model_or_params: Any = None, optimizers: Any = None, *, names_from: Any = None, hook: bool = True
    ) -> GradMonitor:
        """Add parameters and/or optimizers and make sure the hooks are installed (once).

        ``names_from``: an ``nn.Module`` whose ``named_parameters()`` name the parameters of an
        optimizer passed as ``model_or_params`` (otherwise they are called ``group{g}.param{i}``).
        ``hook=False``: register the parameters only; the caller already sees the optimizer's
        steps (a global hook of its own) and calls :meth:`on_step`.
        """
        if self._closed:
            raise ProbeError("this GradMonitor was stopped; create a new one")
        opts = _as_optimizers(optimizers)
        if isinstance(model_or_params, torch.optim.Optimizer):
            opts.insert(0, model_or_params)
            named = self._optimizer_params(model_or_params, names_from)
        else:
            named = _named_params(model_or_params)
        known = {id(p) for _, p in self._params}
        for name, p in named:
            if id(p) not in known:
                known.add(id(p))
                self._params.append((name, p))
                self._names[id(p)] = name
        self._check_param_list()
        self._owner_cache = weakref.WeakKeyDictionary()  # ownership may have changed
        if not hook:
            self._activate()
            return self
        for opt in opts:
            if opt not in self._explicit:
                self._explicit.add(opt)
                self._handles.append(opt.register_step_pre_hook(self._optimizer_hook))
        if not opts and not len(self._explicit) and self._global_handle is None:
            self._global_handle = register_optimizer_step_pre_hook(self._global_hook)
        self._activate()
        return self

    def _optimizer_params(self, opt: torch.optim.Optimizer, names_from: Any = None) -> list[tuple[str, torch.Tensor]]:
        """An optimizer's parameters, named from ``names_from`` (a module) or earlier registrations
        when possible, else ``group{g}.param{i}``; in ``names_from`` order when it is given."""
        names = dict(self._names)
        order: dict[int, int] = {}
        if isinstance(names_from, torch.nn.Module):
            for k, (n, p) in enumerate(names_from.named_parameters()):
                names.setdefault(id(p), n)
                order.setdefault(id(p), k)
        out = []
        for g, group in enumerate(opt.param_groups):
            for i, p in enumerate(group["params"]):
                out.append((names.get(id(p), f"group{g}.param{i}"), p))
        if order:
            out.sort(key=lambda item: order.get(id(item[1]), len(order)))
        return out

    def _check_param_list(self) -> None:
        check_param_list(self.gp.param_list, [n for n, _ in self._params])

    @property
    def selected(self) -> list[tuple[str, torch.Tensor]]:
        """The monitored (name, parameter) pairs, in registration order."""
        if not self.gp.param_list:
            return list(self._params)
        wanted = set(self.gp.param_list)
        return [(n, p) for n, p in self._params if n in wanted]

    # ------------------------------------------------------------------ hooks
    def _global_hook(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if optimizer in self._explicit:  # it has its own hook
            return
        owns = self._owner_cache.get(optimizer)
        if owns is None:
            owns = any(id(p) in self._names for group in optimizer.param_groups for p in group["params"])
            if not owns and "deepspeed" in sys.modules:  # ZeRO steps flat partitions of the parameters
                from probes.backends import torch_zero

                owns = torch_zero.steps_for(optimizer, [p for _n, p in self._params])
            self._owner_cache[optimizer] = owns
        if owns and not ("deepspeed" in sys.modules and _zero_continues(optimizer)):
            self.on_step(optimizer)

    def _optimizer_hook(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.on_step(optimizer)

    def on_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Take the statistics of a step ``optimizer`` is about to make (its step pre-hook)."""
        if self._closed:
            return
        count = self._counts.get(optimizer, -1) + 1
        self._counts[optimizer] = count
        lead = self._lead() if self._lead is not None else None
        if lead is None:
            self._lead = weakref.ref(optimizer)
        elif lead is not optimizer:
            return
        self.current_step = count
        try:
            if self.rank is None:
                self.rank = int(self.backend.rank())
            if not self.config.selects_step(count):
                return
            if self.config.selects_rank(self.rank):
                self._dump(count)
            elif any(partitioning(p) is not None for _n, p in self.selected):
                # a rank the filter leaves out still adds its slices to the figures the others write
                self._dump(count, write=False)
        except Exception as exc:  # never break the training loop unless strict
            self._record_error(count, None, exc)
            if self.config.strict:
                raise self._strict_failure(count, exc) from exc

    # ------------------------------------------------------------------ one step
    def _dump(self, step: int, write: bool = True) -> None:
        """Take and write one step's figures. ``write=False``: only this rank's share of the sharded
        parameters' collective (a rank the rank filter leaves out: the others wait for it)."""
        rank = self.rank or 0
        grads: list[tuple[str, torch.Tensor]] = []
        sharded: list[tuple[str, torch.Tensor]] = []
        missing: list[str] = []
        with torch.no_grad():
            for name, p in self.selected:
                if partitioning(p) is not None:
                    sharded.append((name, p))
                    continue
                if not write:
                    continue
                g = _grad_of(p)
                if g is None:
                    missing.append(name)
                    if name not in self._logged_none:
                        self._logged_none.add(name)
                        log.info("grad_probe: parameter %s has no gradient at step %d (logged once)", name, step)
                    continue
                try:
                    g = g.detach()
                    if not g.is_floating_point():
                        raise TypeError(f"gradient of dtype {g.dtype} is not a real floating-point tensor")
                    if g.layout != torch.strided:
                        g = g.to_dense()
                    grads.append((name, g))
                except Exception as exc:
                    if self.config.strict:
                        raise  # recorded once, by on_step
                    self._record_error(step, name, exc)
            blocks = self._blocks(step, grads)
            if sharded:
                blocks += self._sharded_blocks(step, sharded)
            if not write:
                return
            host = _to_host_packed([(block.columns, block.payload) for block in blocks])
        level, root, bounds, histogram = self.level, self._root, self.bounds, self.histogram
        fp8_width = len(stats.FP8_HEALTH_FIGURES) * len(self.fp8_formats)
        records, directions, slices = [], [], {}
        for block, (rows, payload) in zip(blocks, host):
            offset = 0
            for (name, shape, local_shape, numel, index), row in zip(block.members, rows):
                data = payload[offset : offset + numel]
                offset += numel
                if block.sharded:
                    row, had, failed = row[:-2], row[-2], row[-1]
                    if failed:
                        self._record_error(step, name, ProbeError(
                            f"the figures of {int(failed)} rank(s)' slices of this sharded gradient failed"))
                        continue
                    if not had:
                        missing.append(name)
                        continue
                md5 = None
                if level == "L0":
                    md5 = stats.crc32_hex(data)  # of this rank's slice, for a sharded parameter
                elif numel or not block.sharded:
                    directions.append((csv_format.direction_file(root, rank, step, name), data.reshape(local_shape)))
                    if block.sharded:
                        slices[name] = csv_format.slice_entry(shape, index)
                records.append(stats.split_stats(name, shape, row, bounds, histogram, md5, fp8_width))
        if len(blocks) > 1:  # the CSV's rows in the parameters' order
            order = {name: i for i, (name, _p) in enumerate(self.selected)}
            records.sort(key=lambda r: order[r.name])
            if sharded:
                missing.sort(key=lambda n: order[n])
        self._write_step(step, rank, missing, records, directions, slices)

    def _blocks(self, step: int, grads: list[tuple[str, torch.Tensor]]) -> list[_Block]:
        """The step's statistics on the gradients' devices, as blocks of parameters that share one
        statistics matrix and one flat payload (the float32 gradient at L0, for its checksum; its
        signs at L1/L2, for the direction file). Gradients of a device and dtype that are small
        enough are reduced together by batched kernels; a large or empty one on its own, chunk by
        chunk (stats.stat_vector). A batch that fails is taken again parameter by parameter, so
        only the parameters that really fail lose their row."""
        batches: dict[tuple[Any, Any], list[tuple[str, torch.Tensor]]] = {}  # the open batch of each (device, dtype)
        sizes: dict[tuple[Any, Any], int] = {}
        done: list[list[tuple[str, torch.Tensor]]] = []
        single: list[tuple[str, torch.Tensor]] = []
        for name, g in grads:
            n = g.numel()
            if n == 0 or n > stats.CHUNK_ELEMENTS:
                single.append((name, g))
                continue
            key = (g.device, g.dtype)
            group = batches.get(key)
            if group is None or sizes[key] + n > BATCH_ELEMENTS:
                group = batches[key] = []
                done.append(group)
                sizes[key] = 0
            sizes[key] += n
            group.append((name, g))
        blocks: list[_Block] = []
        for batch in done:
            try:
                blocks.append(self._block(batch, batched=True))
            except Exception:
                single += batch
        for name, g in single:
            try:
                blocks.append(self._block([(name, g)], batched=False))
            except Exception as exc:
                if self.config.strict:
                    raise  # recorded once, by on_step
                self._record_error(step, name, exc)
        return blocks

    def _block(self, batch: list[tuple[str, torch.Tensor]], batched: bool) -> _Block:
        gs = [g for _name, g in batch]
        xp = self.backend.namespace(gs[0])
        dtype = widest_float(gs[0].device)  # float64 where the device has it
        self._compute_dtypes.add(str(dtype).replace("torch.", ""))
        columns = stats.stat_columns(xp, gs, self.bounds, self.histogram, dtype=dtype,
                                     batched=torch_xp if batched else None)
        if self.fp8_formats:
            columns = torch.cat([columns, self._fp8_rows(xp, gs, dtype, gs[0].device)])
        flat = torch.cat([g.reshape(-1) for g in gs]) if len(gs) > 1 else gs[0].reshape(-1)
        payload = flat.to(dtype=torch.float32) if self.level == "L0" else flat > 0
        return _Block([(name, tuple(g.shape), tuple(g.shape), g.numel(), None) for name, g in batch], columns, payload)

    def _sharded_blocks(self, step: int, params: list[tuple[str, torch.Tensor]]) -> list[_Block]:
        """The figures of sharded (DTensor) parameters' full gradients, from this rank's slices and
        one exchange per process-group chain: every rank of the mesh calls this for the same
        parameters in the same order, and takes part in the exchange whatever happened to its own
        slices (a failure or a missing gradient is a neutral share, counted), so no rank ever waits
        in a collective another rank skipped. A block's columns end with two rows: how many ranks
        had the gradient and how many failed."""
        chains: dict[tuple[int, ...], tuple[tuple[Any, ...], list[Any]]] = {}
        for name, p in params:
            groups = partitioning(p).groups(p)
            entry = chains.setdefault(tuple(id(g) for g in groups), (groups, []))
            entry[1].append((name, p))
        blocks = []
        for groups, members in chains.values():
            blocks.append(self._sharded_block(step, groups, members))
        return blocks

    def _sharded_block(self, step: int, groups: tuple[Any, ...], members: list[tuple[str, torch.Tensor]]) -> _Block:
        device = _local_device(members[0][1])
        dtype = widest_float(device)
        self._compute_dtypes.add(str(dtype).replace("torch.", ""))
        xp = self.backend.namespace(torch.zeros(0, device=device))
        shares, pieces = [], []
        failure: BaseException | None = None
        for name, p in members:
            piece = None
            try:
                piece = partitioning(p).slice(p)
                if piece is not None:
                    local = piece.local
                    if not local.is_floating_point():
                        raise TypeError(f"gradient of dtype {local.dtype} is not a real floating-point tensor")
                    piece = piece._replace(local=local if local.layout == torch.strided else local.to_dense())
                shares.append(stats.SliceShare(piece.local if piece is not None and piece.counted else None,
                                               had=piece is not None))
            except Exception as exc:  # a neutral share, counted as failed: the exchange goes on
                log.debug("grad_probe: slice of %s failed at step %d: %r", name, step, exc)
                failure = failure or exc
                piece = None
                shares.append(stats.SliceShare(None, had=False, failed=True))
            pieces.append(piece)
        summed, maxed = stats.shard_figures(xp, shares, self.bounds, self.histogram, dtype, device,
                                            batched=None if self.histogram else torch_xp)
        fp8 = self.fp8_formats and dtype == torch.float64
        if fp8:  # the slices' finite amaxes, max-reduced with the extremes: the full gradient's amax
            amaxes = [self._fp8_share_amax(xp, share, dtype, device) for share in shares]
            maxed = torch.cat([maxed, torch.stack(amaxes).reshape(1, -1)])
        torch_shards.reduce_figures(summed, maxed, groups)
        fp8_rows = []
        if fp8:  # each rank counts its slices at the full amax's scale; a second exchange sums them
            counts = torch.stack([self._fp8_share_counts(xp, share, maxed[2, i], dtype, device)
                                  for i, share in enumerate(shares)], dim=1)
            torch_shards.reduce_figures(counts, None, groups)
            fp8_rows = [counts / torch.clamp(summed[1], min=1.0)]
        elif self.fp8_formats:
            fp8_rows = [self._fp8_rows(xp, [], dtype, device, len(members))]
        if failure is not None and self.config.strict:
            raise failure  # after the exchanges, which the other ranks are in too
        columns = torch.cat([stats.combine_shards(xp, summed, maxed, self.bounds, self.histogram), *fp8_rows,
                             summed[2:4]])
        out_members, payloads = [], []
        for (name, p), piece in zip(members, pieces):
            shape = piece.shape if piece is not None else tuple(int(s) for s in p.shape)
            local = piece.local if piece is not None else torch.zeros(0, device=device)
            keep = piece is not None and (self.level == "L0" or (piece.counted and piece.index is not None))
            flat = local.reshape(-1) if keep else local.reshape(-1)[:0]
            payloads.append(flat.to(dtype=torch.float32) if self.level == "L0" else flat > 0)
            out_members.append((name, shape, tuple(local.shape), flat.numel(), piece.index if piece else None))
        return _Block(out_members, columns, torch.cat(payloads), sharded=True)

    def _fp8_rows(self, xp: Any, gs: list[torch.Tensor], dtype: torch.dtype, device: torch.device,
                  n: int | None = None) -> torch.Tensor:
        """The FP8 health rows of whole gradients (stats.fp8_columns); NaN on a device without
        float64, where the scaled values cannot be counted in the precision the columns promise."""
        if dtype != torch.float64:
            width = len(stats.FP8_HEALTH_FIGURES) * len(self.fp8_formats)
            return torch.full((width, len(gs) if n is None else n), math.nan, dtype=dtype, device=device)
        return stats.fp8_columns(xp, gs, self.fp8_formats, dtype)

    def _fp8_share_amax(self, xp: Any, share: stats.SliceShare, dtype: torch.dtype,
                        device: torch.device) -> torch.Tensor:
        """One slice's finite amax, 0 for none (or when it fails: this rank must still exchange)."""
        if share.values is not None:
            try:
                return stats.fp8_amax(xp, share.values, dtype)
            except Exception as exc:
                log.debug("grad_probe: FP8 amax of a slice failed: %r", exc)
        return torch.zeros((), dtype=dtype, device=device)

    def _fp8_share_counts(self, xp: Any, share: stats.SliceShare, amax: torch.Tensor, dtype: torch.dtype,
                          device: torch.device) -> torch.Tensor:
        """One slice's FP8 counts at the full gradient's amax: zeros for a slice another rank counts,
        NaN when counting fails (the exchange goes on; the reduced cell reads nan)."""
        width = len(stats.FP8_HEALTH_FIGURES) * len(self.fp8_formats)
        if share.values is None:
            return torch.zeros(width, dtype=dtype, device=device)
        try:
            return stats.fp8_counts(xp, share.values, amax, self.fp8_formats, dtype)
        except Exception as exc:
            log.debug("grad_probe: FP8 counts of a slice failed: %r", exc)
            return torch.full((width,), math.nan, dtype=dtype, device=device)

    def _resolve_rank(self) -> int:
        return int(self.backend.rank())

    # ------------------------------------------------------------------ teardown
    def remove(self) -> None:
        """Remove every hook this monitor installed. Idempotent."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if self._global_handle is not None:
            self._global_handle.remove()
            self._global_handle = None

    @property
    def running(self) -> bool:
        return not self._closed and (bool(self._handles) or self._global_handle is not None)


# ---------------------------------------------------------------------- helpers
#: the most elements one batch of small gradients holds (its temporary copies stay below ~64 MiB)
BATCH_ELEMENTS = 1 << 24


class _Block(NamedTuple):
    # (name, shape, local shape, payload elements, slice index) of each parameter, in column order;
    # shape is the full parameter's, local shape and slice index what this rank holds of it
    members: list[tuple[str, tuple, tuple, int, Any]]
    columns: torch.Tensor  # (width, len(members)) statistics on the device, a column per parameter
    payload: torch.Tensor  # the members' flat payloads, concatenated
    sharded: bool = False  # columns end with the "had it" and "failed" counts (see _sharded_block)


def _to_host_packed(items: list[tuple[torch.Tensor, torch.Tensor]]) -> list[tuple[list[list[float]], Any]]:
    """(statistics rows, a list of floats per column, and the payload as a host array) of every
    (columns, payload) pair, from one host copy per device: every tensor's bytes are concatenated
    on the device and split on the host."""
    import numpy as np

    out: list[tuple[list[list[float]], Any]] = [([], None) for _ in items]
    by_device: dict[Any, list[int]] = {}
    for i, (columns, _payload) in enumerate(items):
        by_device.setdefault(columns.device, []).append(i)
    for idx in by_device.values():
        parts = []
        for i in idx:
            columns, payload = items[i]
            parts += [columns.reshape(-1).view(torch.uint8), payload.view(torch.uint8)]
        flat = torch.cat(parts).cpu().numpy()
        pos = 0
        for i in idx:
            columns, payload = items[i]
            n_col, n_pay = columns.numel() * columns.element_size(), payload.numel() * payload.element_size()
            figures = np.frombuffer(flat[pos : pos + n_col], dtype=_NUMPY[columns.dtype]).reshape(columns.shape)
            data = np.frombuffer(flat[pos + n_col : pos + n_col + n_pay], dtype=_NUMPY[payload.dtype])
            out[i] = (figures.T.astype(np.float64).tolist(), data)
            pos += n_col + n_pay
    return out


_NUMPY = {torch.float64: "float64", torch.float32: "float32", torch.bool: "bool"}


def partitioning(p: torch.Tensor) -> torch_shards.PartitionedParams | None:
    """The engine that splits parameter ``p`` across ranks (FSDP2 / tensor parallelism's DTensor,
    DeepSpeed ZeRO), or None for a parameter every rank holds whole."""
    if torch_shards.DTENSOR_PARAMS.owns(p):
        return torch_shards.DTENSOR_PARAMS
    if "deepspeed" in sys.modules:
        from probes.backends.torch_zero import ZERO_PARAMS

        if ZERO_PARAMS.owns(p):
            return ZERO_PARAMS
    return None


def _zero_continues(optimizer: torch.optim.Optimizer) -> bool:
    from probes.backends import torch_zero

    return torch_zero.continues_step(optimizer)


def _local_device(p: torch.Tensor) -> torch.device:
    local = getattr(p, "_local_tensor", None)
    return (local if local is not None else p).device


def _grad_of(p: torch.Tensor) -> torch.Tensor | None:
    g = getattr(p, "main_grad", None)
    return g if g is not None else p.grad


def _as_optimizers(optimizers: Any) -> list[torch.optim.Optimizer]:
    if optimizers is None:
        return []
    if isinstance(optimizers, torch.optim.Optimizer):
        return [optimizers]
    out = list(optimizers)
    for o in out:
        if not isinstance(o, torch.optim.Optimizer):
            raise TypeError(f"optimizers must be torch.optim.Optimizer instances, got {type(o).__name__}")
    return out


def _named_params(obj: Any) -> list[tuple[str, torch.Tensor]]:
    if obj is None:
        return []
    if isinstance(obj, torch.nn.Module):
        return list(obj.named_parameters())
    if isinstance(obj, torch.Tensor):
        return [("0", obj)]
    if isinstance(obj, Mapping):
        return [(str(k), v) for k, v in obj.items()]
    if isinstance(obj, Iterable):
        out = []
        for i, item in enumerate(obj):
            if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
                out.append((item[0], item[1]))
            elif isinstance(item, torch.Tensor):
                out.append((str(i), item))
            else:
                raise TypeError(f"expected (name, parameter) pairs or parameters, got {type(item).__name__}")
        return out
    raise TypeError(
        f"GradMonitor needs an nn.Module, an Optimizer, a mapping or an iterable of parameters, got {type(obj).__name__}"
    )
