"""`from probes.pytorch.online_dispatch import PtdbgDispatch` (msprobe 8.3.3's signature).

```python
with PtdbgDispatch(dump_mode="auto", dump_path="./dispatch"):
    loss = model(x).sum()        # every aten op checked against a CPU re-run
```

Unlike the reference it needs no torch_npu: the device under test is wherever the tensors are
(NPU, CUDA, or the CPU itself, then checked against float64). Arguments are validated in the
constructor (ConfigError naming the argument); directories and worker processes are created
when the context is entered, results are written when it exits.
"""

from __future__ import annotations

import os
from typing import Any

from probes.online_dispatch.mode import OnlineDispatchMode
from probes.online_dispatch.options import validate


class PtdbgDispatch(OnlineDispatchMode):
    """Context manager: compare every aten op of the enclosed forward or backward pass with the CPU."""

    def __init__(
        self,
        dump_mode: str = "OFF",
        api_list: list[str] | None = None,
        debug: bool = False,
        dump_path: str | os.PathLike[str] | None = None,
        tag: str | None = None,
        process_num: int = 0,
    ) -> None:
        super().__init__(validate(dump_mode, api_list, dump_path, tag, process_num, debug))

    def __repr__(self) -> str:
        o: Any = self.options
        return f"PtdbgDispatch(dump_mode={o.dump_mode!r}, dump_path={str(o.dump_path)!r}, process_num={o.process_num})"


__all__ = ["PtdbgDispatch"]
