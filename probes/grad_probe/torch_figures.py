"""PyTorch's part of a grad_probe step (:class:`~probes.grad_probe.step_files.StepFigures`): the
figures are taken on the gradients' devices, small gradients batched into one kernel per device
and dtype, sharded (DTensor, ZeRO) parameters from this rank's slices and one exchange per
process-group chain, and everything comes to the host in one copy per device: grad_probe runs at
every optimizer step, so its cost is a few kernels and one transfer however many parameters.
"""

from __future__ import annotations

import logging
import math
import sys
from contextlib import AbstractContextManager
from typing import Any, NamedTuple

import numpy as np
import torch

from probes.backends import torch_shards, torch_xp
from probes.backends.torch_backend import widest_float
from probes.grad_probe import stats
from probes.grad_probe.host_figures import HOST_FIGURES_ELEMENTS, Squares, host_figures, one_pass_figures
from probes.grad_probe.monitor_common import MonitorBase
from probes.grad_probe.step_files import StepFigure
from probes.grad_probe.torch_signs import host_view, signs

__all__ = ["BATCH_ELEMENTS", "Block", "TorchStepFigures", "grad_of", "local_device", "partitioning", "to_host_packed"]

log = logging.getLogger("probes.grad_probe")

#: the most elements one batch of small gradients holds (its temporary copies stay below ~64 MiB)
BATCH_ELEMENTS = 1 << 24
#: NumPy takes the figures of a batch of CPU gradients averaging fewer elements than this
#: (host_figures): its calls cost a microsecond where torch's cost several, but it passes over the
#: gradients more often (a copy end to end, the extrema, the float64 squares) than torch's two
#: batched kernels. Measured: ~90 us a step less on a 6-parameter MLP (1,150 elements on average),
#: ~370 us more on a 2-layer Llama (22k)
HOST_FIGURES_AVERAGE = 4096


class Block(NamedTuple):
    """Parameters whose figures share one statistics matrix and one flat payload, so a step costs
    a few kernels and one host copy, not some per parameter."""

    # (name, shape, local shape, payload elements, slice index) of each parameter, in column order;
    # shape is the full parameter's, local shape and slice index what this rank holds of it
    members: list[tuple[str, tuple, tuple, int, Any]]
    # (width, len(members)) statistics on the device, a column per parameter; or, taken on the host
    # (host_figures), their rows
    columns: torch.Tensor | list[list[float]]
    payload: Any  # the members' flat payloads, concatenated (a torch tensor, or a host array)
    sharded: bool = False  # columns end with the "had it" and "failed" counts (see _sharded_block)


class TorchStepFigures:
    """One step of a PyTorch monitor (``GradMonitor``): its config and book-keeping are the
    monitor's; ``logged_none`` is the monitor's set of parameters already logged without a gradient,
    ``squares`` its buffer for host figures."""

    def __init__(self, monitor: MonitorBase, backend: Any, logged_none: set[str], squares: Squares) -> None:
        self.monitor = monitor
        self.backend = backend
        self.logged_none = logged_none
        self.squares = squares
        self.level = monitor.level
        self.zero = "deepspeed" in sys.modules  # ZeRO partitions plain parameters

    def computing(self) -> AbstractContextManager[Any]:
        return torch.no_grad()

    def partitioned(self, p: torch.Tensor) -> bool:
        if type(p) in _WHOLE and not self.zero:  # not a DTensor (nn.Parameter keeps a DTensor's type)
            return False
        return partitioning(p) is not None

    def gradient(self, name: str, p: torch.Tensor) -> torch.Tensor | None:
        return grad_of(p)

    def no_gradient(self, step: int, name: str) -> None:
        if name not in self.logged_none:
            self.logged_none.add(name)
            log.info("grad_probe: parameter %s has no gradient at step %d (logged once)", name, step)

    def take(self, name: str, g: torch.Tensor) -> tuple[str, torch.Tensor]:
        if g.requires_grad:
            g = g.detach()
        if not g.is_floating_point():
            raise TypeError(f"gradient of dtype {g.dtype} is not a real floating-point tensor")
        if g.layout != torch.strided:
            g = g.to_dense()
        return name, g

    def measure(self, step: int, taken: list[tuple[str, torch.Tensor]],
                sharded: list[tuple[str, torch.Tensor]]) -> list[Block]:
        blocks = self._blocks(step, taken)
        if sharded:
            blocks += self._sharded_blocks(step, sharded)
        return blocks

    def to_host(self, measured: list[Block]) -> list[list[StepFigure]]:
        host = to_host_packed([(block.columns, block.payload) for block in measured])
        l0 = self.level == "L0"
        groups = []
        for block, (rows, payload) in zip(measured, host):
            offset = 0
            group = []
            for (name, shape, local_shape, numel, index), row in zip(block.members, rows):
                data = payload[offset : offset + numel]
                offset += numel
                if not block.sharded:
                    group.append(StepFigure(name, shape, row, data if l0 else data.reshape(local_shape)))
                    continue
                # a rank that holds no counted slice writes no direction file of it
                kept = data if l0 else data.reshape(local_shape) if numel else None
                group.append(StepFigure(name, shape, row[:-2], kept, True, index, row[-2], row[-1]))
            groups.append(group)
        return groups

    # ------------------------------------------------------------------ whole gradients
    def _blocks(self, step: int, grads: list[tuple[str, torch.Tensor]]) -> list[Block]:
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
        blocks: list[Block] = []
        for batch in done:
            try:
                parts = host_parts(batch)
                if parts is not None:
                    blocks += [self._host_block(p) for p in parts]
                elif self.level == "L1" and not self.monitor.fp8_formats and all(host_view(g, _ONE_PASS) for _n, g in batch):
                    blocks.append(self._host_block(batch, one_pass=True))
                else:
                    blocks.append(self._block(batch, batched=True))
            except Exception:
                single += batch
        for name, g in single:
            try:
                blocks.append(self._block([(name, g)], batched=False))
            except Exception as exc:
                if self.monitor.config.strict:
                    raise  # recorded once, by on_step
                self.monitor.record_error(step, name, exc)
        return blocks

    def _host_block(self, batch: list[tuple[str, torch.Tensor]], one_pass: bool = False) -> Block:
        mon = self.monitor
        gs = [g for _name, g in batch]
        views = [g.numpy().reshape(-1) for g in gs]
        rows, payload = one_pass_figures(views) if one_pass else host_figures(
            views, self.squares, self.level == "L0", mon.bounds if mon.histogram else None)
        for row, g in zip(rows, gs):
            if row[0] == 0.0 or row[1] == 0.0:  # which signed zero: the device path's kernels say
                row[:2] = [float(g.double().amax()), float(g.double().amin())] if mon.histogram else [
                    float(v) for v in reversed(g.aminmax())]
        if mon.fp8_formats:
            fp8 = self._fp8_rows(self.backend.namespace(gs[0]), gs, torch.float64, gs[0].device)
            for row, health in zip(rows, fp8.T.tolist()):
                row += health
        mon.compute_dtypes.add("float64")
        return Block([(name, tuple(g.shape), tuple(g.shape), g.numel(), None) for name, g in batch], rows, payload)

    def _block(self, batch: list[tuple[str, torch.Tensor]], batched: bool) -> Block:
        mon = self.monitor
        gs = [g for _name, g in batch]
        xp = self.backend.namespace(gs[0])
        dtype = widest_float(gs[0].device)  # float64 where the device has it
        mon.compute_dtypes.add(str(dtype).replace("torch.", ""))
        columns = stats.stat_columns(xp, gs, mon.bounds, mon.histogram, dtype=dtype,
                                     batched=torch_xp if batched else None)
        if mon.fp8_formats:
            columns = torch.cat([columns, self._fp8_rows(xp, gs, dtype, gs[0].device)])
        if self.level == "L0":
            flat = torch.cat([g.reshape(-1) for g in gs]) if len(gs) > 1 else gs[0].reshape(-1)
            payload = flat.to(dtype=torch.float32)
        else:
            payload = signs([g.reshape(-1) for g in gs])
        return Block([(name, tuple(g.shape), tuple(g.shape), g.numel(), None) for name, g in batch], columns, payload)

    # ------------------------------------------------------------------ sharded gradients
    def _sharded_blocks(self, step: int, params: list[tuple[str, torch.Tensor]]) -> list[Block]:
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

    def _sharded_block(self, step: int, groups: tuple[Any, ...], members: list[tuple[str, torch.Tensor]]) -> Block:
        mon = self.monitor
        device = local_device(members[0][1])
        dtype = widest_float(device)
        mon.compute_dtypes.add(str(dtype).replace("torch.", ""))
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
        summed, maxed = stats.shard_figures(xp, shares, mon.bounds, mon.histogram, dtype, device,
                                            batched=None if mon.histogram else torch_xp)
        fp8 = mon.fp8_formats and dtype == torch.float64
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
        elif mon.fp8_formats:
            fp8_rows = [self._fp8_rows(xp, [], dtype, device, len(members))]
        if failure is not None and mon.config.strict:
            raise failure  # after the exchanges, which the other ranks are in too
        columns = torch.cat([stats.combine_shards(xp, summed, maxed, mon.bounds, mon.histogram), *fp8_rows,
                             summed[2:4]])
        out_members, payloads = [], []
        for (name, p), piece in zip(members, pieces):
            shape = piece.shape if piece is not None else tuple(int(s) for s in p.shape)
            local = piece.local if piece is not None else torch.zeros(0, device=device)
            keep = piece is not None and (self.level == "L0" or (piece.counted and piece.index is not None))
            flat = local.reshape(-1) if keep else local.reshape(-1)[:0]
            payloads.append(flat.to(dtype=torch.float32) if self.level == "L0" else flat)
            out_members.append((name, shape, tuple(local.shape), flat.numel(), piece.index if piece else None))
        return Block(out_members, columns, torch.cat(payloads) if self.level == "L0" else signs(payloads), sharded=True)

    # ------------------------------------------------------------------ FP8 health
    def _fp8_rows(self, xp: Any, gs: list[torch.Tensor], dtype: torch.dtype, device: torch.device,
                  n: int | None = None) -> torch.Tensor:
        """The FP8 health rows of whole gradients (stats.fp8_columns); NaN on a device without
        float64, where the scaled values cannot be counted in the precision the columns promise."""
        formats = self.monitor.fp8_formats
        if dtype != torch.float64:
            width = len(stats.FP8_HEALTH_FIGURES) * len(formats)
            return torch.full((width, len(gs) if n is None else n), math.nan, dtype=dtype, device=device)
        return stats.fp8_columns(xp, gs, formats, dtype)

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
        formats = self.monitor.fp8_formats
        width = len(stats.FP8_HEALTH_FIGURES) * len(formats)
        if share.values is None:
            return torch.zeros(width, dtype=dtype, device=device)
        try:
            return stats.fp8_counts(xp, share.values, amax, formats, dtype)
        except Exception as exc:
            log.debug("grad_probe: FP8 counts of a slice failed: %r", exc)
            return torch.full((width,), math.nan, dtype=dtype, device=device)


# ---------------------------------------------------------------------- helpers
def to_host_packed(items: list[tuple[torch.Tensor, torch.Tensor]]) -> list[tuple[list[list[float]], Any]]:
    """(statistics rows, a list of floats per column, and the payload as a host array) of every
    (columns, payload) pair, from one host copy per device: every tensor's bytes are concatenated
    on the device and split on the host (a payload already on the host, `host_signs`, is kept)."""
    out: list[tuple[list[list[float]], Any]] = [([], None) for _ in items]
    by_device: dict[Any, list[int]] = {}
    for i, (columns, payload) in enumerate(items):
        if isinstance(columns, list):  # taken on the host
            out[i] = (columns, payload)
        else:
            by_device.setdefault(columns.device, []).append(i)
    for idx in by_device.values():
        parts = []
        for i in idx:
            columns, payload = items[i]
            parts.append(columns.reshape(-1).view(torch.uint8))
            if isinstance(payload, torch.Tensor):
                parts.append(payload.view(torch.uint8))
        flat = torch.cat(parts).cpu().numpy()
        pos = 0
        for i in idx:
            columns, payload = items[i]
            n_col = columns.numel() * columns.element_size()
            figures = np.frombuffer(flat[pos : pos + n_col], dtype=_NUMPY[columns.dtype]).reshape(columns.shape)
            pos += n_col
            if isinstance(payload, torch.Tensor):
                n_pay = payload.numel() * payload.element_size()
                payload = np.frombuffer(flat[pos : pos + n_pay], dtype=_NUMPY[payload.dtype])
                pos += n_pay
            out[i] = (figures.T.astype(np.float64).tolist(), payload)
    return out


_NUMPY = {torch.float64: "float64", torch.float32: "float32", torch.bool: "bool"}


# the CPU gradients L1 takes in one pass each on the host (host_figures.one_pass_figures) when
# host_figures does not take them (large ones)
_ONE_PASS = (torch.float32, torch.float64)
_WHOLE = (torch.nn.Parameter, torch.Tensor)  # the types of parameters no engine has split but ZeRO


def host_parts(batch: list[tuple[str, torch.Tensor]]) -> list[list[tuple[str, torch.Tensor]]] | None:
    """A batch of one device and dtype cut into parts of at most HOST_FIGURES_ELEMENTS for
    host_figures (the most its squares buffer keeps), or None when its figures are cheaper on the
    device (see HOST_FIGURES_AVERAGE) or NumPy cannot read its gradients in place."""
    sizes = [g.numel() for _name, g in batch]
    if sum(sizes) >= HOST_FIGURES_AVERAGE * len(batch) or not all(host_view(g) for _name, g in batch):
        return None
    parts: list[list[tuple[str, torch.Tensor]]] = [[]]
    total = 0
    for item, n in zip(batch, sizes):
        if parts[-1] and total + n > HOST_FIGURES_ELEMENTS:
            parts.append([])
            total = 0
        parts[-1].append(item)
        total += n
    return parts


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


def local_device(p: torch.Tensor) -> torch.device:
    """Where this rank's slice of a DTensor parameter lives (the DTensor's own device may differ)."""
    local = getattr(p, "_local_tensor", None)
    return (local if local is not None else p).device


def grad_of(p: torch.Tensor) -> torch.Tensor | None:
    """Megatron-style training keeps the fp32 gradient the optimizer uses in ``main_grad``."""
    g = getattr(p, "main_grad", None)
    return g if g is not None else p.grad
