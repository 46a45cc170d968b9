"""rollout/hf.py: the hf engine's sampling log-probs, seeding, layout and masks."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.tiny import rollouts
from tokenrl.models.response_forward import response_logprobs


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampling_logprobs_equal_trainer_logprobs(temperature):
    model, _, batch = rollouts(temperature=temperature)
    trainer = response_logprobs(model, batch, temperature).detach() * batch.response_mask
    assert torch.allclose(batch.sampling_logprobs, trainer, atol=1e-5)


def test_top_p_logprobs_are_of_the_processed_distribution():
    model, _, batch = rollouts(top_p=0.5)
    full = response_logprobs(model, batch, 1.0).detach() * batch.response_mask
    gap = (batch.sampling_logprobs - full)[batch.response_mask.bool()]
    assert (gap >= -1e-6).all() and gap.max() > 1e-3  # renormalised over the nucleus: never lower, often higher


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


def test_an_interrupt_stops_every_sequence_within_a_token():
    """`engine.interrupt` (a preemption signal) ends generation after the token being generated."""
    from tests.helpers.tiny import PROMPTS, tiny_policy
    from tokenrl.rollout.engine import SamplingParams
    from tokenrl.rollout.hf import HFEngine

    model, tok = tiny_policy()
    engine = HFEngine(model, tok)
    ids = [tok(p)["input_ids"] for p in PROMPTS]
    params = SamplingParams(n=2, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=40)
    assert engine.generate(ids, params, seed=0).response_ids.shape[1] > 1
    engine.interrupt = lambda: True
    assert engine.generate(ids, params, seed=0).response_ids.shape[1] == 1
