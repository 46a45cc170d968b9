"""DAPO's overlong reward shaping (arXiv 2503.14476, Eq. 13; ALGORITHMS.md §1.3), as verl's `overlong_buffer`.

    R_len(y) = min(0, −(|y| − (L_max − L_cache)) / L_cache) · factor

0 up to L_max − L_cache tokens, falling linearly to −factor at L_max = `rollout.max_new_tokens`, with
L_cache = `algorithm.overlong_buffer` (0 = off) and factor = `algorithm.overlong_penalty_factor`.
"""
from __future__ import annotations

import torch


def check_overlong_buffer(buffer: int, max_len: int) -> None:
    if not 0 <= buffer <= max_len:
        raise ValueError(f"algorithm.overlong_buffer={buffer} must lie in [0, rollout.max_new_tokens={max_len}] "
                         "(0 turns the shaping off)")


def overlong_penalty(lengths: torch.Tensor, max_len: int, buffer: int, factor: float = 1.0) -> torch.Tensor:
    """R_len of responses with `lengths` tokens (float, ≤ 0); all zeros when `buffer` is 0."""
    check_overlong_buffer(buffer, max_len)
    if buffer == 0:
        return torch.zeros(lengths.shape)
    exceed = lengths.double() - (max_len - buffer)
    return (-exceed / buffer * factor).clamp(max=0.0).float()
