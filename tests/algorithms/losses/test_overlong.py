"""DAPO's overlong penalty against Eq. 13 as written, in float64."""

from __future__ import annotations

import pytest
import torch


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
