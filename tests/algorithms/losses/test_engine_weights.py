"""The engine's importance weights (TRL's vllm_importance_sampling_mode: token or sequence, truncate or mask)
against a float64 loop and by hand, and in the loss."""

from __future__ import annotations

import math

import pytest
import torch

from tests.algorithms.losses.cases import assert_same, both_losses, moved_case
from tokenrl.algorithms.config import TIS_MODES, EngineISSettings
from tokenrl.algorithms.grpo import engine_is_weights


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
    weights, outside = engine_is_weights(trainer, engine, resp, EngineISSettings(cap, mode, floor))
    exp_w, exp_out = loop_engine_weights(trainer.tolist(), engine.tolist(), resp.tolist(), mode, cap, floor)
    torch.testing.assert_close(weights, torch.tensor(exp_w, dtype=torch.float64), rtol=1e-13, atol=1e-15)
    assert outside.tolist() == exp_out
    valid = resp.bool()
    assert 0 < int(outside[valid].sum()) < int(valid.sum())  # both inside and outside occur
    garbage = engine.clone()
    garbage[~valid] = 17.0
    again, _ = engine_is_weights(trainer, garbage, resp, EngineISSettings(cap, mode, floor))
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
        weights, outside = engine_is_weights(trainer, engine, resp, EngineISSettings(5.0, mode, 0.5))
        torch.testing.assert_close(
            weights[resp.bool()], torch.tensor(values, dtype=torch.float64)[resp.bool()], rtol=1e-14, atol=1e-15
        )
        assert int(outside[resp.bool()].sum()) == (2 if mode.startswith("token") else 0)
    weights, outside = engine_is_weights(
        trainer, engine, resp, EngineISSettings(2.0, "sequence_mask")
    )  # 2.4 > 2: row 0 out
    assert weights[0].tolist() == [0.0] * 3 and outside[0].all() and not outside[1, :2].any()
    weights, _ = engine_is_weights(trainer, engine, resp, EngineISSettings(2.0, "sequence_truncate"))
    assert weights[0].tolist() == [2.0] * 3
