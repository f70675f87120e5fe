"""What a rank computes in a DTensor call, so that free_benchmark can re-run exactly that.

A DTensor op is a local kernel run on each rank's shard, behind a sharding propagation that may
first redistribute the inputs: an all-gather, an all-reduce of a partial sum, or a local division
(a replicated bias made a partial sum, in a row-wise parallel linear). free_benchmark compares the
re-run with the original output's local tensor, and re-runs the call one of two ways:

- on the plain local tensors, when DTensor ran the API's kernels on the local tensors unchanged
  (the cheaper way: no sharding propagation);
- through DTensor itself, when DTensor redistributed inputs without a collective (the row-wise
  linear's bias): the perturbed local tensors are wrapped back as DTensors with the inputs' mesh,
  placements, global shape and stride (no collective: nothing is checked across ranks), the same
  function is called on them, and its output's local tensor is compared.

A re-run must never issue a collective, or ranks would wait on each other (a rank that skipped
the call, or whose re-run failed, would not join). The decision is taken before the re-run, from
the original call: DTensor's sharding propagation reads only placements and global shapes, which
are the same on every rank, so a call that issued no collective on one rank issued none on any,
and its re-run (same placements and shapes) issues none either. The re-run through DTensor is
watched the same way; one that issued a collective all the same is recorded as a probe error
(the ranks may no longer agree). Every other decision reads this rank's own metadata or its own
dispatcher, never another rank's. The call is judged only when:

- before the call, from its inputs: every DTensor is on one mesh this rank belongs to, none holds
  a partial sum (the op would reduce it first), and no plain tensor but a 0-d one is mixed in
  (DTensor would replicate it, or refuse the call);
- during the original call, DTensor's own dispatcher ran no custom handler (a convolution's halo
  exchange, an argmax over a sharded dimension) and no random op drawn through its RNG tracker,
  and no collective was issued on the mesh's groups (the processes' sequence numbers, which must
  be readable for a call that redistributed); an input redistributed (seen where DTensor checks
  implicit redistributions) sends the re-run through DTensor;
- after the re-run: its outputs have the local outputs' shapes (and dtypes, for the modes that
  keep them), and a re-run through DTensor redistributed as the call did and gave outputs of the
  same placements, so a redistribution nothing above saw still cannot be compared as if it were one.

An AsyncCollectiveTensor (a functional collective's result, which the row-wise layers return) is
the plain tensor the collective produced, waited for: a call on it is re-run on that tensor, which
the original call waited for already (its own dispatch waits before it computes).

What DTensor's dispatcher does during a call is watched by probes/backends/torch_dtensor_watch.py.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import torch

from probes.backends.torch_dtensor_watch import CURRENT, HOOKS, Watch
from probes.backends.torch_dtensor_watch import CUSTOM_HANDLER as CUSTOM_HANDLER
from probes.backends.torch_dtensor_watch import RANDOM_OP as RANDOM_OP
from probes.backends.torch_flat import flat
from probes.core.trees import iter_leaves, replace_at, tree_map

# reasons a DTensor call is not re-run (summary.json's not_checked keys)
PARTIAL_INPUT = ("a DTensor input holds a partial sum ({what} placement): the op reduces it across the mesh first, "
                 "so a re-run on the local tensors would compute something else")
MESHES_DIFFER = "its DTensor inputs are on different device meshes"
MIXED_INPUTS = ("a plain tensor with dimensions among DTensor inputs: DTensor replicates it (or refuses the call), "
                "which a re-run on the local tensors would not")
NOT_IN_MESH = "this rank is not part of the DTensor inputs' mesh: it computes nothing"
REDISTRIBUTED = ("the DTensor op redistributed an input ({what}) with collectives before its local kernel: a re-run "
                 "on the local tensors would compute something else, and one through DTensor would issue them again")
UNCOUNTED = ("the DTensor op redistributed an input ({what}) and its process groups do not count their collectives: "
             "a re-run through DTensor might issue one the other ranks do not")
COMMUNICATED = ("the DTensor call issued collectives on its mesh: a re-run on the local tensors would compute "
                "something else")
LOCAL_OUTPUT = ("an output of the DTensor call is not a plain local tensor ({what}): its local values cannot be "
                "compared")
LOCAL_MISMATCH = ("the re-run on the local tensors {what}: DTensor redistributed something, so the two are "
                  "not the same computation")
RERUN_FAILED = "the re-run on the local tensors failed ({what}): DTensor computed it some other way"
THROUGH_FAILED = "the re-run through DTensor failed ({what})"
THROUGH_DIFFERS = ("the re-run through DTensor {what}: it is not the computation the call made, so the two cannot be "
                   "compared")
THROUGH_DEVICE = ("the perturbed inputs are on {what}, not on the mesh's device: DTensor would move them back, so a "
                  "re-run through it is not the mode's")
UNOBSERVABLE = ("this torch's DTensor dispatcher cannot be watched for redistributions, so a re-run on the local "
                "tensors might compute something else")


def dtensor_class() -> type | None:
    """DTensor, when the program has imported it (never imported here: most programs do not use it)."""
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None) if module is not None else None


def async_class() -> type | None:
    """AsyncCollectiveTensor, when the program has imported the functional collectives."""
    module = sys.modules.get("torch.distributed._functional_collectives")
    return getattr(module, "AsyncCollectiveTensor", None) if module is not None else None


def handled(kind: type) -> bool:
    """A tensor type whose calls `local_call` decides (DTensor, AsyncCollectiveTensor)."""
    return any(cls is not None and issubclass(kind, cls) for cls in (dtensor_class(), async_class()))


class DivergedRerun(RuntimeError):
    """A re-run through DTensor issued a collective the call itself did not: recorded as a probe
    error, never a skip (every rank re-ran, so the ranks' collectives may no longer match)."""


class _Refused(Exception):
    """A re-run through DTensor that is not the call's computation (a skip with `reason`)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def release() -> None:
    """Put torch's DTensor dispatcher back as it was (the probe's wrappers are going away)."""
    HOOKS.release()


def _issued(mesh: Any) -> int | None:
    """Collectives this rank has issued on the mesh's process groups (their sequence numbers),
    or None where the backend does not count them."""
    try:
        return sum(group._get_sequence_number_for_group() for group in mesh.get_all_groups())
    except Exception:
        return None


class LocalCall:
    """A DTensor call that may be re-run on its local tensors, or through DTensor when it
    redistributed without a collective (see the module docstring); `mesh` None: a call on waited
    collective results only, with no DTensor to watch."""

    def __init__(self, kinds: tuple[type, type | None], mesh: Any, args: tuple, kwargs: dict) -> None:
        self._dtensor, self._async = kinds
        self.mesh = mesh
        self.args, self.kwargs = args, kwargs
        self.reason: str | None = None
        # the call redistributed inputs and issued no collective: the re-run goes through DTensor
        self.through = False
        self.redistributions: tuple[str, ...] = ()
        self._out_placements: dict[tuple, Any] = {}

    def _local(self, x: Any) -> Any:
        if self._dtensor is not None and isinstance(x, self._dtensor):
            return x._local_tensor
        if self._async is not None and isinstance(x, self._async):
            with torch.no_grad():
                return x.trigger_wait()  # the original call waited already: the collective's result
        return x

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """Around the original call: what DTensor's dispatcher does meanwhile decides the re-run."""
        if self.mesh is None:
            yield
            return
        try:
            watchable = HOOKS.install()
        except Exception:  # torch's dispatcher is not as expected: nothing is re-run, the call goes on
            watchable = False
        if not watchable:
            self.reason = UNOBSERVABLE
            yield
            return
        watch, outer = Watch(), getattr(CURRENT, "watch", None)
        before = _issued(self.mesh)
        CURRENT.watch = watch
        try:
            yield
        finally:
            CURRENT.watch = outer
            after = _issued(self.mesh) if before is not None else None
            self.reason = self._decided(watch, before, after)

    def _decided(self, watch: Watch, before: int | None, after: int | None) -> str | None:
        """Why the call cannot be re-run, or None (and `through` set when it must go through
        DTensor). Reads what the call did: the same on every rank, as DTensor's plan is."""
        if watch.reason is not None:
            return watch.reason
        if watch.redistributions:
            first = watch.redistributions[0]
            if before is None or after is None:
                return UNCOUNTED.format(what=first)
            if after != before:
                return REDISTRIBUTED.format(what=first)
            self.through = True
            self.redistributions = tuple(watch.redistributions)
            return None
        return COMMUNICATED if after != before else None

    def after(self, out: Any) -> tuple[tuple, dict, Any] | str:
        """The call's plain local inputs and outputs, or why it cannot be re-run on them."""
        if self.reason is not None:
            return self.reason
        local_out = tree_map(self._local, out)
        for _path, leaf in iter_leaves(local_out):
            if isinstance(leaf, torch.Tensor) and type(leaf) is not torch.Tensor:
                return LOCAL_OUTPUT.format(what=type(leaf).__name__)
        if self.through:
            self._out_placements = {path: tuple(leaf.placements) for path, leaf in iter_leaves(out)
                                    if isinstance(leaf, self._dtensor)}
        return tree_map(self._local, self.args), tree_map(self._local, self.kwargs), local_out

    def rerunner(self, fn: Any) -> Any:
        """What the re-run calls with the perturbed local inputs: `fn` itself, or `fn` through
        DTensor (returning its outputs' local tensors) for a call that redistributed."""
        if not self.through:
            return fn

        def through_dtensor(*args: Any, **kwargs: Any) -> Any:
            return self._through(fn, args, kwargs)

        return through_dtensor

    def _through(self, fn: Any, args: tuple, kwargs: dict) -> Any:
        """`fn` on the perturbed local tensors wrapped back as the call's DTensors (from_local with
        the global shape and stride given: no collective, no check across ranks), watched as the
        call was: a collective is a DivergedRerun, anything else it did differently a _Refused."""
        from torch.distributed.tensor import DTensor

        tree: Any = (args, kwargs)
        for path, original in iter_leaves((self.args, self.kwargs)):
            if not isinstance(original, self._dtensor):
                continue
            local = _leaf_at(tree, path)
            if type(local) is not torch.Tensor:
                raise _Refused(THROUGH_DIFFERS.format(what=f"was given a {type(local).__name__} for a DTensor input"))
            if local.device.type != self.mesh.device_type:
                raise _Refused(THROUGH_DEVICE.format(what=local.device.type))
            wrapped = DTensor.from_local(local, self.mesh, original.placements, run_check=False,
                                         shape=original.shape, stride=original.stride())
            tree = replace_at(tree, path, wrapped)
        args, kwargs = tree
        watch, outer = Watch(), getattr(CURRENT, "watch", None)
        before = _issued(self.mesh)
        CURRENT.watch = watch
        try:
            out = fn(*args, **kwargs)
        finally:
            CURRENT.watch = outer
            after = _issued(self.mesh)
            if after != before:
                seen = f"sequence numbers {before} -> {after}" if after is not None else "uncounted afterwards"
                raise DivergedRerun(
                    f"the re-run through DTensor issued collectives on the mesh's process groups ({seen}) where "
                    "the call itself issued none: this rank's collectives may no longer match the other ranks'")
        if watch.reason is not None:
            raise _Refused(THROUGH_DIFFERS.format(what=f"did what the call did not ({watch.reason})"))
        if tuple(watch.redistributions) != self.redistributions:
            raise _Refused(THROUGH_DIFFERS.format(
                what=f"redistributed {', '.join(watch.redistributions) or 'nothing'} where the call redistributed "
                     f"{', '.join(self.redistributions)}"))
        placements = {path: tuple(leaf.placements) for path, leaf in iter_leaves(out) if isinstance(leaf, DTensor)}
        if placements != self._out_placements:
            raise _Refused(THROUGH_DIFFERS.format(what=f"gave outputs placed {_placed(placements)} where the call's "
                                                       f"are {_placed(self._out_placements)}"))
        return tree_map(self._local, out)

    def mismatch(self, local_out: Any, rerun_out: Any, same_dtype: bool) -> str | None:
        """Why the re-run's outputs cannot be the local outputs' counterparts, or None."""
        reason = THROUGH_DIFFERS if self.through else LOCAL_MISMATCH
        theirs = dict(iter_leaves(rerun_out))
        for path, leaf in iter_leaves(local_out):
            other = theirs.get(path)
            if not isinstance(leaf, torch.Tensor) or not isinstance(other, torch.Tensor):
                continue
            if leaf.shape != other.shape:
                return reason.format(what=f"gave shape {tuple(other.shape)} where the rank's output is "
                                          f"{tuple(leaf.shape)}")
            if same_dtype and leaf.dtype != other.dtype:
                return reason.format(what=f"gave {other.dtype} where the rank's output is {leaf.dtype}")
        return None

    def rerun_failed(self, exc: BaseException) -> str | None:
        """Why a failed re-run is a skip, or None: it is a probe error (it issued a collective)."""
        if isinstance(exc, DivergedRerun):
            return None
        if isinstance(exc, _Refused):
            return exc.reason
        return (THROUGH_FAILED if self.through else RERUN_FAILED).format(what=type(exc).__name__)


def _leaf_at(tree: Any, path: tuple) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def _placed(placements: dict[tuple, Any]) -> str:
    return "; ".join(", ".join(map(repr, p)) for p in placements.values()) or "nowhere"


def local_call(args: tuple, kwargs: dict) -> LocalCall | str | None:
    """For a call with DTensor arguments: the LocalCall that re-runs it on this rank's local
    tensors, or why it cannot be; None for a call without DTensors (the usual case: no DTensor
    imported costs one dict lookup). Never raises: an input that cannot be inspected is judged
    unsafe."""
    kinds = dtensor_class(), async_class()
    if kinds == (None, None) or _plain_inputs(args) and _plain_inputs(kwargs.values()):
        return None
    try:
        return _decide(kinds, args, kwargs)
    except Exception as exc:
        return RERUN_FAILED.format(what=f"inspecting the DTensor inputs: {type(exc).__name__}")


def _plain_inputs(values: Any) -> bool:
    """No input is a container or a tensor subclass (the usual call, decided without walking
    the tree, and in C when its inputs are flat: torch_flat): it has no DTensor."""
    if flat(values):
        return True
    for x in values:
        kind = type(x)
        if kind is not torch.Tensor and kind is not torch.nn.Parameter and isinstance(x, (torch.Tensor, list, tuple, dict)):
            return False
    return True


def _decide(kinds: tuple[type | None, type | None], args: tuple, kwargs: dict) -> LocalCall | str | None:
    dtensor, waited = kinds
    dtensors, plain, results = [], False, False
    for _path, leaf in iter_leaves((args, kwargs)):
        if dtensor is not None and isinstance(leaf, dtensor):
            dtensors.append(leaf)
        elif waited is not None and isinstance(leaf, waited):
            results = True
        elif isinstance(leaf, torch.Tensor) and leaf.dim() > 0:
            plain = True
    if not dtensors:
        return LocalCall(kinds, None, args, kwargs) if results else None
    if plain or results:
        return MIXED_INPUTS
    mesh = dtensors[0].device_mesh
    for t in dtensors:
        if t.device_mesh is not mesh and t.device_mesh != mesh:
            return MESHES_DIFFER
        for p in t.placements:
            if p.is_partial():
                return PARTIAL_INPUT.format(what=p)
    if mesh.get_coordinate() is None:
        return NOT_IN_MESH
    return LocalCall(kinds, mesh, args, kwargs)
