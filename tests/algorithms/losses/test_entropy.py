"""The entropy bonus: −α times the entropy's mean under each aggregation, and its gradient, against explicit
float64 sums."""

from __future__ import annotations

import pytest
import torch

from tests.algorithms.losses.cases import AGGREGATIONS, assert_same, both_losses, ragged_case


@pytest.mark.parametrize("agg", AGGREGATIONS)
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
