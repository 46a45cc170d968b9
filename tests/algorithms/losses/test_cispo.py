"""CISPO against the loop and its gradient token by token: non-zero on clipped tokens too."""

from __future__ import annotations

import math

import pytest
import torch

from tests.algorithms.losses.cases import AGGREGATIONS, assert_same, both_losses, ragged_case, row_divisor


@pytest.mark.parametrize("agg", AGGREGATIONS)
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
