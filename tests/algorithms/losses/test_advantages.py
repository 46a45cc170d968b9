"""Group advantages against the float64 loop of tests/helpers/references.py, and zero advantages giving a zero loss
and gradient for every policy loss."""

from __future__ import annotations

import pytest
import torch

from tests.algorithms.losses.cases import AGGREGATIONS, assert_same, both_losses, loss_of, normalizer_of, ragged_case
from tests.helpers.references import grpo_advantages
from tokenrl.algorithms.grpo import group_advantages
from tokenrl.algorithms.surrogates import BUILT_IN_SURROGATES as POLICY_LOSSES


@pytest.mark.parametrize("seed", range(5))
def test_group_advantages_match_loop(seed):
    g = torch.Generator().manual_seed(seed)
    groups = torch.tensor([0, 0, 0, 1, 1, 2, 3, 3, 3, 3])
    rewards = torch.randint(0, 2, (10,), generator=g).float()
    got = group_advantages(rewards, groups)
    assert torch.allclose(got.double(), grpo_advantages(rewards.tolist(), groups.tolist()), atol=1e-5)


def test_equal_rewards_give_zero_advantage_and_no_nan():
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    adv = group_advantages(rewards, groups)
    assert torch.equal(adv, torch.zeros(8))
    resp = torch.ones(8, 5)
    normalizer = normalizer_of(resp, resp, "seq-mean-token-mean", "selected", True)
    logp = torch.zeros(8, 5, requires_grad=True)
    out = loss_of(
        logp,
        logp.detach(),
        adv,
        resp,
        resp,
        normalizer,
        aggregation="seq-mean-token-mean",
        norm="selected",
        clip_low=0.2,
        clip_high=0.2,
    )
    out.loss.backward()
    assert torch.isfinite(out.loss) and float(out.loss) == 0.0 and torch.equal(logp.grad, torch.zeros(8, 5))


def test_all_zero_advantages_give_zero_policy_gradient_for_every_loss():
    case = ragged_case(0)
    zero = torch.zeros_like(case["adv"])
    for kind in POLICY_LOSSES:
        for agg in AGGREGATIONS:
            impl, ref = both_losses(case, adv=zero, kind=kind, agg=agg, budget=8)
            assert_same(impl, ref)
            assert impl["loss"] == 0.0 and torch.equal(impl["grad"], torch.zeros_like(impl["grad"]))
