"""DAPO pieces (arXiv 2503.14476; docs/algorithms.md §1.3): overlong reward shaping and dynamic sampling's group filter.

Overlong shaping (Eq. 13, verl's `overlong_buffer`): R_len(y) = min(0, −(|y| − (L_max − L_cache)) / L_cache) · factor,
0 up to L_max − L_cache tokens, falling linearly to −factor at L_max = `rollout.max_new_tokens`, with
L_cache = `algorithm.overlong_buffer` (0 = off) and factor = `algorithm.overlong_penalty_factor`.
Dynamic sampling keeps a group only if 0 < |{o_i correct}| < G (Eq. 11); verl's `filter_groups` generalises it to
"the metric is not the same for every response" (`acc`: the verifier says correct; `reward`: the shaped reward)."""

from __future__ import annotations

import torch


def overlong_penalty(lengths: torch.Tensor, max_len: int, buffer: int, factor: float = 1.0) -> torch.Tensor:
    """R_len of responses with `lengths` tokens (float, ≤ 0); all zeros when `buffer` is 0 (AlgorithmConfig keeps
    `buffer` within [0, max_len])."""
    if buffer == 0:
        return torch.zeros(lengths.shape)
    exceed = lengths.double() - (max_len - buffer)
    return (-exceed / buffer * factor).clamp(max=0.0).float()


def varied_groups(values: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """(B,) bool: row i's group has values that are not all equal (a group of one counts as varied, as verl)."""
    keep = torch.zeros(values.shape[0], dtype=torch.bool)
    for group in group_ids.unique():
        rows = group_ids == group
        peers = values[rows]
        keep[rows] = bool(peers.numel() == 1 or peers.max() > peers.min())
    return keep
