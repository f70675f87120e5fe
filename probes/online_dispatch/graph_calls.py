"""The online_dispatch mode's handling of torch.compile graphs' calls (a mixin of OnlineDispatchMode).

Under torch.compile the mode lets Dynamo compile: the compiled program runs unchanged, its graphs'
calls come here (`graph_call`, from probes.compiled.capture), and each sampled call is compared as a
whole with the graph's eager program in float64 on the CPU, its backward when the user's backward
pass reaches it (graph_ops).
"""

from __future__ import annotations

from typing import Any

from torch.utils._python_dispatch import _disable_current_modes

from probes.compiled import runs as graph_runs
from probes.online_dispatch import reference
from probes.online_dispatch.graph_ops import GraphBackwardOp, GraphInfo, GraphOp, watch_backward
from probes.online_dispatch.graph_reports import graph_entry


class GraphCalls:
    """graph_call and the backward's hooks; the mode provides results, options, _check, _depth,
    _graph_calls and _drain_native."""

    def graph_call(self, graph: Any, args: tuple, kwargs: dict) -> Any:
        """A compiled graph's call (capture.GraphChecker): its kernels run with no dispatch mode
        (the graph is compared as a whole, not its runtime's operators one by one)."""
        self._drain_native()  # a compiled program may write anything
        with _disable_current_modes():
            counts = self._graph_calls
            index = counts[graph.name] = counts.get(graph.name, 0) + 1
            options = self.options
            if not graph_runs.sampled(index - 1, options.compiled_first, options.compiled_every):
                if graph.name in self.results.graphs:
                    self.results.graphs[graph.name].calls = index
                return graph.compiled(*args, **kwargs)
            func, info = GraphOp(graph), GraphInfo(graph)
            entry = graph_entry(self.results, graph)
            entry.calls, entry.sampled = index, entry.sampled + 1
            if info.skip is not None:
                entry.not_checked = info.skip
                key = (info.skip, func)
                self.results.skipped[key] = self.results.skipped.get(key, 0) + 1
                return graph.compiled(*args, **kwargs)
            device = reference.device_under_test(args, kwargs) or reference.CPU
            entry.checked += 1
            out = self._check(func, info, device, args, kwargs, float64=True)
            try:
                watch_backward(graph, args, kwargs, out, self._compare_backward, self._skip_backward)
            except Exception as exc:  # the forward's verdict stands; only its backward goes unchecked
                self.results.add_error(str(func), "watching the backward", exc)
            return out

    def _compare_backward(self, op: GraphBackwardOp, args: tuple) -> None:
        """A sampled graph call's backward, reached by the user's backward pass: its compiled
        gradients against the eager program's float64 gradients (graph_ops)."""
        if self._depth == 0:  # the backward ran after the context closed: its rows have been written
            return
        with _disable_current_modes():
            try:
                device = reference.device_under_test(args, {}) or reference.CPU
                self._check(op, op.info(), device, args, {}, float64=True)
            except Exception as exc:  # never raised into the user's backward pass
                self.results.add_error(str(op), "comparing the backward", exc)

    def _skip_backward(self, reason: str, op: GraphOp) -> None:
        key = (reason, str(op))  # by name: the op objects are per call
        self.results.skipped[key] = self.results.skipped.get(key, 0) + 1
