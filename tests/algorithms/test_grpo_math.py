"""GRPO math against independent float64 loop references on random inputs."""

from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf

from tests.conftest import compose_config
from tokenrl.algorithms.config import TIS_MODES, AlgorithmConfig, LossSettings
from tokenrl.algorithms.grpo import LossNormalizer, engine_is_weights, group_advantages, policy_loss
from tokenrl.algorithms.surrogates import BUILT_IN_SURROGATES as POLICY_LOSSES
from tokenrl.algorithms.surrogates import SURROGATES, dppo_dropped
from tokenrl.records.loss_inputs import LossInputs


def loss_of(
    logp,
    old_logp,
    advantages,
    response_mask,
    token_mask,
    normalizer,
    *,
    aggregation,
    norm,
    clip_low,
    clip_high,
    ref_logp=None,
    kl_coef=0.0,
    kl_masked=True,
    is_weights=None,
    dual_clip=None,
    kl_estimator="k3",
    kind="ppo",
    kl_weights=None,
    drift_coef=None,
    entropy=None,
    entropy_coef=0.0,
    entropy_masked=False,
    dppo=("tv", 0.15, 0.15),
    sapo=(1.0, 1.05),
):
    """`policy_loss(LossInputs, normalizer, LossSettings)` with these tests' names: the micro-batch's tensors and
    the selection's fields go into `LossInputs`, the settings (`kind`: `algorithm.policy_loss`) into `LossSettings`."""
    inputs = LossInputs(
        logp=logp,
        old_logp=old_logp,
        advantages=advantages,
        response_mask=response_mask,
        weights=token_mask,
        normalizer=norm,
        clip_low=clip_low,
        clip_high=clip_high,
        kl_weights=kl_weights,
        drift_coef=drift_coef,
        ref_logp=ref_logp,
        is_weights=is_weights,
        entropy=entropy,
    )
    settings = LossSettings(
        aggregation=aggregation,
        clip_low=clip_low if not isinstance(clip_low, torch.Tensor) else 0.0,
        clip_high=clip_high if not isinstance(clip_high, torch.Tensor) else 0.0,
        policy_loss=kind,
        dual_clip=dual_clip,
        kl_coef=kl_coef,
        kl_estimator=kl_estimator,
        kl_masked=kl_masked,
        entropy_coef=entropy_coef,
        entropy_masked=entropy_masked,
        dppo_divergence=dppo[0],
        dppo_low=dppo[1],
        dppo_high=dppo[2],
        sapo_tau_pos=sapo[0],
        sapo_tau_neg=sapo[1],
    )
    return policy_loss(inputs, normalizer, settings)


def reference_advantages(rewards, groups, eps=1e-6):
    out = []
    for i, r in enumerate(rewards):
        peers = [rewards[j] for j in range(len(rewards)) if groups[j] == groups[i]]
        if len(peers) == 1:
            mean, std = 0.0, 1.0
        else:
            mean = sum(peers) / len(peers)
            std = math.sqrt(sum((p - mean) ** 2 for p in peers) / (len(peers) - 1))
        out.append((r - mean) / (std + eps))
    return out


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
    normalizer = LossNormalizer.count(resp, sel, agg, norm, kl_masked)
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
    normalizer = LossNormalizer.count(resp, resp, "token-mean", "selected", True)
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


@pytest.mark.parametrize("seed", range(5))
def test_group_advantages_match_loop(seed):
    g = torch.Generator().manual_seed(seed)
    groups = torch.tensor([0, 0, 0, 1, 1, 2, 3, 3, 3, 3])
    rewards = torch.randint(0, 2, (10,), generator=g).float()
    got = group_advantages(rewards, groups)
    assert torch.allclose(
        got.double(),
        torch.tensor(reference_advantages(rewards.tolist(), groups.tolist()), dtype=torch.float64),
        atol=1e-5,
    )


def test_equal_rewards_give_zero_advantage_and_no_nan():
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    adv = group_advantages(rewards, groups)
    assert torch.equal(adv, torch.zeros(8))
    resp = torch.ones(8, 5)
    normalizer = LossNormalizer.count(resp, resp, "seq-mean-token-mean", "selected", True)
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


def test_empty_selection_gives_zero_loss_not_nan():
    resp = torch.ones(3, 4)
    nothing = torch.zeros(3, 4)
    for agg in ("seq-mean-token-mean", "token-mean"):
        normalizer = LossNormalizer.count(resp, nothing, agg, "selected", True)
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
        LossNormalizer.count(torch.ones(1, 1), torch.ones(1, 1), "sum", "selected", True)


@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "token-mean"])
@pytest.mark.parametrize("seed", range(3))
def test_truncated_importance_sampling_matches_float64_loop(agg, seed):
    logp, old, adv, resp, sel, ref = random_case(seed)
    g = torch.Generator().manual_seed(100 + seed)
    engine = old + torch.randn(old.shape, generator=g, dtype=torch.float64) * 0.8  # a disagreeing engine
    cap = 2.0
    weights, outside = engine_is_weights(old, engine, torch.ones_like(old), "token_truncate", cap)
    assert torch.equal(outside, weights == cap) or torch.equal(outside, (old - engine).exp() > cap)
    expected_w = [
        [min(math.exp(o - e), cap) for o, e in zip(orow, erow)] for orow, erow in zip(old.tolist(), engine.tolist())
    ]
    assert torch.allclose(weights, torch.tensor(expected_w, dtype=torch.float64), atol=1e-12)
    assert (weights == cap).any() and (weights < 1).any()  # the cap and down-weighting both occur
    kwargs = dict(aggregation=agg, norm="selected", clip_low=0.2, clip_high=0.2, kl_coef=0.01, kl_masked=True)
    normalizer = LossNormalizer.count(resp, sel, agg, "selected", True)
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
@pytest.mark.parametrize("seed", range(3))
def test_dual_clip_matches_float64_loop(agg, seed):
    logp, old, adv, resp, sel, ref = random_case(seed)
    old = old - 0.5  # ratios around e^0.5: many exceed c = 1.4
    c = 1.4
    kwargs = dict(aggregation=agg, norm="selected", clip_low=0.2, clip_high=0.28, kl_coef=0.01, kl_masked=True)
    normalizer = LossNormalizer.count(resp, sel, agg, "selected", True)
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


@pytest.mark.parametrize("c", [1.0, 0.5])
def test_dual_clip_must_exceed_one(c):
    with pytest.raises(ValueError, match=rf"algorithm.dual_clip={c} must be > 1"):
        algorithm_config(dual_clip=c)


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
        LossNormalizer.count(resp, sel, agg, "selected", True),
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
        LossNormalizer.count(resp, sel, agg, "selected", True),
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


def test_truncated_importance_sampling_rejects_a_bad_cap():
    with pytest.raises(ValueError, match="algorithm.tis_cap"):
        algorithm_config(tis_cap=0.0)


def ref_overlong(length: int, max_len: int, buffer: int, factor: float) -> float:
    """DAPO Eq. 13 as written: 0 | ((L_max − L_cache) − |y|) / L_cache | −1, times the factor (float64)."""
    if length <= max_len - buffer:
        return 0.0
    if length <= max_len:
        return ((max_len - buffer) - length) / buffer * factor
    return -1.0 * factor


@pytest.mark.parametrize("seed", range(3))
def test_overlong_penalty_matches_dapo_eq13(seed):
    from tokenrl.algorithms.dapo import overlong_penalty

    gen = torch.Generator().manual_seed(seed)
    max_len = int(torch.randint(8, 200, (1,), generator=gen))
    buffer = int(torch.randint(1, max_len + 1, (1,), generator=gen))
    factor = float(torch.rand((), generator=gen) * 2)
    lengths = torch.randint(0, max_len + 1, (64,), generator=gen)
    lengths[:3] = torch.tensor([max_len - buffer, max_len - buffer + 1, max_len])  # the edges
    got = overlong_penalty(lengths, max_len, buffer, factor)
    expected = torch.tensor([ref_overlong(int(n), max_len, buffer, factor) for n in lengths], dtype=torch.float64)
    assert torch.allclose(got.double(), expected, atol=1e-6)
    assert got[2] == pytest.approx(-factor) and got[0] == 0.0
    assert torch.equal(overlong_penalty(lengths, max_len, 0), torch.zeros(64))  # off


def test_overlong_buffer_beyond_the_response_budget_is_named():
    with pytest.raises(
        ValueError, match=r"algorithm.overlong_buffer=300 must lie in \[0, rollout.max_new_tokens=256\]"
    ):
        algorithm_config(overlong_buffer=300, max_new_tokens=256)


def algorithm_config(max_new_tokens: int = 1024, **changes):
    """The `grpo` preset's AlgorithmConfig with `changes` (the record that validates every algorithm setting)."""
    node = OmegaConf.to_container(compose_config([]).algorithm, resolve=True)
    return AlgorithmConfig.from_node({**node, **changes}, max_new_tokens)


# ---------------------------------------------------------------------------------------------------------------------
# Loss variants (issue #16): GSPO, CISPO, Dr. GRPO's constant normaliser, the KL estimators, the entropy bonus and the
# selection's per-token fields, each against a float64 loop over rows and tokens with scalar autograd (value and
# gradient). The loop is written from the definitions (docs/algorithms.md §1.4, §11), not from the vectorised code.
# ---------------------------------------------------------------------------------------------------------------------


def _num(x):
    """A Python float of a number or of a 0-d tensor (detached: the loop branches on values, autograd follows the
    tensors)."""
    return x.detach().item() if isinstance(x, torch.Tensor) else float(x)


def _at(value, i, t):
    """A per-token setting: a float (the same everywhere) or a nested list (the token's own)."""
    return value if isinstance(value, (int, float)) else value[i][t]


def _kl_token(x, ref, estimator):
    """Schulman's estimators of KL(π‖π_ref) at one token, x = log π (a 0-d tensor), d = ref − x."""
    d = ref - x
    if estimator == "k1":
        return -d
    if estimator == "k2":
        return 0.5 * d * d
    if estimator == "k3":
        return torch.exp(d) - d - 1.0
    assert estimator == "low_var_kl"
    if _num(d) > 20.0 or _num(d) < -20.0:  # the clamp cuts d (and its gradient)
        d = torch.tensor(max(-20.0, min(20.0, _num(d))), dtype=torch.float64)
    value = torch.exp(d) - d - 1.0
    if _num(value) > 10.0 or _num(value) < -10.0:
        value = torch.tensor(max(-10.0, min(10.0, _num(value))), dtype=torch.float64)
    return value


def _clamped(log_ratio):
    """A log-ratio (0-d tensor) clamped to ±20: outside, a constant (the clamp cuts the gradient)."""
    if _num(log_ratio) > 20.0 or _num(log_ratio) < -20.0:
        return torch.tensor(max(-20.0, min(20.0, _num(log_ratio))), dtype=torch.float64)
    return log_ratio


def _dppo_drops(x, old, a, divergence, low, high):
    """DPPO's drop rule at one token, from the paper's definition (arXiv 2602.04879; verl's dppo_tv / dppo_kl):
    binary TV |p − p_old| or binary KL of Bernoulli(p_old) ‖ Bernoulli(p) with verl's 1e-8, in Python floats."""
    p, p_old = math.exp(x), math.exp(old)
    if divergence == "tv":
        distance = abs(p - p_old)
    else:
        distance = p_old * (old - x) + (1 - p_old) * math.log((1 - p_old + 1e-8) / (1 - p + 1e-8))
    return (a > 0 and p > p_old and distance > high) or (a < 0 and p < p_old and distance > low)


def loop_policy_loss(
    logp,
    old,
    adv,
    resp,
    w,
    *,
    kind="ppo",
    agg="token-mean",
    norm="selected",
    lo=0.2,
    hi=0.28,
    ref=None,
    beta=0.0,
    estimator="k3",
    kl_masked=True,
    kl_w=None,
    drift=None,
    entropy=None,
    alpha=0.0,
    ent_masked=False,
    budget=0,
    dual=None,
    is_w=None,
    dppo=("tv", 0.15, 0.15),
    sapo=(1.0, 1.05),
):
    """The loss of docs/algorithms.md §1.4/§11 by loops over rows and tokens: a 0-d tensor whose autograd graph reaches
    the leaves `logp` (and `entropy`), the normaliser (pg, kl, entropy) and the number of clipped selected tokens (for
    DPPO: dropped).

    logp (b, T) leaf; entropy (b, T) leaf or None; every other argument a tensor or a float, read as Python numbers.
    adv: (b,) or (b, T); lo / hi: float or (b, T) (inf allowed); w: token weights (0: not selected); dppo: (divergence,
    δ_low, δ_high); sapo: (τ_pos, τ_neg).
    """

    def py(x):
        return x.tolist() if isinstance(x, torch.Tensor) else x

    old, adv, resp, w, ref, kl_w, drift, is_w, lo, hi = map(py, (old, adv, resp, w, ref, kl_w, drift, is_w, lo, hi))
    B, T = logp.shape
    sel = [[1.0 if resp[i][t] != 0 and w[i][t] != 0 else 0.0 for t in range(T)] for i in range(B)]
    den = [[sel[i][t] if norm == "selected" else float(resp[i][t]) for t in range(T)] for i in range(B)]
    wkl = [
        [(sel[i][t] if kl_masked else float(resp[i][t])) * (1.0 if kl_w is None else kl_w[i][t]) for t in range(T)]
        for i in range(B)
    ]
    went = [[sel[i][t] if ent_masked else float(resp[i][t]) for t in range(T)] for i in range(B)]
    with_kl, with_ent = ref is not None and beta > 0, entropy is not None and alpha > 0
    zero = logp.sum() * 0.0 + (entropy.sum() * 0.0 if entropy is not None else 0.0)
    pg_sum, kl_sum, ent_sum = [zero] * B, [zero] * B, [zero] * B
    clipped = 0
    for i in range(B):
        if kind in ("gspo", "gspo_seq"):  # log s_i: the mean (clamped) log-ratio over the row's selected tokens
            picked = [_clamped(logp[i, t] - old[i][t]) for t in range(T) if sel[i][t]]
            seq_log_ratio = sum(picked) / len(picked) if picked else zero
        for t in range(T):
            x = logp[i, t]
            a = adv[i] if not isinstance(adv[i], list) else adv[i][t]
            if kind == "gspo":  # GSPO-token: value s_i, gradient through this token's log π only
                r = torch.exp(x - x.detach() + _num(seq_log_ratio))
            elif kind == "gspo_seq":  # GSPO: r = s_i itself, its gradient through every selected token of the row
                r = torch.exp(seq_log_ratio)
            else:
                r = torch.exp(_clamped(x - old[i][t]))
            is_clipped = False
            if kind == "sapo":  # SAPO: −σ(τ(r − 1))·4/τ·Â, τ by the sign of Â
                tau = sapo[0] if a > 0 else sapo[1]
                pg = -torch.sigmoid(tau * (r - 1.0)) * (4.0 / tau) * a
            elif kind == "dppo":  # DPPO: −r·Â, or nothing where the token left the trust region
                is_clipped = _dppo_drops(_num(x), old[i][t], a, *dppo)
                pg = zero if is_clipped else -r * a
            else:
                lower, upper = 1.0 - _at(lo, i, t), 1.0 + _at(hi, i, t)
                if _num(r) < lower:
                    bounded = lower  # a constant: no gradient through the clipped ratio
                elif _num(r) > upper:
                    bounded = upper
                else:
                    bounded = r
                if kind == "cispo":
                    b_value = _num(bounded)
                    pg = -b_value * a * x
                    is_clipped = b_value != _num(r)
                else:
                    unclipped, clip_branch = r * a, bounded * a
                    is_clipped = _num(clip_branch) < _num(unclipped)
                    pg = -(clip_branch if is_clipped else unclipped)
            if dual is not None and kind not in ("cispo", "sapo") and a < 0 and _num(pg) > -dual * a:
                pg = torch.tensor(-dual * a, dtype=torch.float64)
            if drift is not None:
                pg = pg + drift[i][t] * torch.abs(x - old[i][t])
            if is_w is not None:
                pg = pg * is_w[i][t]
            if sel[i][t]:
                pg_sum[i] = pg_sum[i] + pg * (w[i][t] * resp[i][t])
                clipped += int(is_clipped)
            if with_kl and wkl[i][t] != 0:
                kl_sum[i] = kl_sum[i] + beta * _kl_token(x, ref[i][t], estimator) * wkl[i][t]
            if with_ent and went[i][t] != 0:
                ent_sum[i] = ent_sum[i] - alpha * entropy[i, t] * went[i][t]
    if agg == "seq-mean-token-mean":
        kept = [i for i in range(B) if sum(den[i]) > 0]
        normaliser = (float(len(kept)),) * 3
        loss = zero
        for i in kept:
            loss = loss + pg_sum[i] / max(sum(den[i]), 1.0)
            loss = loss + kl_sum[i] / max(sum(wkl[i]), 1.0) + ent_sum[i] / max(sum(went[i]), 1.0)
        return loss / max(len(kept), 1), normaliser, clipped
    if agg == "seq-mean-token-sum-norm":
        normaliser = (float(B * budget),) * 3
    else:
        assert agg == "token-mean"
        normaliser = tuple(float(sum(sum(row) for row in m)) for m in (den, wkl, went))
    loss = zero
    for total, divisor in zip((pg_sum, kl_sum, ent_sum), normaliser):
        loss = loss + sum(total, zero) / max(divisor, 1.0)
    return loss, normaliser, clipped


def ragged_case(seed, B=8, T=7):
    """A ragged batch with the awkward rows: a one-token response (row 0), an empty response (row 7), a row with no
    selected token (row 3), a zero advantage (row 2), two identical rows (4 and 5: tied log-probs and advantages),
    tied log-probs inside row 6; old log-probs shifted row by row so GSPO's sequence ratios spread across the clip."""
    g = torch.Generator().manual_seed(1000 + seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0], lengths[1], lengths[7] = 1, T, 0
    resp = (torch.arange(T)[None] < lengths[:, None]).float()
    sel = (torch.rand(B, T, generator=g) < 0.6).float()
    sel[0, 0], sel[3] = 1.0, 0.0
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    shift = torch.randn(B, 1, generator=g, dtype=torch.float64) * 0.3
    old = logp + shift + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.2
    ref = logp + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.4
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    adv[2] = 0.0
    for tensor in (logp, old, ref, adv, resp, sel):
        tensor[5] = tensor[4]
    logp[6, 1] = logp[6, 0]
    entropy = torch.rand(B, T, generator=g, dtype=torch.float64) * 2
    return dict(logp=logp, old=old, adv=adv, resp=resp, sel=sel, ref=ref, entropy=entropy, gen=g)


IMPL_NAMES = dict(
    kind="kind",
    agg="aggregation",
    norm="norm",
    lo="clip_low",
    hi="clip_high",
    beta="kl_coef",
    estimator="kl_estimator",
    kl_masked="kl_masked",
    kl_w="kl_weights",
    drift="drift_coef",
    alpha="entropy_coef",
    ent_masked="entropy_masked",
    dual="dual_clip",
    is_w="is_weights",
    dppo="dppo",
    sapo="sapo",
)


def both_losses(case, w=None, adv=None, **settings):
    """(implementation, reference) for the same inputs: each a dict of loss, logp's gradient, the entropy's gradient
    (when the bonus is on), the normaliser and the clipped-token count."""
    settings = {"agg": "token-mean", "norm": "selected", "lo": 0.2, "hi": 0.28, **settings}
    w = case["sel"] if w is None else w
    adv = case["adv"] if adv is None else adv
    with_ent = settings.get("alpha", 0.0) > 0
    budget = settings.pop("budget", 0)
    results = []
    for implementation in (True, False):
        logp = case["logp"].clone().requires_grad_(True)
        entropy = case["entropy"].clone().requires_grad_(True) if with_ent else None
        ref = case["ref"] if settings.get("beta", 0.0) > 0 else None
        if implementation:
            normalizer = LossNormalizer.count(
                case["resp"],
                w,
                settings["agg"],
                settings["norm"],
                settings.get("kl_masked", True),
                settings.get("ent_masked", False),
                budget,
                settings.get("kl_w"),
            )
            kwargs = {IMPL_NAMES[k]: v for k, v in settings.items()}
            out = loss_of(logp, case["old"], adv, case["resp"], w, normalizer, ref_logp=ref, entropy=entropy, **kwargs)
            loss, norm, clipped = out.loss, (normalizer.pg, normalizer.kl, normalizer.entropy), int(out.clipped_tokens)
        else:
            loss, norm, clipped = loop_policy_loss(
                logp, case["old"], adv, case["resp"], w, ref=ref, entropy=entropy, budget=budget, **settings
            )
        loss.backward()
        results.append(
            dict(
                loss=_num(loss),
                grad=logp.grad.clone(),
                norm=norm,
                clipped=clipped,
                entropy_grad=None if entropy is None else entropy.grad.clone(),
            )
        )
    return results


def assert_same(got, expected, terms=("pg", "kl", "entropy")):
    assert got["loss"] == pytest.approx(expected["loss"], abs=1e-12, rel=1e-10)
    torch.testing.assert_close(got["grad"], expected["grad"], rtol=1e-10, atol=1e-13)
    if expected["entropy_grad"] is not None:
        torch.testing.assert_close(got["entropy_grad"], expected["entropy_grad"], rtol=1e-10, atol=1e-13)
    for name, a, b in zip(("pg", "kl", "entropy"), got["norm"], expected["norm"]):
        if name in terms:
            assert a == b, name
    assert got["clipped"] == expected["clipped"]


def row_divisor(case, w, agg, norm, budget=0):
    """The divisor of a row's policy-gradient sum: N (token-mean), kept rows × the row's count (seq-mean), B·budget."""
    resp = case["resp"].tolist()
    sel = [[float(r != 0 and x != 0) for r, x in zip(rr, wr)] for rr, wr in zip(resp, w.tolist())]
    den = sel if norm == "selected" else resp
    B = len(resp)
    if agg == "token-mean":
        return [max(sum(map(sum, den)), 1.0)] * B
    if agg == "seq-mean-token-sum-norm":
        return [max(B * budget, 1.0)] * B
    kept = sum(1 for row in den if sum(row) > 0)
    return [max(sum(row), 1.0) * kept for row in den]


GSPO_AGGS = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


@pytest.mark.parametrize("agg", GSPO_AGGS)
@pytest.mark.parametrize("norm", ["selected", "all"])
@pytest.mark.parametrize("seed", range(4))
def test_gspo_token_loss_and_gradient_match_the_loop(agg, norm, seed):
    """GSPO-token: every token of row i has the ratio value s_i = exp(mean over the row's selected tokens of
    logp − old) and the gradient −Â_i·s_i·w_t/D (D the row's divisor) where the unclipped branch is active, 0 where the
    clip binds; rows with no selected token contribute nothing."""
    case = ragged_case(seed)
    # old log-probs whose mean log-ratio over each row's selected tokens is a chosen target (token noise kept): the
    # sequence ratios fall on both sides of the clip range and inside it
    targets = torch.tensor([0.3, 0.02, -0.05, -0.3, 0.08, 0.08, -0.2, 0.0], dtype=torch.float64)
    targets = targets[torch.tensor([0, 1, 2, 3, 4, 5, 6, 7]).roll(seed)] if seed % 2 else targets
    targets[5] = targets[4]  # rows 4 and 5 stay identical
    chosen = case["resp"] * case["sel"]
    deviation = case["old"] - case["logp"]
    row_mean = (deviation * chosen).sum(1, keepdim=True) / chosen.sum(1, keepdim=True).clamp_min(1)
    case = {**case, "old": case["logp"] + deviation - row_mean - targets[:, None]}
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


@pytest.mark.parametrize("agg", GSPO_AGGS)
@pytest.mark.parametrize("seed", range(4))
def test_cispo_loss_and_gradient_match_the_loop(agg, seed):
    """CISPO: pg_t = −sg(clip(r_t))·Â·logp_t; its gradient −clip(r_t)·Â·w_t/D is non-zero on clipped tokens too."""
    case = ragged_case(seed)
    old = case["old"] + 0.5 * torch.randn(case["old"].shape, generator=case["gen"], dtype=torch.float64)
    case = {**case, "old": old}
    impl, ref = both_losses(case, kind="cispo", agg=agg, budget=11)
    assert_same(impl, ref)
    logp, resp, sel, adv = case["logp"], case["resp"], case["sel"], case["adv"]
    divisor = row_divisor(case, sel, agg, "selected", budget=11)
    clipped_with_gradient = 0
    for i in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            r = math.exp(float(logp[i, t] - old[i, t]))
            bounded = min(max(r, 0.8), 1.28)
            expected = -bounded * float(adv[i]) / divisor[i] if resp[i, t] and sel[i, t] else 0.0
            assert float(impl["grad"][i, t]) == pytest.approx(expected, abs=1e-13, rel=1e-10), (i, t)
            if resp[i, t] and sel[i, t] and bounded != r and adv[i] != 0:
                assert impl["grad"][i, t] != 0
                clipped_with_gradient += 1
    assert clipped_with_gradient > 0 and impl["clipped"] > 0


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
        counted = LossNormalizer.count(resp, w, "seq-mean-token-sum-norm", norm, kl_masked, True, budget, kl_w)
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
    normalizer = LossNormalizer.count(resp, case["sel"], "seq-mean-token-sum-norm", "selected", True, False, budget)
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
            normalizer = LossNormalizer.count(resp, w, agg, "selected", True, budget=10)
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
@pytest.mark.parametrize("agg", GSPO_AGGS)
@pytest.mark.parametrize("kl_masked", [True, False])
def test_policy_loss_with_each_kl_estimator_matches_the_loop(estimator, agg, kl_masked):
    case = ragged_case(1)
    ref = case["ref"].clone()
    ref[1, :3] = case["logp"][1, :3] + torch.tensor([4.0, 30.0, -25.0], dtype=torch.float64)
    case = {**case, "ref": ref}
    impl, expected = both_losses(case, agg=agg, beta=0.03, estimator=estimator, kl_masked=kl_masked, budget=8)
    assert_same(impl, expected)


@pytest.mark.parametrize("agg", GSPO_AGGS)
@pytest.mark.parametrize("ent_masked", [False, True])
@pytest.mark.parametrize("norm", ["selected", "all"])
@pytest.mark.parametrize("seed", range(3))
def test_entropy_bonus_is_minus_alpha_mean_entropy(agg, ent_masked, norm, seed):
    """loss − loss(α = 0) = −α·Σ H·w_H / N_H (token-mean; N_H = response tokens, or selected tokens when masked), the
    per-row mean over the kept rows (seq-mean-token-mean), Σ H·w_H / (B·budget) (sum-norm); ∂/∂H = −α·w_H/D."""
    case = ragged_case(seed)
    alpha = 0.02
    impl, expected = both_losses(case, agg=agg, norm=norm, alpha=alpha, ent_masked=ent_masked, beta=0.02, budget=9)
    assert_same(impl, expected)
    off, _ = both_losses(case, agg=agg, norm=norm, alpha=0.0, ent_masked=ent_masked, beta=0.02, budget=9)
    torch.testing.assert_close(impl["grad"], off["grad"], rtol=0, atol=0)  # the bonus leaves ∂/∂logp alone
    resp, sel, H = case["resp"].tolist(), case["sel"].tolist(), case["entropy"].tolist()
    B, T = len(resp), len(resp[0])
    w_h = [[(resp[i][t] * sel[i][t]) if ent_masked else resp[i][t] for t in range(T)] for i in range(B)]
    den = [[(resp[i][t] * sel[i][t]) if norm == "selected" else resp[i][t] for t in range(T)] for i in range(B)]
    expected_grad = [[0.0] * T for _ in range(B)]
    if agg == "token-mean":
        n_h = sum(map(sum, w_h))
        assert (
            impl["norm"][2]
            == n_h
            == (
                sum(map(sum, [[r * s for r, s in zip(rr, ss)] for rr, ss in zip(resp, sel)]))
                if ent_masked
                else sum(map(sum, resp))
            )
        )
        bonus = -alpha * sum(H[i][t] * w_h[i][t] for i in range(B) for t in range(T)) / n_h
        for i in range(B):
            for t in range(T):
                expected_grad[i][t] = -alpha * w_h[i][t] / n_h
    elif agg == "seq-mean-token-mean":
        kept = [i for i in range(B) if sum(den[i]) > 0]
        bonus = -alpha * sum(sum(H[i][t] * w_h[i][t] for t in range(T)) / max(sum(w_h[i]), 1) for i in kept) / len(kept)
        for i in kept:
            for t in range(T):
                expected_grad[i][t] = -alpha * w_h[i][t] / max(sum(w_h[i]), 1) / len(kept)
    else:
        bonus = -alpha * sum(H[i][t] * w_h[i][t] for i in range(B) for t in range(T)) / (B * 9)
        for i in range(B):
            for t in range(T):
                expected_grad[i][t] = -alpha * w_h[i][t] / (B * 9)
    assert impl["loss"] - off["loss"] == pytest.approx(bonus, abs=1e-12)
    torch.testing.assert_close(
        impl["entropy_grad"], torch.tensor(expected_grad, dtype=torch.float64), rtol=1e-12, atol=1e-15
    )


def per_token_fields(case, *, infinite=True):
    """Per-token ε (some infinite), fractional KL weights, per-token advantages (ties, zeros), drift coefficients and
    fractional token weights, all exactly representable in float32 (the loss casts the weights to float32)."""
    g = case["gen"]
    shape = case["logp"].shape

    def pick(values):
        return torch.tensor(values, dtype=torch.float64)[torch.randint(0, len(values), shape, generator=g)]

    lo = pick([0.1, 0.2, 0.5, 1.0])
    hi = pick([0.125, 0.25, 0.5] + ([float("inf")] if infinite else []))
    kl_w = pick([0.0, 0.25, 1.0, 2.0])
    adv = torch.randn(shape, generator=g, dtype=torch.float64)
    adv[2] = 0.0
    adv[6, :2] = 0.75  # tied token advantages
    drift = pick([0.0, 0.0, 0.5, 1.0])
    w = case["sel"] * pick([0.25, 0.5, 1.0, 1.5])
    return dict(lo=lo, hi=hi, kl_w=kl_w, adv=adv, drift=drift, w=w)


@pytest.mark.parametrize("field", ["clip", "kl_weights", "advantages", "drift", "weights", "all"])
@pytest.mark.parametrize("kind", POLICY_LOSSES)
@pytest.mark.parametrize("agg", GSPO_AGGS)
@pytest.mark.parametrize("seed", range(2))
def test_per_token_fields_match_the_loop(field, kind, agg, seed):
    """A selection's per-token fields (clip ε with inf, KL weights — which also weigh token-mean's KL divisor —,
    (b, T) advantages, the drift penalty β_t·|logp − old|, fractional weights) against the loop, value and gradient;
    each field changes the loss, except ε under DPPO and SAPO, which have no ratio clip (docs/algorithms.md §11.9)."""
    case = ragged_case(seed)
    case = {
        **case,
        "old": case["old"] + 0.3 * torch.randn(case["old"].shape, generator=case["gen"], dtype=torch.float64),
    }
    fields = per_token_fields(case)
    chosen = {
        "clip": ("lo", "hi"),
        "kl_weights": ("kl_w",),
        "advantages": ("adv",),
        "drift": ("drift",),
        "weights": ("w",),
        "all": ("lo", "hi", "kl_w", "adv", "drift", "w"),
    }[field]
    settings = {name: fields[name] for name in chosen if name not in ("adv", "w")}
    extra = {name: fields[name] for name in chosen if name in ("adv", "w")}
    common = dict(kind=kind, agg=agg, beta=0.05, budget=10)
    impl, ref = both_losses(case, **extra, **settings, **common)
    assert_same(impl, ref)
    if agg == "token-mean" and "kl_w" in settings:  # the KL divisor is the KL-weighted count of selected tokens
        w = extra.get("w", case["sel"])
        assert impl["norm"][1] == float((case["resp"] * (w != 0) * settings["kl_w"]).sum())
    plain, _ = both_losses(case, **common)
    if field == "clip" and kind in ("dppo", "sapo"):
        assert impl["loss"] == plain["loss"] and torch.equal(impl["grad"], plain["grad"])
    else:
        assert impl["loss"] != pytest.approx(plain["loss"], abs=1e-9) or not torch.allclose(impl["grad"], plain["grad"])


def test_infinite_clip_bounds_leave_the_ratio_unclipped():
    """ε_low = 1 and ε_high = inf (KL-Cov's `unclipped`) make the clip a no-op: PPO's pg_t = −r_t·Â exactly."""
    case = ragged_case(2)
    shape = case["logp"].shape
    lo, hi = torch.ones(shape, dtype=torch.float64), torch.full(shape, float("inf"), dtype=torch.float64)
    old = case["old"] - 2.0  # ratios up to e^2: a finite clip would bind
    case = {**case, "old": old}
    impl, ref = both_losses(case, lo=lo, hi=hi)
    assert_same(impl, ref)
    assert impl["clipped"] == 0
    sel = (case["resp"] * case["sel"]).bool()
    n = float(sel.sum())
    expected = -(torch.exp(case["logp"] - old) * case["adv"][:, None])[sel].sum() / n
    assert impl["loss"] == pytest.approx(float(expected), abs=1e-12)


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


def test_all_zero_advantages_give_zero_policy_gradient_for_every_loss():
    case = ragged_case(0)
    zero = torch.zeros_like(case["adv"])
    for kind in POLICY_LOSSES:
        for agg in GSPO_AGGS:
            impl, ref = both_losses(case, adv=zero, kind=kind, agg=agg, budget=8)
            assert_same(impl, ref)
            assert impl["loss"] == 0.0 and torch.equal(impl["grad"], torch.zeros_like(impl["grad"]))


@pytest.mark.parametrize("d", [800.0, -800.0])
def test_low_var_kl_is_finite_with_zero_gradient_far_out(d):
    """The log-ratio clamp keeps low_var_kl finite, and its gradient 0 rather than NaN, where exp(d) overflows."""
    from tokenrl.algorithms.grpo import kl_estimate

    logp = torch.tensor([[-1.0]], dtype=torch.float64, requires_grad=True)
    value = kl_estimate(logp, logp.detach() + d, "low_var_kl")
    value.sum().backward()
    assert float(value.detach()) == 10.0 and float(logp.grad) == 0.0


# ---------------------------------------------------------------------------------------------------------------------
# Issue #23: GSPO's sequence form, DPPO, SAPO and the engine's masked / sequence-level importance weights. Each against
# the float64 loop (value and gradient) on ragged rows whose ratios are well away from 1 — π_θ has moved from π_old, as
# from the second mini-batch of a rollout step on —, hand-computed cases, and a peer's unit-test value where one exists.
# ---------------------------------------------------------------------------------------------------------------------


def moved_case(seed, shift=0.45):
    """ragged_case (12 rows) with π_old far from π_θ: π_old(o_t) = π_θ(o_t) + U(−shift, shift), kept in [0.02, 0.98],
    so ratios fall on both sides of 1, well away from it, and probabilities move by more than 0.15 on many tokens (both
    signs of Â, both directions of the move)."""
    case = ragged_case(seed, B=12, T=9)
    noise = shift * (2 * torch.rand(case["logp"].shape, generator=case["gen"], dtype=torch.float64) - 1)
    old = (case["logp"].exp() + noise).clamp(0.02, 0.98).log()
    old[5] = old[4]  # rows 4 and 5 stay identical
    return {**case, "old": old}


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
@pytest.mark.parametrize("agg", GSPO_AGGS)
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
    dropped = dppo_dropped(case["logp"], case["old"], case["adv"][:, None], *dppo)
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
        LossNormalizer.count(resp, resp, "token-mean", "selected", True),
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
    assert dppo_dropped(p.log(), old, adv, "kl", 0.2, 0.2).tolist() == [[True, False, True, False, False]]
    assert not dppo_dropped(p.log(), old, adv, "kl", 0.25, 0.25).any()


@pytest.mark.parametrize("taus", [(1.0, 1.05), (3.0, 6.0)])
@pytest.mark.parametrize("agg", GSPO_AGGS)
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
    normalizer = LossNormalizer.count(resp, resp, "token-mean", "selected", True)
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


@pytest.mark.parametrize("agg", GSPO_AGGS)
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


@pytest.mark.parametrize("agg", GSPO_AGGS)
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


def loop_engine_weights(trainer, engine, resp, mode, cap, floor):
    """TRL's vllm_importance_sampling_mode, by loops: per-token or per-row (product over the row's response tokens)
    ratio, clamped to [floor, cap] (truncate) or kept only inside it (mask); and whether each token's ratio is
    outside."""
    B, T = len(trainer), len(trainer[0])
    weights, outside = [[1.0] * T for _ in range(B)], [[False] * T for _ in range(B)]
    low = 0.0 if floor is None else floor
    for i in range(B):
        row = sum(trainer[i][t] - engine[i][t] for t in range(T) if resp[i][t])
        for t in range(T):
            log_ratio = row if mode.startswith("sequence") else (trainer[i][t] - engine[i][t] if resp[i][t] else 0.0)
            r = math.exp(max(-20.0, min(20.0, log_ratio)))
            outside[i][t] = r > cap or r < low
            if mode.endswith("truncate"):
                weights[i][t] = min(max(r, low), cap) if floor is not None else min(r, cap)
            else:
                weights[i][t] = 0.0 if outside[i][t] else r
    return weights, outside


@pytest.mark.parametrize("mode", TIS_MODES)
@pytest.mark.parametrize("floor", [None, 0.5])
@pytest.mark.parametrize("seed", range(3))
def test_engine_importance_weights_match_the_loop_in_every_mode(mode, floor, seed):
    """The engine→trainer weights of every mode against the loop, and in the loss (value and gradient): the weights
    multiply each token's policy-gradient term, detached. Padding never enters a row's product (garbage there changes
    nothing)."""
    case = moved_case(seed, shift=0.2)
    g = case["gen"]
    trainer = case["old"]
    engine = trainer + 0.25 * torch.randn(trainer.shape, generator=g, dtype=torch.float64)
    engine[0, 0] = trainer[0, 0] + 3.0  # a token the engine liked far more: r = e^-3
    resp = case["resp"]
    cap = 1.6
    weights, outside = engine_is_weights(trainer, engine, resp, mode, cap, floor)
    exp_w, exp_out = loop_engine_weights(trainer.tolist(), engine.tolist(), resp.tolist(), mode, cap, floor)
    torch.testing.assert_close(weights, torch.tensor(exp_w, dtype=torch.float64), rtol=1e-13, atol=1e-15)
    assert outside.tolist() == exp_out
    valid = resp.bool()
    assert 0 < int(outside[valid].sum()) < int(valid.sum())  # both inside and outside occur
    garbage = engine.clone()
    garbage[~valid] = 17.0
    again, _ = engine_is_weights(trainer, garbage, resp, mode, cap, floor)
    assert torch.equal(again[valid], weights[valid])
    impl, ref = both_losses(case, is_w=weights, agg="seq-mean-token-mean", beta=0.02)
    assert_same(impl, ref)


def test_engine_importance_weights_by_hand():
    """Row 0: token ratios 0.4, 1, 6 (product 2.4); row 1: 0.9, 1.1 and padding (product 0.99). Bounds [0.5, 5]
    (IcePop's band in OpenRLHF): token_truncate clamps each, token_mask zeroes 0.4 and 6, the sequence modes act on
    2.4 and 0.99 — both inside, so they keep them on every token of the row."""
    ratios = torch.tensor([[0.4, 1.0, 6.0], [0.9, 1.1, 1.0]], dtype=torch.float64)
    trainer = ratios.log()
    engine = torch.zeros_like(trainer)
    engine[1, 2] = -9.0  # padding: ignored
    resp = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    expected = {
        "token_truncate": [[0.5, 1.0, 5.0], [0.9, 1.1, 1.0]],
        "token_mask": [[0.0, 1.0, 0.0], [0.9, 1.1, 1.0]],
        "sequence_truncate": [[2.4] * 3, [0.99] * 3],
        "sequence_mask": [[2.4] * 3, [0.99] * 3],
    }
    for mode, values in expected.items():
        weights, outside = engine_is_weights(trainer, engine, resp, mode, 5.0, 0.5)
        torch.testing.assert_close(
            weights[resp.bool()], torch.tensor(values, dtype=torch.float64)[resp.bool()], rtol=1e-14, atol=1e-15
        )
        assert int(outside[resp.bool()].sum()) == (2 if mode.startswith("token") else 0)
    weights, outside = engine_is_weights(trainer, engine, resp, "sequence_mask", 2.0, None)  # 2.4 > 2: row 0 out
    assert weights[0].tolist() == [0.0] * 3 and outside[0].all() and not outside[1, :2].any()
    weights, _ = engine_is_weights(trainer, engine, resp, "sequence_truncate", 2.0, None)
    assert weights[0].tolist() == [2.0] * 3


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            dict(policy_loss="dppo", dppo_divergence="js"),
            r"algorithm.dppo_divergence='js' is not one of \('tv', 'kl'\)",
        ),
        (dict(dppo_low=0.0), r"algorithm.dppo_low=0.0 must be > 0"),
        (dict(sapo_tau_neg=-1.0), r"algorithm.sapo_tau_neg=-1.0 must be > 0"),
        (
            dict(policy_loss="sapo", dual_clip=3.0),
            r"algorithm.dual_clip=3.0 does not apply to algorithm.policy_loss=sapo",
        ),
        (dict(tis_mode="token_clip", tis_cap=2.0), r"algorithm.tis_mode='token_clip' is not one of \('token_truncate'"),
        (dict(tis_mode="token_mask"), r"algorithm.tis_mode=token_mask has no effect while algorithm.tis_cap=null"),
        (dict(tis_min=0.5), r"algorithm.tis_min=0.5 has no effect while algorithm.tis_cap=null"),
        (dict(tis_min=3.0, tis_cap=2.0), r"algorithm.tis_min=3.0 must lie in \(0, algorithm.tis_cap=2.0\)"),
    ],
)
def test_bad_dppo_sapo_and_engine_weight_settings_are_named(changes, message):
    with pytest.raises(ValueError, match=message):
        algorithm_config(**changes)


def test_new_losses_are_named_and_valid_with_their_settings():
    for kind in ("gspo_seq", "dppo", "sapo"):
        assert algorithm_config(policy_loss=kind).loss.policy_loss == kind
    cfg = algorithm_config(tis_mode="sequence_mask", tis_min=0.5, tis_cap=5.0, dppo_divergence="kl")
    assert (cfg.engine_is.tis_mode, cfg.engine_is.tis_min, cfg.engine_is.tis_cap, cfg.loss.dppo_divergence) == (
        "sequence_mask",
        0.5,
        5.0,
        "kl",
    )
