"""GSPO, token form (gspo) and sequence form (gspo_seq), against the loop and the paper's formulas, value and
gradient; where the two forms coincide (GSPO §4.3) and where they differ."""

from __future__ import annotations

import math

import pytest
import torch

from tests.algorithms.losses.cases import (
    AGGREGATIONS,
    assert_same,
    both_losses,
    per_token_fields,
    ragged_case,
    row_divisor,
)
from tokenrl.algorithms.config import LossSettings
from tokenrl.algorithms.surrogates import SURROGATES
from tokenrl.records.loss_inputs import LossInputs


def gspo_targets(case, seed):
    """`case` with π_old set so the mean log-ratio over each row's selected tokens is a chosen target (token noise
    kept): sequence ratios on both sides of the clip range and inside it."""
    targets = torch.tensor([0.3, 0.02, -0.05, -0.3, 0.08, 0.08, -0.2, 0.0], dtype=torch.float64)
    targets = targets.roll(seed) if seed % 2 else targets
    targets[5] = targets[4]
    chosen = case["resp"] * case["sel"]
    deviation = case["old"] - case["logp"]
    row_mean = (deviation * chosen).sum(1, keepdim=True) / chosen.sum(1, keepdim=True).clamp_min(1)
    return {**case, "old": case["logp"] + deviation - row_mean - targets[:, None]}


@pytest.mark.parametrize("agg", AGGREGATIONS)
@pytest.mark.parametrize("norm", ["selected", "all"])
@pytest.mark.parametrize("seed", range(4))
def test_gspo_token_loss_and_gradient_match_the_loop(agg, norm, seed):
    """GSPO-token: every token of row i has the ratio value s_i = exp(mean over the row's selected tokens of
    logp − old) and the gradient −Â_i·s_i·w_t/D (D the row's divisor) where the unclipped branch is active, 0 where the
    clip binds; rows with no selected token contribute nothing."""
    case = gspo_targets(ragged_case(seed), seed)
    lo, hi = 0.1, 0.12
    impl, ref = both_losses(case, kind="gspo", agg=agg, norm=norm, lo=lo, hi=hi, budget=9)
    assert_same(impl, ref)
    # the sequence ratios straddle the clip range: some rows clipped, some not
    logp, old, resp, sel, adv = case["logp"], case["old"], case["resp"], case["sel"], case["adv"]
    s = {}
    for i in range(logp.shape[0]):
        picked = [float(logp[i, t] - old[i, t]) for t in range(logp.shape[1]) if resp[i, t] and sel[i, t]]
        if picked:
            s[i] = math.exp(sum(picked) / len(picked))
    assert any(not 1 - lo <= v <= 1 + hi for v in s.values()) and any(1 - lo <= v <= 1 + hi for v in s.values())
    # the gradient, token by token, from the GSPO-token formula
    divisor = row_divisor(case, sel, agg, norm, budget=9)
    for i in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            expected = 0.0
            if i in s and resp[i, t] and sel[i, t]:
                a = float(adv[i])
                if s[i] * a <= min(max(s[i], 1 - lo), 1 + hi) * a:  # the unclipped branch is the minimum
                    expected = -a * s[i] / divisor[i]
            assert float(impl["grad"][i, t]) == pytest.approx(expected, abs=1e-13, rel=1e-10), (i, t)
    # the per-token ratio value is s_i: pg_t = −min(s_i·Â, clip(s_i)·Â) on every token of the row
    inputs = LossInputs(logp, old, adv, resp, sel, clip_low=lo, clip_high=hi)
    pg = SURROGATES["gspo"](inputs, LossSettings("token-mean", lo, hi, policy_loss="gspo")).pg
    for i, value in s.items():
        a = float(adv[i])
        expected = -min(value * a, min(max(value, 1 - lo), 1 + hi) * a)
        assert torch.allclose(pg[i], torch.full_like(pg[i], expected), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("kind", ["gspo", "gspo_seq", "dppo"])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("seed", range(3))
def test_gspo_with_kl_dual_clip_and_weights_matches_the_loop(kind, agg, seed):
    case = ragged_case(seed)
    old = case["old"] - 0.9 * (case["adv"] < 0).double()[:, None]  # large ratios on negative-advantage rows
    case = {**case, "old": old}
    weights = (
        case["sel"]
        * torch.tensor([0.25, 0.5, 1.0, 1.5])[torch.randint(0, 4, case["sel"].shape, generator=case["gen"])].double()
    )
    impl, ref = both_losses(case, w=weights, kind=kind, agg=agg, beta=0.05, dual=1.5, lo=0.1, hi=0.12)
    assert_same(impl, ref)
    plain, _ = both_losses(case, w=weights, kind=kind, agg=agg, beta=0.05, lo=0.1, hi=0.12)
    assert plain["loss"] != pytest.approx(impl["loss"], abs=1e-9)  # the dual clip binds on some row


@pytest.mark.parametrize("agg", AGGREGATIONS)
@pytest.mark.parametrize("norm", ["selected", "all"])
@pytest.mark.parametrize("seed", range(4))
def test_gspo_sequence_loss_and_gradient_match_the_loop(agg, norm, seed):
    """GSPO's sequence form: ℓ_i = −min(s_i·Â_i, clip(s_i)·Â_i), s_i = exp(mean of the row's selected log-ratios), its
    gradient through s_i, ∂ℓ_i/∂logp_t = −Â_i·s_i/|S_i| on each selected token where the unclipped branch is active.
    With seq-mean-token-mean and the `selected` normaliser the loss is the mean of ℓ_i over the rows with a selected
    token (the paper's (1/G)Σ_i ℓ_i); fractional weights and a KL too, against the loop."""
    case = gspo_targets(ragged_case(seed), seed)
    lo, hi = 0.1, 0.12
    impl, ref = both_losses(case, kind="gspo_seq", agg=agg, norm=norm, lo=lo, hi=hi, budget=9)
    assert_same(impl, ref)
    logp, old, resp, sel, adv = case["logp"], case["old"], case["resp"], case["sel"], case["adv"]
    losses, grads = {}, torch.zeros_like(logp)
    for i in range(logp.shape[0]):
        picked = [t for t in range(logp.shape[1]) if resp[i, t] and sel[i, t]]
        if not picked:
            continue
        s = math.exp(sum(float(logp[i, t] - old[i, t]) for t in picked) / len(picked))
        a = float(adv[i])
        losses[i] = -min(s * a, min(max(s, 1 - lo), 1 + hi) * a)
        if s * a <= min(max(s, 1 - lo), 1 + hi) * a:  # unclipped: the gradient flows through s_i
            for t in picked:
                grads[i, t] = -a * s / len(picked)
    assert any(not 1 - lo <= math.exp(-v / float(adv[i])) <= 1 + hi for i, v in losses.items() if adv[i] != 0)
    if agg == "seq-mean-token-mean" and norm == "selected":
        assert impl["loss"] == pytest.approx(sum(losses.values()) / len(losses), abs=1e-13)
        torch.testing.assert_close(impl["grad"], grads / len(losses), rtol=1e-10, atol=1e-14)
    weights = (
        case["sel"]
        * torch.tensor([0.25, 0.5, 1.0, 1.5])[torch.randint(0, 4, case["sel"].shape, generator=case["gen"])].double()
    )
    impl, ref = both_losses(case, w=weights, kind="gspo_seq", agg=agg, norm=norm, lo=lo, hi=hi, beta=0.04, budget=9)
    assert_same(impl, ref)


@pytest.mark.parametrize("agg", AGGREGATIONS)
@pytest.mark.parametrize("norm", ["selected", "all"])
@pytest.mark.parametrize("seed", range(3))
def test_gspo_sequence_and_token_forms_coincide_where_the_paper_says_and_differ_elsewhere(agg, norm, seed):
    """GSPO §4.3: with one advantage and one ε per sequence, GSPO-token equals GSPO in loss and gradient — here for 0/1
    weights in every aggregation and normaliser, with KL and dual clip. Per-token advantages (GTPO) or fractional
    weights break the identity: the sequence form spreads each token's term over the whole row."""
    case = gspo_targets(ragged_case(seed), seed)
    common = dict(agg=agg, norm=norm, lo=0.1, hi=0.12, beta=0.04, dual=1.5, budget=9)
    token, _ = both_losses(case, kind="gspo", **common)
    sequence, _ = both_losses(case, kind="gspo_seq", **common)
    assert sequence["loss"] == pytest.approx(token["loss"], abs=1e-13)
    torch.testing.assert_close(sequence["grad"], token["grad"], rtol=1e-10, atol=1e-14)
    assert sequence["clipped"] == token["clipped"] > 0
    fields = per_token_fields(case, infinite=False)
    for extra in ({"adv": fields["adv"]}, {"w": fields["w"]}):
        token, _ = both_losses(case, kind="gspo", **extra, **common)
        sequence, ref = both_losses(case, kind="gspo_seq", **extra, **common)
        assert_same(sequence, ref)
        assert not torch.allclose(sequence["grad"], token["grad"], rtol=1e-6, atol=1e-9)
