"""Per-API precision tests: each marker generates one Hypothesis property test per dtype
(float32 under add_noise, float16 and bfloat16 under improve_precision unless pert_modes says
otherwise). Run alone with `pytest examples/test_apis.py`; a failure prints the shrunk input.
"""

import pytest

API_KWARGS = {
    "torch.nn.functional.softmax": {"dim": -1},
    "torch.nn.functional.log_softmax": {"dim": -1},
    "torch.nn.functional.layer_norm": {},
    "torch.nn.functional.gelu": {},
    "torch.nn.functional.silu": {},
    "torch.nn.functional.relu": {},
    "torch.nn.functional.softplus": {},
    "torch.nn.functional.linear": {},
    "torch.nn.functional.mse_loss": {},
    "torch.nn.functional.cross_entropy": {},
    "torch.nn.functional.normalize": {},
    "torch.nn.functional.scaled_dot_product_attention": {},
    "torch.nn.functional.conv1d": {},
    "torch.matmul": {},
    "torch.bmm": {},
    "torch.addmm": {},
    "torch.add": {},
    "torch.mul": {},
    "torch.div": {},
    "torch.exp": {},
    "torch.log": {},
    "torch.sqrt": {},
    "torch.rsqrt": {},
    "torch.tanh": {},
    "torch.sigmoid": {},
    "torch.sin": {},
    "torch.sum": {},
    "torch.mean": {},
    "torch.var": {},
    "torch.cumsum": {"dim": 0},
    "torch.logsumexp": {"dim": -1},
    "torch.Tensor.pow": {},
}


def _case(api, kwargs):
    @pytest.mark.msprobe_api(api, kwargs=kwargs, examples=8)
    def test():
        pass

    return test


for _api, _kwargs in API_KWARGS.items():
    globals()[f"test_{_api.rsplit('.', 1)[-1]}"] = _case(_api, _kwargs)
