"""`from probes.pytorch.online_dispatch import PtdbgDispatch` (msprobe 8.3.3's signature).

```python
with PtdbgDispatch(dump_mode="auto", dump_path="./dispatch"):
    loss = model(x).sum()        # every aten op checked against a CPU re-run
```

Unlike the reference it needs no torch_npu: the device under test is wherever the tensors are
(NPU, CUDA, or the CPU itself, then checked against float64). Arguments are validated in the
constructor (ConfigError naming the argument); directories, the reference thread and worker
processes are created when the context is entered, results are written when it exits.
`background` (new) re-runs and compares each op in a background thread while the program goes on
(True), inline right after the op (False), or in the thread only when it can overlap ("auto", the
default: an accelerator is in use, or torch leaves at least half the CPU cores idle). The CSV is
the same either way. `process_num > 0` (worker processes for the figures) takes precedence.
`rule` (new) picks the verdict: "both" (the default) fails an output when msprobe's documented
Cosine/MaxAbsErr rule or the scaled rule (the error at the output's scale, in units of its dtype's
precision: probes/core/dispatch_metrics.py) fails it; "reference" is msprobe's verdict alone,
"scaled" the scaled rule alone.
"""

from __future__ import annotations

from typing import Any

from probes.online_dispatch.mode import OnlineDispatchMode
from probes.online_dispatch.options import SIGNATURE, validate


class PtdbgDispatch(OnlineDispatchMode):
    """Context manager: compare every aten op of the enclosed forward or backward pass with the CPU."""

    # The arguments are the table probes.online_dispatch.options.DispatchOptions (msprobe's
    # names, order and defaults, then ours); __signature__ shows them to help() and IDEs.
    __signature__ = SIGNATURE

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(validate(*args, **kwargs))

    def __repr__(self) -> str:
        o: Any = self.options
        return (f"PtdbgDispatch(dump_mode={o.dump_mode!r}, dump_path={str(o.dump_path)!r}, "
                f"process_num={o.process_num}, background={o.background}, rule={o.rule!r})")


__all__ = ["PtdbgDispatch"]
