"""`uniform`: plain GRPO, every response token is updated (M ≡ 1; DeepSeekMath, arXiv 2402.03300)."""
from __future__ import annotations

import torch

from tokenrl.algorithms.token_stats import TokenStats
from tokenrl.selectors.base import TokenSelector


class UniformSelector(TokenSelector):
    name = "uniform"

    def mask(self, stats: TokenStats, advantages: torch.Tensor, response_mask: torch.Tensor,
             group_ids: torch.Tensor, step: int) -> torch.Tensor:
        return response_mask.float()
