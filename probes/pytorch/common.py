"""Helpers msprobe users import from `msprobe.pytorch.common`."""

from __future__ import annotations

import os
import random


def seed_all(seed: int = 1234, mode: bool = False) -> None:
    """Seed Python, NumPy (when installed) and torch; `mode=True` also asks torch for
    deterministic algorithms, so two runs can be compared op by op."""
    import torch

    random.seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:
        pass
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    if mode:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
