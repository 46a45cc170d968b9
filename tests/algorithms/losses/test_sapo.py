"""SAPO against the loop on rows whose ratios are well away from 1, its soft gate's gradient token by token, and
TRL's gate values; on-policy its gradient is GRPO's."""

from __future__ import annotations

import math

import pytest
import torch

from tests.algorithms.losses.cases import (
    AGGREGATIONS,
    assert_same,
    both_losses,
    loss_of,
    moved_case,
    normalizer_of,
    row_divisor,
)


@pytest.mark.parametrize("taus", [(1.0, 1.05), (3.0, 6.0)])
@pytest.mark.parametrize("agg", AGGREGATIONS)
@pytest.mark.parametrize("norm", ["selected", "all"])
@pytest.mark.parametrize("seed", range(3))
def test_sapo_loss_and_gradient_match_the_loop(taus, agg, norm, seed):
    """SAPO: pg_t = −σ(τ(r_t − 1))·4/τ·Â with τ = τ_pos where Â > 0, τ_neg where Â ≤ 0; its gradient
    −4σ(1 − σ)·r_t·Â·w_t/D (the soft gate's weight times the ratio), token by token. The paper's temperatures and
    steeper ones."""
    case = moved_case(seed)
    impl, ref = both_losses(case, kind="sapo", sapo=taus, agg=agg, norm=norm, beta=0.03, budget=9)
    assert_same(impl, ref)
    assert impl["clipped"] == 0
    pg_only, _ = both_losses(case, kind="sapo", sapo=taus, agg=agg, norm=norm, budget=9)
    divisor = row_divisor(case, case["sel"], agg, norm, budget=9)
    logp, old, resp, sel, adv = case["logp"], case["old"], case["resp"], case["sel"], case["adv"]
    weights = []
    for i in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            expected = 0.0
            if resp[i, t] and sel[i, t]:
                a, r = float(adv[i]), math.exp(float(logp[i, t] - old[i, t]))
                tau = taus[0] if a > 0 else taus[1]
                gate = 1.0 / (1.0 + math.exp(-tau * (r - 1.0)))
                weights.append(4 * gate * (1 - gate))
                expected = -4 * gate * (1 - gate) * r * a / divisor[i]
            assert float(pg_only["grad"][i, t]) == pytest.approx(expected, abs=1e-13, rel=1e-10), (i, t)
    assert min(weights) < 0.95 and max(weights) <= 1.0  # off-policy tokens are attenuated


def test_sapo_gate_values_of_trl_and_its_on_policy_gradient_is_grpos():
    """TRL's test_get_sapo_token_loss: ratio 1, τ = 1 gives the gate 2.0 (σ(0)·4/1), so pg = −2·Â; f(1) = 2/τ in
    general. On-policy (r = 1) SAPO's gradient is GRPO's for any temperatures: 4σ(0)(1 − σ(0)) = 1."""
    resp = torch.ones(2, 4)
    adv = torch.tensor([1.0, -0.5], dtype=torch.float64)
    normalizer = normalizer_of(resp, resp, "token-mean", "selected", True)
    grads = {}
    for kind, taus in (("sapo", (1.0, 1.0)), ("sapo", (2.0, 5.0)), ("ppo", (1.0, 1.05))):
        logp = torch.full((2, 4), -1.3, dtype=torch.float64, requires_grad=True)
        out = loss_of(
            logp,
            logp.detach(),
            adv,
            resp,
            resp,
            normalizer,
            aggregation="token-mean",
            norm="selected",
            clip_low=0.2,
            clip_high=0.2,
            kind=kind,
            sapo=taus,
        )
        out.loss.backward()
        grads[kind, taus] = logp.grad
        if taus == (1.0, 1.0):
            assert float(out.loss) == pytest.approx(-2.0 * (1.0 - 0.5) / 2, abs=1e-15)  # mean of −2·Â per token
        if taus == (2.0, 5.0):
            assert float(out.loss) == pytest.approx((-(2 / 2.0) * 1.0 * 4 + (2 / 5.0) * 0.5 * 4) / 8, abs=1e-15)
    torch.testing.assert_close(grads["sapo", (1.0, 1.0)], grads["ppo", (1.0, 1.05)], rtol=0, atol=1e-16)
    torch.testing.assert_close(grads["sapo", (2.0, 5.0)], grads["ppo", (1.0, 1.05)], rtol=0, atol=1e-16)
