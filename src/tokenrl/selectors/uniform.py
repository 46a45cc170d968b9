"""`uniform`: plain GRPO, every response token is updated (M ≡ 1; DeepSeekMath, arXiv 2402.03300)."""

from __future__ import annotations

import torch

from tokenrl.records.selection import SelectionBatch
from tokenrl.selectors.base import TokenSelector


class UniformSelector(TokenSelector):
    name = "uniform"
    row_local = True

    def mask(self, batch: SelectionBatch) -> torch.Tensor:
        return batch.response_mask.float()
