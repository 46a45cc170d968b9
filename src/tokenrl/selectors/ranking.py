"""Exact top-fraction selection shared by the selectors: k = ⌈fraction · n⌉ (at least 1 when n > 0) of the n
candidates with the highest score; ties are broken by position (earlier row-major position first), so every scope is
deterministic and a global selection over ranks equals the selection on the concatenated batch."""

from __future__ import annotations

import math

import torch

from tokenrl.records.rules import number
from tokenrl.records.selection import SelectionBatch

SCOPES = ("sequence", "batch", "global")
RATIO = number(0, 1, low_open=True)  # the fraction a top-fraction selector keeps


def top_count(fraction: float, n: int) -> int:
    """⌈fraction · n⌉, at least 1 for n > 0 (rounded first so 0.1 · 30 is 3, not 4)."""
    return 0 if n == 0 else max(1, math.ceil(round(fraction * n, 9)))


def top_fraction(scores: torch.Tensor, fraction: float) -> torch.Tensor:
    """Bool mask of the top ⌈fraction · n⌉ entries of a 1-D tensor (stable: earlier index wins ties)."""
    chosen = torch.zeros(scores.shape[0], dtype=torch.bool)
    order = torch.sort(scores, descending=True, stable=True).indices
    chosen[order[: top_count(fraction, scores.shape[0])]] = True
    return chosen


def scoped_top_fraction(scores: torch.Tensor, batch: SelectionBatch, fraction: float, scope: str) -> torch.Tensor:
    """(b, T) bool: the top `fraction` of response tokens by `scores`, per response (`sequence`), over this
    rank's mini-batch (`batch`) or over the mini-batch of all ranks (`global`)."""
    valid = batch.response_mask.bool()
    mask = torch.zeros_like(valid)
    if scope == "sequence":
        for row in range(valid.shape[0]):
            positions = valid[row].nonzero().squeeze(1)
            mask[row, positions[top_fraction(scores[row, positions], fraction)]] = True
        return mask
    local = scores[valid].float()
    if scope == "batch":
        mask[valid] = top_fraction(local, fraction)
        return mask
    parts = batch.gather(local)
    chosen = top_fraction(torch.cat(parts), fraction)
    start = sum(part.shape[0] for part in parts[: batch.rank])
    mask[valid] = chosen[start : start + local.shape[0]]
    return mask
