"""Shared by the per-loss tests: `policy_loss` called with the tests' names (`loss_of`), random ragged float64
inputs (`ragged_case`, `moved_case`, `per_token_fields`), and the implementation beside the float64 loop of
tests/algorithms/losses/reference.py on the same inputs (`both_losses`, `assert_same`, `row_divisor`)."""

from __future__ import annotations

import pytest
import torch

from tests.algorithms.losses.reference import loop_policy_loss, to_float
from tokenrl.algorithms.config import LossSettings
from tokenrl.algorithms.grpo import LossNormalizer, policy_loss
from tokenrl.records.loss_inputs import LossInputs
from tokenrl.records.selection import Selection


def normalizer_of(
    response_mask,
    token_mask,
    aggregation,
    norm="selected",
    kl_masked=True,
    entropy_masked=False,
    budget=0,
    kl_weights=None,
):
    """`LossNormalizer.count` with these tests' names: the selection's fields into `Selection`, the settings into
    `LossSettings`."""
    settings = LossSettings(
        aggregation, 0.2, 0.2, kl_masked=kl_masked, entropy_masked=entropy_masked, response_budget=budget
    )
    return LossNormalizer.count(response_mask, Selection(token_mask, norm, kl_weights=kl_weights), settings)


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


def moved_case(seed, shift=0.45):
    """ragged_case (12 rows) with π_old far from π_θ: π_old(o_t) = π_θ(o_t) + U(−shift, shift), kept in [0.02, 0.98],
    so ratios fall on both sides of 1, well away from it, and probabilities move by more than 0.15 on many tokens (both
    signs of Â, both directions of the move)."""
    case = ragged_case(seed, B=12, T=9)
    noise = shift * (2 * torch.rand(case["logp"].shape, generator=case["gen"], dtype=torch.float64) - 1)
    old = (case["logp"].exp() + noise).clamp(0.02, 0.98).log()
    old[5] = old[4]  # rows 4 and 5 stay identical
    return {**case, "old": old}


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
            normalizer = normalizer_of(
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
                loss=to_float(loss),
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


AGGREGATIONS = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
