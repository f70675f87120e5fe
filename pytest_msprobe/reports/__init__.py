"""What a session shows: terminal tables (text.py), the self-contained report.html (html.py), the
merged report of a multi-rank dump (ranks.py) and grad_probe's tables (grads.py)."""
