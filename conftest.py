"""Root conftest: makes the repository importable without installation when tests run from a
checkout, and keeps the example suite's module importable."""

import sys
from pathlib import Path

ROOT = Path(__file__).parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
