"""DPPO against the loop on rows whose ratios are well away from 1, its gradient token by token, and a case by
hand: a token is dropped only where it left the trust region the way Â pushes it."""

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
from tokenrl.algorithms.loss_settings import LossSettings
from tokenrl.algorithms.surrogates import dppo_dropped
from tokenrl.records.loss_inputs import LossInputs


def dropped_of(logp, old, adv, divergence, low, high):
    """`dppo_dropped` of these tensors with the divergence and the bounds (δ_low, δ_high) in `LossSettings`."""
    inputs = LossInputs(logp, old, adv, torch.ones_like(logp), torch.ones_like(logp))
    settings = LossSettings("token-mean", 0.2, 0.2, dppo_divergence=divergence, dppo_low=low, dppo_high=high)
    return dppo_dropped(inputs, settings)


def quadrants(case, dropped):
    """How many selected tokens fall in each (sign of Â, direction of π, dropped?) cell."""
    resp, sel, adv = case["resp"], case["sel"], case["adv"]
    up = case["logp"] > case["old"]
    cells = {}
    for i in range(resp.shape[0]):
        for t in range(resp.shape[1]):
            if resp[i, t] and sel[i, t] and adv[i] != 0:
                key = ("+" if adv[i] > 0 else "-", "up" if up[i, t] else "down", bool(dropped[i, t]))
                cells[key] = cells.get(key, 0) + 1
    return cells


@pytest.mark.parametrize("divergence, delta", [("tv", 0.15), ("kl", 0.05)])
@pytest.mark.parametrize("agg", AGGREGATIONS)
@pytest.mark.parametrize("norm", ["selected", "all"])
@pytest.mark.parametrize("seed", [0, 2, 4])  # seeds whose batch has tokens in every cell (checked below)
def test_dppo_loss_and_gradient_match_the_loop(divergence, delta, agg, norm, seed):
    """DPPO: pg_t = −r_t·Â (gradient −Â·r_t·w_t/D through the unclipped ratio), exactly 0 on a token that left the
    trust region the way Â pushes it; a token that moved as far the other way keeps its gradient. Asymmetric bounds
    (δ_high = 1.5·δ_low) so each side reads its own."""
    case = moved_case(seed)
    dppo = (divergence, delta, 1.5 * delta)
    impl, ref = both_losses(case, kind="dppo", dppo=dppo, agg=agg, norm=norm, beta=0.03, budget=9)
    assert_same(impl, ref)
    dropped = dropped_of(case["logp"], case["old"], case["adv"][:, None], *dppo)
    cells = quadrants(case, dropped)
    assert cells.get(("+", "up", True)) and cells.get(("-", "down", True))  # both unsafe sides drop
    assert not cells.get(("+", "down", True)) and not cells.get(("-", "up", True))  # the safe sides never do
    assert impl["clipped"] == cells[("+", "up", True)] + cells[("-", "down", True)]
    pg_only, _ = both_losses(case, kind="dppo", dppo=dppo, agg=agg, norm=norm, budget=9)
    divisor = row_divisor(case, case["sel"], agg, norm, budget=9)
    logp, old, resp, sel, adv = case["logp"], case["old"], case["resp"], case["sel"], case["adv"]
    for i in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            expected = 0.0
            if resp[i, t] and sel[i, t] and not dropped[i, t]:
                expected = -float(adv[i]) * math.exp(float(logp[i, t] - old[i, t])) / divisor[i]
            assert float(pg_only["grad"][i, t]) == pytest.approx(expected, abs=1e-13, rel=1e-10), (i, t)


def test_dppo_by_hand_drops_only_in_the_unsafe_direction():
    """p_old = 0.5 everywhere; binary TV δ = 0.15: token-mean loss Σ_kept −Â·r / 5 and its gradient, token by token.
    The same rule as prime-rl's default loss (−keep·Â·r) and verl's dppo_tv mask (their values coincide here)."""
    p = torch.tensor([[0.8, 0.2, 0.2, 0.8, 0.55]], dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0, 1.0]], dtype=torch.float64)
    logp = p.log().requires_grad_(True)
    old = torch.full_like(p, 0.5).log()
    resp = torch.ones(1, 5)
    out = loss_of(
        logp,
        old,
        adv,
        resp,
        resp,
        normalizer_of(resp, resp, "token-mean", "selected", True),
        aggregation="token-mean",
        norm="selected",
        clip_low=0.2,
        clip_high=0.2,
        kind="dppo",
        dppo=("tv", 0.15, 0.15),
    )
    out.loss.backward()
    # kept: token 1 (Â > 0, π fell), token 3 (Â < 0, π rose), token 4 (Â > 0, rose by 0.05 < δ); r = 0.4, 1.6, 1.1
    assert float(out.loss) == pytest.approx((-0.4 + 1.6 - 1.1) / 5, abs=1e-15)
    torch.testing.assert_close(
        logp.grad, torch.tensor([[0.0, -0.4 / 5, 0.0, 1.6 / 5, -1.1 / 5]], dtype=torch.float64), rtol=1e-14, atol=1e-15
    )
    assert float(out.clipped_tokens) == 2.0
    # binary KL: KL(Bern(0.5) ‖ Bern(0.8)) = 0.5·ln(0.5/0.8) + 0.5·ln(0.5/0.2) = 0.2231: over δ = 0.2, under δ = 0.25
    kl = 0.5 * math.log(0.5 / 0.8) + 0.5 * math.log((0.5 + 1e-8) / (0.2 + 1e-8))
    assert kl == pytest.approx(0.22314, abs=1e-5)
    assert dropped_of(p.log(), old, adv, "kl", 0.2, 0.2).tolist() == [[True, False, True, False, False]]
    assert not dropped_of(p.log(), old, adv, "kl", 0.25, 0.25).any()
