"""The aggregations and their normalisers: an empty selection, an unknown name, and Dr. GRPO's constant divisor
(seq-mean-token-sum-norm) against the loop and by hand."""

from __future__ import annotations

import math

import pytest
import torch

from tests.algorithms.losses.cases import assert_same, both_losses, loss_of, normalizer_of, ragged_case


def test_empty_selection_gives_zero_loss_not_nan():
    resp = torch.ones(3, 4)
    nothing = torch.zeros(3, 4)
    for agg in ("seq-mean-token-mean", "token-mean"):
        normalizer = normalizer_of(resp, nothing, agg, "selected", True)
        out = loss_of(
            torch.zeros(3, 4),
            torch.zeros(3, 4),
            torch.ones(3),
            resp,
            nothing,
            normalizer,
            aggregation=agg,
            norm="selected",
            clip_low=0.2,
            clip_high=0.2,
        )
        assert float(out.loss) == 0.0


def test_unknown_aggregation_is_rejected():
    with pytest.raises(ValueError, match="token-mean"):
        normalizer_of(torch.ones(1, 1), torch.ones(1, 1), "sum", "selected", True)


@pytest.mark.parametrize("kind", ["ppo", "gspo", "cispo"])
@pytest.mark.parametrize("seed", range(3))
def test_dr_grpo_sum_norm_divides_by_rows_times_budget(kind, seed):
    """seq-mean-token-sum-norm: loss = Σ_i Σ_t ℓ_it w_it / (B·budget), the KL (and entropy) by the same constant,
    whatever the selection; micro-batch shares with the mini-batch normaliser add up to the whole."""
    case = ragged_case(seed)
    budget = 12
    B = case["logp"].shape[0]
    impl, ref = both_losses(case, kind=kind, agg="seq-mean-token-sum-norm", beta=0.04, alpha=0.01, budget=budget)
    assert_same(impl, ref)
    assert impl["norm"] == (float(B * budget),) * 3
    # the normaliser does not depend on the selection, its normaliser or the KL settings
    resp = case["resp"]
    for w, norm, kl_masked, kl_w in [
        (case["sel"], "selected", True, None),
        (resp, "all", False, None),
        (torch.zeros_like(resp), "selected", True, None),
        (case["sel"] * 0.5, "all", True, resp * 0.25),
    ]:
        counted = normalizer_of(resp, w, "seq-mean-token-sum-norm", norm, kl_masked, True, budget, kl_w)
        assert (counted.pg, counted.kl, counted.entropy) == (float(B * budget),) * 3
    # explicitly: Σ_i Σ_t (pg + β·k3) over selected tokens / (B·budget), pg from the plain PPO formula
    if kind == "ppo":
        total = 0.0
        for i in range(B):
            for t in range(case["logp"].shape[1]):
                if case["resp"][i, t] and case["sel"][i, t]:
                    r = math.exp(float(case["logp"][i, t] - case["old"][i, t]))
                    a = float(case["adv"][i])
                    d = float(case["ref"][i, t] - case["logp"][i, t])
                    total += -min(r * a, min(max(r, 0.8), 1.28) * a) + 0.04 * (math.exp(d) - d - 1)
                if case["resp"][i, t]:
                    total += -0.01 * float(case["entropy"][i, t])
        assert impl["loss"] == pytest.approx(total / (B * budget), abs=1e-12)
    # shares of two micro-batches with the mini-batch's normaliser add up to the whole loss
    normalizer = normalizer_of(resp, case["sel"], "seq-mean-token-sum-norm", "selected", True, False, budget)
    parts = sum(
        float(
            loss_of(
                case["logp"][r],
                case["old"][r],
                case["adv"][r],
                resp[r],
                case["sel"][r],
                normalizer,
                aggregation="seq-mean-token-sum-norm",
                norm="selected",
                clip_low=0.2,
                clip_high=0.28,
                ref_logp=case["ref"][r],
                kl_coef=0.04,
                kind=kind,
                entropy=case["entropy"][r],
                entropy_coef=0.01,
            ).loss
        )
        for r in torch.arange(B).split(3)
    )
    assert parts == pytest.approx(impl["loss"], abs=1e-12)


def test_sum_norm_loss_is_independent_of_selection_count():
    """Dr. GRPO: dropping tokens from the selection removes their terms but leaves the divisor alone (unlike
    token-mean, whose divisor shrinks)."""
    case = ragged_case(0)
    resp, sel = case["resp"], case["sel"]
    fewer = sel.clone()
    fewer[1] = 0.0
    grads = {}
    for agg in ("seq-mean-token-sum-norm", "token-mean"):
        for name, w in (("all", sel), ("fewer", fewer)):
            normalizer = normalizer_of(resp, w, agg, "selected", True, budget=10)
            logp = case["logp"].clone().requires_grad_(True)
            loss_of(
                logp,
                case["old"],
                case["adv"],
                resp,
                w,
                normalizer,
                aggregation=agg,
                norm="selected",
                clip_low=0.2,
                clip_high=0.28,
            ).loss.backward()
            grads[agg, name] = logp.grad
    keep = fewer.bool() & resp.bool()
    # the gradient of every token that stays selected is unchanged under the constant divisor, changed under token-mean
    assert torch.equal(grads["seq-mean-token-sum-norm", "all"][keep], grads["seq-mean-token-sum-norm", "fewer"][keep])
    assert not torch.allclose(grads["token-mean", "all"][keep], grads["token-mean", "fewer"][keep])
