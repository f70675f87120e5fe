"""What a session shows: terminal tables (text.py), the self-contained report.html (html.py, drawn
from sections/ with primitives.py and plots.py, whose inline SVG svg.py writes, styled by
report.css), the merged report of a multi-rank dump (ranks.py) and grad_probe's tables (grads.py,
fp8_health.py)."""
