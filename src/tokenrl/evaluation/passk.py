"""Unbiased pass@k (Chen et al. 2021, arXiv 2107.03374, eq. 1): with n samples of which c are correct,

    pass@k = 1 − C(n−c, k) / C(n, k) = 1 − Π_{i=n−c+1}^{n} (1 − k/i)      (stable product form)

averaged over problems. pass@1 = c/n (= avg@n). k ≤ n is required.
"""

from __future__ import annotations

import math

import torch
from torchmetrics import Metric


def pass_at_k(n: int, c: int, k: int) -> float:
    if not 0 < k <= n:
        raise ValueError(f"pass@{k} needs 1 <= k <= n samples per problem (n={n}); raise eval.n_samples")
    if not 0 <= c <= n:
        raise ValueError(f"correct count c={c} must be within 0..n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


class PassAtK(Metric):
    """Mean unbiased pass@k over problems; `update(correct_counts, n)` with per-problem correct counts."""

    full_state_update = False
    higher_is_better = True
    total: torch.Tensor  # states (add_state)
    problems: torch.Tensor

    def __init__(self, k: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.k = k
        self.add_state("total", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("problems", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, correct: torch.Tensor, n: int) -> None:
        values = [pass_at_k(n, int(c), self.k) for c in correct.reshape(-1).tolist()]
        self.total += torch.tensor(sum(values), dtype=torch.float64)
        self.problems += len(values)

    def compute(self) -> torch.Tensor:
        return self.total / self.problems.clamp_min(1)
