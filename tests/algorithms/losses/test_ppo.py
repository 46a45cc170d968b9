"""PPO's clipped loss against `reference_loss`, the pre-#16 formula (docs/algorithms.md §1.4) as explicit float64
loops: both aggregations and normalisers, micro-batch shares, the dual clip, truncated importance-sampling weights,
low_var_kl's clamp, and 0/1 masks with float ε (neutral per-token fields change nothing)."""

from __future__ import annotations

import math

import pytest
import torch

from tests.algorithms.losses.cases import assert_same, both_losses, loss_of, normalizer_of, ragged_case
from tokenrl.algorithms.config import EngineISSettings
from tokenrl.algorithms.grpo import LossNormalizer, engine_is_weights


def reference_loss(logp, old, adv, resp, sel, ref, *, agg, norm, lo, hi, beta, kl_masked, weights=None, dual=None):
    """docs/algorithms.md §1.4 written as explicit loops over sequences and tokens, in float64."""
    B, T = len(logp), len(logp[0])
    pg = [[0.0] * T for _ in range(B)]
    kl = [[0.0] * T for _ in range(B)]
    for i in range(B):
        for t in range(T):
            ratio = math.exp(max(-20.0, min(20.0, logp[i][t] - old[i][t])))
            pg[i][t] = -min(ratio * adv[i], min(max(ratio, 1 - lo), 1 + hi) * adv[i])
            if dual is not None and adv[i] < 0:
                pg[i][t] = min(pg[i][t], -dual * adv[i])
            if weights is not None:
                pg[i][t] *= weights[i][t]
            if beta > 0:
                d = ref[i][t] - logp[i][t]
                kl[i][t] = math.exp(d) - d - 1
    w_pg = [[resp[i][t] * sel[i][t] for t in range(T)] for i in range(B)]
    w_kl = w_pg if kl_masked else resp
    den = w_pg if norm == "selected" else resp
    if agg == "token-mean":
        num = sum(pg[i][t] * w_pg[i][t] for i in range(B) for t in range(T))
        d = max(sum(map(sum, den)), 1)
        kl_num = sum(kl[i][t] * w_kl[i][t] for i in range(B) for t in range(T))
        return num / d + beta * kl_num / max(sum(map(sum, w_kl)), 1)
    seqs = []
    for i in range(B):
        if sum(den[i]) == 0:
            continue
        value = sum(pg[i][t] * w_pg[i][t] for t in range(T)) / max(sum(den[i]), 1)
        value += beta * sum(kl[i][t] * w_kl[i][t] for t in range(T)) / max(sum(w_kl[i]), 1)
        seqs.append(value)
    return sum(seqs) / len(seqs) if seqs else 0.0


def random_case(seed, B=7, T=9):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    resp = (torch.arange(T)[None] < lengths[:, None]).float()
    sel = (torch.rand(B, T, generator=g) < 0.4).float()
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    old = logp + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.3
    ref = logp + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.3
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    return logp, old, adv, resp, sel, ref


@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "token-mean"])
@pytest.mark.parametrize("norm", ["selected", "all"])
@pytest.mark.parametrize("kl_masked", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_policy_loss_matches_float64_loop(agg, norm, kl_masked, seed):
    logp, old, adv, resp, sel, ref = random_case(seed)
    kwargs = dict(aggregation=agg, norm=norm, clip_low=0.2, clip_high=0.28, kl_coef=0.04, kl_masked=kl_masked)
    normalizer = normalizer_of(resp, sel, agg, norm, kl_masked)
    whole = loss_of(logp, old, adv, resp, sel, normalizer, ref_logp=ref, **kwargs).loss
    # micro-batches with the mini-batch normaliser must add up to the whole-batch loss
    parts = sum(
        loss_of(logp[r], old[r], adv[r], resp[r], sel[r], normalizer, ref_logp=ref[r], **kwargs).loss
        for r in torch.arange(7).split(3)
    )
    expected = reference_loss(
        logp.tolist(),
        old.tolist(),
        adv.tolist(),
        resp.tolist(),
        sel.tolist(),
        ref.tolist(),
        agg=agg,
        norm=norm,
        lo=0.2,
        hi=0.28,
        beta=0.04,
        kl_masked=kl_masked,
    )
    assert float(whole) == pytest.approx(expected, abs=1e-9)
    assert float(parts) == pytest.approx(expected, abs=1e-9)


def test_policy_loss_gradient_moves_towards_positive_advantage():
    logp = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    resp = torch.ones(2, 3)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    normalizer = normalizer_of(resp, resp, "token-mean", "selected", True)
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
    )
    out.loss.backward()
    assert (logp.grad[0] < 0).all() and (logp.grad[1] > 0).all()  # descent raises logp of the good row


@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "token-mean"])
@pytest.mark.parametrize("seed", range(3))
def test_dual_clip_matches_float64_loop(agg, seed):
    logp, old, adv, resp, sel, ref = random_case(seed)
    old = old - 0.5  # ratios around e^0.5: many exceed c = 1.4
    c = 1.4
    kwargs = dict(aggregation=agg, norm="selected", clip_low=0.2, clip_high=0.28, kl_coef=0.01, kl_masked=True)
    normalizer = normalizer_of(resp, sel, agg, "selected", True)
    out = loss_of(logp, old, adv, resp, sel, normalizer, ref_logp=ref, dual_clip=c, **kwargs)
    expected = reference_loss(
        logp.tolist(),
        old.tolist(),
        adv.tolist(),
        resp.tolist(),
        sel.tolist(),
        ref.tolist(),
        agg=agg,
        norm="selected",
        lo=0.2,
        hi=0.28,
        beta=0.01,
        kl_masked=True,
        dual=c,
    )
    assert float(out.loss) == pytest.approx(expected, abs=1e-9)
    ratio = (logp - old).clamp(-20, 20).exp()
    capped = (adv[:, None] < 0) & (ratio > c) & (resp * sel).bool()
    assert float(out.dual_clipped_tokens) == float(capped.sum()) > 0  # counted where the cap binds, and it does
    plain = loss_of(logp, old, adv, resp, sel, normalizer, ref_logp=ref, **kwargs)
    assert float(plain.loss) != pytest.approx(expected, abs=1e-6) and float(plain.dual_clipped_tokens) == 0


@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "token-mean"])
@pytest.mark.parametrize("seed", range(3))
def test_truncated_importance_sampling_matches_float64_loop(agg, seed):
    logp, old, adv, resp, sel, ref = random_case(seed)
    g = torch.Generator().manual_seed(100 + seed)
    engine = old + torch.randn(old.shape, generator=g, dtype=torch.float64) * 0.8  # a disagreeing engine
    cap = 2.0
    weights, outside = engine_is_weights(old, engine, torch.ones_like(old), EngineISSettings(cap, "token_truncate"))
    assert torch.equal(outside, weights == cap) or torch.equal(outside, (old - engine).exp() > cap)
    expected_w = [
        [min(math.exp(o - e), cap) for o, e in zip(orow, erow)] for orow, erow in zip(old.tolist(), engine.tolist())
    ]
    assert torch.allclose(weights, torch.tensor(expected_w, dtype=torch.float64), atol=1e-12)
    assert (weights == cap).any() and (weights < 1).any()  # the cap and down-weighting both occur
    kwargs = dict(aggregation=agg, norm="selected", clip_low=0.2, clip_high=0.2, kl_coef=0.01, kl_masked=True)
    normalizer = normalizer_of(resp, sel, agg, "selected", True)
    got = loss_of(logp, old, adv, resp, sel, normalizer, ref_logp=ref, is_weights=weights, **kwargs).loss
    expected = reference_loss(
        logp.tolist(),
        old.tolist(),
        adv.tolist(),
        resp.tolist(),
        sel.tolist(),
        ref.tolist(),
        agg=agg,
        norm="selected",
        lo=0.2,
        hi=0.2,
        beta=0.01,
        kl_masked=True,
        weights=expected_w,
    )
    assert float(got) == pytest.approx(expected, abs=1e-9)
    plain = loss_of(logp, old, adv, resp, sel, normalizer, ref_logp=ref, **kwargs).loss
    assert float(plain) != pytest.approx(expected, abs=1e-6)  # the weights really enter the loss


@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "token-mean"])
def test_low_var_kl_clamps_like_verl(agg):
    """low_var_kl = k3 with d = ref − logp clamped to ±20 and the value to [−10, 10]; equal to k3 where it is small."""
    logp, old, adv, resp, sel, ref = random_case(7)
    ref = ref.clone()
    ref[0, :3] = logp[0, :3] + torch.tensor([4.0, 30.0, -25.0], dtype=torch.float64)  # k3 = 49.6, e^30, 24
    resp[0, :3], sel[0, :3] = 1.0, 1.0  # all three count in the loss
    got = loss_of(
        logp,
        old,
        adv,
        resp,
        sel,
        normalizer_of(resp, sel, agg, "selected", True),
        ref_logp=ref,
        aggregation=agg,
        norm="selected",
        clip_low=0.2,
        clip_high=0.2,
        kl_coef=0.01,
        kl_masked=True,
        kl_estimator="low_var_kl",
    ).loss

    def low_var(r, lp):
        d = max(-20.0, min(20.0, r - lp))
        return max(-10.0, min(10.0, math.exp(d) - d - 1))

    kl = [[low_var(r, lp) for r, lp in zip(rr, lr)] for rr, lr in zip(ref.tolist(), logp.tolist())]
    pg_only = reference_loss(
        logp.tolist(),
        old.tolist(),
        adv.tolist(),
        resp.tolist(),
        sel.tolist(),
        ref.tolist(),
        agg=agg,
        norm="selected",
        lo=0.2,
        hi=0.2,
        beta=0.0,
        kl_masked=True,
    )
    w = (resp * sel).tolist()
    if agg == "token-mean":
        expected = pg_only + 0.01 * sum(k * m for kr, mr in zip(kl, w) for k, m in zip(kr, mr)) / max(
            sum(map(sum, w)), 1
        )
    else:
        rows = [i for i in range(len(w)) if sum(w[i]) > 0]
        expected = pg_only + 0.01 * sum(sum(k * m for k, m in zip(kl[i], w[i])) / sum(w[i]) for i in rows) / len(rows)
    assert float(got) == pytest.approx(expected, abs=1e-9)
    k3 = loss_of(
        logp,
        old,
        adv,
        resp,
        sel,
        normalizer_of(resp, sel, agg, "selected", True),
        ref_logp=ref,
        aggregation=agg,
        norm="selected",
        clip_low=0.2,
        clip_high=0.2,
        kl_coef=0.01,
        kl_masked=True,
        kl_estimator="k3",
    ).loss
    assert float(k3) > float(got) + 1.0  # the clamp really bound
    with pytest.raises(
        ValueError, match=r"algorithm.kl_estimator='k5' is not one of \('k1', 'k2', 'k3', 'low_var_kl'\)"
    ):
        loss_of(
            logp,
            old,
            adv,
            resp,
            sel,
            LossNormalizer(1.0, 1.0),
            ref_logp=ref,
            aggregation=agg,
            norm="selected",
            clip_low=0.2,
            clip_high=0.2,
            kl_coef=0.01,
            kl_estimator="k5",
        )


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("norm", ["selected", "all"])
@pytest.mark.parametrize("kl_masked", [True, False])
@pytest.mark.parametrize("seed", range(3))
def test_zero_one_masks_and_float_clips_keep_the_old_formula(agg, norm, kl_masked, seed):
    """Backward compatibility: with a 0/1 mask, float ε, (b,) advantages and no per-token field the loss is the
    pre-#16 formula (`reference_loss`, value) and the loop's gradient; neutral per-token fields (ε tensors equal to the
    floats, KL weights 1, Â_i on every token, zero drift) change nothing at all."""
    case = ragged_case(seed)
    impl, ref = both_losses(case, agg=agg, norm=norm, beta=0.04, kl_masked=kl_masked)
    assert_same(impl, ref)
    old_formula = reference_loss(
        case["logp"].tolist(),
        case["old"].tolist(),
        case["adv"].tolist(),
        case["resp"].tolist(),
        case["sel"].tolist(),
        case["ref"].tolist(),
        agg=agg,
        norm=norm,
        lo=0.2,
        hi=0.28,
        beta=0.04,
        kl_masked=kl_masked,
    )
    assert impl["loss"] == pytest.approx(old_formula, abs=1e-12)
    shape = case["logp"].shape
    neutral = dict(
        lo=torch.full(shape, 0.2, dtype=torch.float64),
        hi=torch.full(shape, 0.28, dtype=torch.float64),
        kl_w=torch.ones(shape, dtype=torch.float64),
        drift=torch.zeros(shape, dtype=torch.float64),
    )
    same, _ = both_losses(
        case,
        adv=case["adv"][:, None].expand(shape).clone(),
        agg=agg,
        norm=norm,
        beta=0.04,
        kl_masked=kl_masked,
        **neutral,
    )
    assert same["loss"] == impl["loss"] and same["norm"] == impl["norm"] and same["clipped"] == impl["clipped"]
    assert torch.equal(same["grad"], impl["grad"])
