"""`scripts/bench/update_rate.py`: the update's least work counts exactly the parameters of a real model's linear
layers (6 per parameter per token: one forward, two backward), the decoder's over each group's prompt once and every
response token, the head's over the response tokens only."""

from __future__ import annotations

import pytest
from torch import nn
from transformers import Qwen2Config, Qwen2ForCausalLM

from tests.helpers.scripts import load_script


def test_least_work_counts_the_models_own_linear_parameters():
    config = dict(
        vocab_size=97,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=3,
        num_attention_heads=6,
        num_key_value_heads=2,
    )
    model = Qwen2ForCausalLM(Qwen2Config(**config, tie_word_embeddings=True))
    linear = [(name, m.weight.numel()) for name, m in model.model.layers.named_modules() if isinstance(m, nn.Linear)]
    attention = sum(n for name, n in linear if ".self_attn." in name)
    mlp = sum(n for name, n in linear if ".mlp." in name)
    assert attention + mlp == sum(n for _, n in linear) and attention and mlp
    groups, prompt, responses = 3, 11.0, 70.0
    parts = load_script("scripts/bench/update_rate.py").least_update_flops(config, groups, prompt, responses)
    assert parts["attention"] == pytest.approx(6 * attention * (groups * prompt + responses))
    assert parts["mlp"] == pytest.approx(6 * mlp * (groups * prompt + responses))
    assert parts["head"] == pytest.approx(6 * model.lm_head.weight.numel() * responses)
