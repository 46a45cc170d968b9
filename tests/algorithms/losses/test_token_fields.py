"""A selection's per-token fields (clip ε, KL weights, (b, T) advantages, drift, fractional weights) in every
policy loss against the loop; infinite clip bounds leave the ratio unclipped."""

from __future__ import annotations

import pytest
import torch

from tests.algorithms.losses.cases import AGGREGATIONS, assert_same, both_losses, per_token_fields, ragged_case
from tokenrl.algorithms.surrogates import BUILT_IN_SURROGATES as POLICY_LOSSES


@pytest.mark.parametrize("field", ["clip", "kl_weights", "advantages", "drift", "weights", "all"])
@pytest.mark.parametrize("kind", POLICY_LOSSES)
@pytest.mark.parametrize("agg", AGGREGATIONS)
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
