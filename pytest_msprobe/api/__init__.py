"""Per-API precision tests: the API input table (inputs.py), Hypothesis strategies of exact tensors
(strategies.py) and the ``@pytest.mark.msprobe_api`` marker that turns a table row into one
property test per dtype and perturbation mode (marker.py)."""
