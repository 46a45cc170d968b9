"""step/statistics.py: the chunked statistics pass vs float64 brute force."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.tiny import rollouts
from tokenrl.step.fast_path import ForwardPlan
from tokenrl.step.statistics import compute_token_stats


def brute_force_stats(model, batch, temperature):
    """Full (B, L, V) logits in float64, explicit loop over rows and response positions."""
    ids, mask = batch.input_ids, batch.attention_mask
    with torch.no_grad():
        logits = model(
            input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp_min(0)
        ).logits.double()
    P = batch.prompt_ids.shape[1]
    B, T = batch.response_ids.shape
    out = {k: torch.zeros(B, T, dtype=torch.float64) for k in ("logprobs", "entropy", "renyi2")}
    for i in range(B):
        for t in range(T):
            if not batch.response_mask[i, t]:
                continue
            p = torch.softmax(logits[i, P + t - 1] / temperature, -1)
            out["logprobs"][i, t] = torch.log(p[batch.response_ids[i, t]])
            out["entropy"][i, t] = -(p * torch.log(p)).sum()
            out["renyi2"][i, t] = -torch.log((p * p).sum())
    return out


@pytest.mark.parametrize("chunk,micro", [(1, 1), (7, 2), (1000, 9)])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_chunked_statistics_match_float64_brute_force(chunk, micro, temperature):
    model, _, batch = rollouts(temperature=temperature)
    stats = compute_token_stats(model, batch, ForwardPlan(temperature, micro, chunk))
    ref = brute_force_stats(model, batch, temperature)
    for name in ("logprobs", "entropy", "renyi2"):
        assert torch.allclose(getattr(stats, name).double(), ref[name], atol=1e-5), name
