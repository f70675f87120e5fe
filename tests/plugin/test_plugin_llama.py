"""A user's suite that trains a small Hugging Face Llama in fp32 and bf16, run whole under
`pytest --msprobe-task=free_benchmark`: green on the plugin's defaults (the scaled rule), red
under msprobe's rule on the bf16 attention, and red by name for a seeded defect."""

from __future__ import annotations

import json

import pytest
from repo_paths import SUPPORT

pytestmark = pytest.mark.slow  # subprocess pytest sessions / multi-process jobs: minutes in all

pytest.importorskip("transformers")

SUITE = '''
import pytest
import torch
import transformers


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_llama_trains(dtype):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128)
    model = transformers.LlamaForCausalLM(config).to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 512, (4, 64), generator=torch.Generator().manual_seed(1))
    for _ in range(2):
        opt.zero_grad()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
    assert torch.isfinite(loss)
'''

SEEDED = '''
import sys
sys.path.insert(0, {tests!r})
import seeded_reduced


def pytest_configure(config):
    import torch.nn.functional as F
    F.linear = lambda input, weight, bias=None: seeded_reduced.reduced_linear(input, weight, bias)
'''


@pytest.fixture
def suite(pytester):
    pytester.makepyfile(test_llama=SUITE)
    return pytester


def test_llama_suite_is_green_under_the_plugin_defaults(suite):
    dump = suite.path / "out"
    result = suite.runpytest_subprocess("--msprobe-task=free_benchmark", f"--msprobe-dump-path={dump}",
                                        "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    summary = json.loads((dump / "summary.json").read_text())
    checked = {api for api, s in summary["apis"].items() if s["checked"]}
    assert {"Functional.linear", "Functional.scaled_dot_product_attention"} <= checked
    assert all(not s["flagged"] for s in summary["apis"].values())


def test_msprobes_rule_is_red_on_the_bf16_attention(suite):
    result = suite.runpytest_subprocess("--msprobe-task=free_benchmark", "--msprobe-rule=reference",
                                        f"--msprobe-dump-path={suite.path / 'out'}", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*Functional.scaled_dot_product_attention*> threshold 0.004*"])


def test_a_seeded_defect_fails_the_suite_by_name(suite):
    suite.makeconftest(SEEDED.format(tests=str(SUPPORT)))
    result = suite.runpytest_subprocess("--msprobe-task=free_benchmark", f"--msprobe-dump-path={suite.path / 'out'}",
                                        "-p", "no:cacheprovider", "-k", "fp32")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*free_benchmark (improve_precision, scaled rule) flagged 1 API(s)*",
                                 "*Functional.linear.*.forward: max_rel * > threshold 0.0002 (torch.float32*"])
