"""grad_probe: per-parameter gradient statistics every optimizer step, and run-vs-run direction
similarity (the 0.97 / 0.03 rule).

The statistics and the comparison are framework-free; the PyTorch and MindSpore monitors only
collect gradients and hand them over.
"""
