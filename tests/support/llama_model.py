"""A small randomly initialised Hugging Face Llama (no weights downloaded): a real model nobody
here wrote, for the tests and benchmarks. transformers is a test/benchmark extra, never a
runtime dependency: callers skip when it is missing."""

from __future__ import annotations

from typing import Any

import torch

VOCAB = 512


def tiny_llama(dtype: torch.dtype = torch.float32, layers: int = 2, hidden: int = 128, seed: int = 0) -> Any:
    """LlamaForCausalLM with `layers` layers of width `hidden` (4 heads), in `dtype`."""
    import transformers

    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden,
                                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4,
                                      max_position_embeddings=128)
    return transformers.LlamaForCausalLM(config).to(dtype)


def token_batch(batch: int = 4, length: int = 64, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, length), generator=g)


def training_step(model: Any, ids: torch.Tensor) -> torch.Tensor:
    """Forward with the causal-LM loss, then backward; returns the loss."""
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    return out.loss.detach()
