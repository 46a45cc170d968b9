"""Schulman's KL estimators (k1, k2, k3, low_var_kl) against their per-token definitions, value and gradient, and
in the loss against the loop."""

from __future__ import annotations

import math

import pytest
import torch

from tests.algorithms.losses.cases import AGGREGATIONS, assert_same, both_losses, ragged_case


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3", "low_var_kl"])
def test_kl_estimates_match_the_per_token_definitions(estimator):
    from tokenrl.algorithms.grpo import kl_estimate

    g = torch.Generator().manual_seed(3)
    logp = -torch.rand(5, 6, generator=g, dtype=torch.float64) * 4
    ref = logp + torch.randn(5, 6, generator=g, dtype=torch.float64)
    ref[0, :4] = logp[0, :4] + torch.tensor([4.0, 30.0, -25.0, 0.0], dtype=torch.float64)  # the clamps, and d = 0
    logp = logp.requires_grad_(True)
    got = kl_estimate(logp, ref, estimator)
    got.sum().backward()
    for i in range(5):
        for t in range(6):
            x, r = float(logp.detach()[i, t]), float(ref[i, t])
            d = r - x
            value = {"k1": x - r, "k2": 0.5 * d * d, "k3": math.exp(d) - d - 1}.get(estimator)
            slope = {"k1": 1.0, "k2": -d, "k3": 1 - math.exp(d)}.get(estimator)  # ∂/∂x
            if estimator == "low_var_kl":
                dc = max(-20.0, min(20.0, d))
                raw = math.exp(dc) - dc - 1
                value = max(-10.0, min(10.0, raw))
                slope = 0.0 if (dc != d or raw != value) else 1 - math.exp(d)
            assert float(got.detach()[i, t]) == pytest.approx(value, rel=1e-12, abs=1e-12), (i, t)
            assert float(logp.grad[i, t]) == pytest.approx(slope, rel=1e-12, abs=1e-12), (i, t)
    assert float(got.detach()[0, 3]) == 0.0 and float(logp.grad[0, 3]) == (1.0 if estimator == "k1" else 0.0)


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3", "low_var_kl"])
@pytest.mark.parametrize("agg", AGGREGATIONS)
@pytest.mark.parametrize("kl_masked", [True, False])
def test_policy_loss_with_each_kl_estimator_matches_the_loop(estimator, agg, kl_masked):
    case = ragged_case(1)
    ref = case["ref"].clone()
    ref[1, :3] = case["logp"][1, :3] + torch.tensor([4.0, 30.0, -25.0], dtype=torch.float64)
    case = {**case, "ref": ref}
    impl, expected = both_losses(case, agg=agg, beta=0.03, estimator=estimator, kl_masked=kl_masked, budget=8)
    assert_same(impl, expected)


@pytest.mark.parametrize("d", [800.0, -800.0])
def test_low_var_kl_is_finite_with_zero_gradient_far_out(d):
    """The log-ratio clamp keeps low_var_kl finite, and its gradient 0 rather than NaN, where exp(d) overflows."""
    from tokenrl.algorithms.grpo import kl_estimate

    logp = torch.tensor([[-1.0]], dtype=torch.float64, requires_grad=True)
    value = kl_estimate(logp, logp.detach() + d, "low_var_kl")
    value.sum().backward()
    assert float(value.detach()) == 10.0 and float(logp.grad) == 0.0
