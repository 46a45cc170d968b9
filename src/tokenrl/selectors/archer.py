"""`archer`: dual-token constraints (Archer, "Stabilizing Knowledge, Promoting Reasoning", arXiv 2507.15778;
docs/algorithms.md §11.7). Every response token is updated; per response, the tokens above the q-quantile of its
entropy (q = 0.8: the top 20%, "reasoning" tokens) get a looser clip ε_high-entropy and a weaker KL
(weight `high_entropy_kl_weight` × β), the rest ("knowledge" tokens, ties at the quantile included) the tighter
ε_low-entropy and the full KL β. The quantile interpolates linearly (torch.quantile, as the official
`torch.nanquantile`); the entropy is the current policy's (`stats_policy=current`, as the official code's)."""

from __future__ import annotations

import torch

from tokenrl.records.rules import number
from tokenrl.records.selection import Selection, SelectionBatch
from tokenrl.selectors.base import TokenSelector


class ArcherSelector(TokenSelector):
    name = "archer"
    requires = frozenset({"entropy"})
    weighs_kl = True
    row_local = True
    config_rules = {
        **TokenSelector.config_rules,
        "quantile": number(0, 1),
        "low_entropy_clip": number(0),
        "high_entropy_clip": number(0),
        "high_entropy_kl_weight": number(0),
    }

    def __init__(
        self,
        quantile: float = 0.8,
        low_entropy_clip: float = 0.2,
        high_entropy_clip: float = 0.5,
        high_entropy_kl_weight: float = 0.0,
        normalizer: str = "selected",
        stats_policy: str = "current",
    ) -> None:
        super().__init__(normalizer, stats_policy)
        self.quantile, self.low_clip, self.high_clip = quantile, low_entropy_clip, high_entropy_clip
        self.high_kl_weight = high_entropy_kl_weight

    def mask(self, batch: SelectionBatch) -> torch.Tensor:
        return batch.response_mask.float()

    def high_entropy(self, batch: SelectionBatch) -> torch.Tensor:
        """(b, T) bool: the response tokens whose entropy exceeds their response's q-quantile."""
        valid = batch.response_mask.bool()
        high = torch.zeros_like(valid)
        for row in range(valid.shape[0]):
            entropy = batch.stats.entropy[row][valid[row]].double()
            if entropy.numel():
                high[row, valid[row]] = entropy > torch.quantile(entropy, self.quantile)
        return high

    def select(self, batch: SelectionBatch) -> Selection:
        weights = batch.response_mask.float()
        high = self.high_entropy(batch)
        clip = torch.where(high, self.high_clip, self.low_clip).float()
        kl_weights = torch.where(high, self.high_kl_weight, 1.0).float() * weights
        return Selection(weights, self.normalizer, clip_low=clip, clip_high=clip, kl_weights=kl_weights)
