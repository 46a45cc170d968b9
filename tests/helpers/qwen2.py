"""The tiny random float64 Qwen2 of the exactness tests: 2 layers, GQA 4/2 heads, tied embeddings, sdpa attention
(eager gives NaN on left padding), its weights drawn from `seed` under a forked RNG (the caller's stream is untouched).
A test's own settings (vocabulary, widths, special tokens, an untied head) go in `changes`."""

from __future__ import annotations

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

TINY = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    tie_word_embeddings=True,
    max_position_embeddings=64,
    initializer_range=0.2,
    attn_implementation="sdpa",
)


def float64_qwen2(vocab_size: int, seed: int = 0, **changes) -> Qwen2ForCausalLM:
    """A random Qwen2 of `TINY` with `changes`, in float64 (train mode, as built)."""
    config = Qwen2Config(**{**TINY, "vocab_size": vocab_size, **changes})
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return Qwen2ForCausalLM(config).to(torch.float64)
