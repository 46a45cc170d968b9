"""The hf engine's sampling log-probs, seeding and masks; the chunked statistics pass vs float64 brute force."""
from __future__ import annotations

import pytest
import torch

from tests.helpers.tiny import tiny_policy
from tokenrl.algorithms.token_stats import compute_token_stats, response_logprobs
from tokenrl.rollout.base import SamplingParams, response_mask_until_eos
from tokenrl.rollout.hf import HFEngine

PROMPTS = ["What is 2 + 3?", "Hi", "A longer prompt, with padding to the left."]


def rollouts(temperature=1.0, top_p=1.0, top_k=0, seed=0, max_new_tokens=10, n=3):
    model, tok = tiny_policy()
    engine = HFEngine(model, tok)
    ids = [tok(p)["input_ids"] for p in PROMPTS]
    params = SamplingParams(n=n, temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=max_new_tokens)
    return model, engine, engine.generate(ids, params, seed=seed)


def brute_force_stats(model, batch, temperature):
    """Full (B, L, V) logits in float64, explicit loop over rows and response positions."""
    ids, mask = batch.input_ids, batch.attention_mask
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask,
                       position_ids=(mask.cumsum(-1) - 1).clamp_min(0)).logits.double()
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


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampling_logprobs_equal_trainer_logprobs(temperature):
    model, _, batch = rollouts(temperature=temperature)
    trainer = response_logprobs(model, batch, temperature).detach() * batch.response_mask
    assert torch.allclose(batch.sampling_logprobs, trainer, atol=1e-5)


def test_top_p_logprobs_are_of_the_processed_distribution():
    model, _, batch = rollouts(top_p=0.5)
    full = response_logprobs(model, batch, 1.0).detach() * batch.response_mask
    gap = (batch.sampling_logprobs - full)[batch.response_mask.bool()]
    assert (gap >= -1e-6).all() and gap.max() > 1e-3   # renormalised over the nucleus: never lower, often higher


def test_same_seed_same_rollouts_other_seed_differs():
    _, _, a = rollouts(seed=5)
    _, _, b = rollouts(seed=5)
    _, _, c = rollouts(seed=6)
    assert torch.equal(a.response_ids, b.response_ids) and a.texts == b.texts
    assert not torch.equal(a.response_ids, c.response_ids)


def test_rollout_layout():
    _, _, batch = rollouts(n=3, max_new_tokens=10)
    assert batch.group_ids.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert batch.response_ids.shape[0] == 9 and batch.response_ids.shape[1] <= 10
    for row, reason in zip(batch.response_mask, batch.finish_reasons):
        assert reason in ("stop", "length")
        assert row.sum() > 0
        # the mask is a prefix
        assert torch.equal(row, torch.sort(row, descending=True).values)


def test_response_mask_includes_first_eos_only():
    ids = torch.tensor([[5, 6, 1, 7, 1], [5, 5, 5, 5, 5]])
    mask, reasons = response_mask_until_eos(ids, [1])
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]] and reasons == ["stop", "length"]


@pytest.mark.parametrize("chunk,micro", [(1, 1), (7, 2), (1000, 9)])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_chunked_statistics_match_float64_brute_force(chunk, micro, temperature):
    model, _, batch = rollouts(temperature=temperature)
    stats = compute_token_stats(model, batch, temperature, micro_batch_size=micro, chunk_size=chunk)
    ref = brute_force_stats(model, batch, temperature)
    for name in ("logprobs", "entropy", "renyi2"):
        assert torch.allclose(getattr(stats, name).double(), ref[name], atol=1e-5), name
