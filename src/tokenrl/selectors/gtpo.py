"""`gtpo`: token advantages shaped by entropy (GTPO, "GTPO and GRPO-S: Token and Sequence-Level Reward Shaping with
Policy Entropy", Tan et al., arXiv 2508.04349; docs/algorithms.md §11.8).

Within a group, O+ are the rows with Â_i > 0 and O− those with Â_i < 0; rows with Â_i = 0 get advantage 0. At position
t, over the rows of each set still active at t (d_t of them in O+, h_t in O−), with H the entropy of π_old:
    O+:  r̃_{i,t} = α1 + α2 · d_t · H_{i,t} / Σ_{k∈O+_t} H_{k,t}          (high-entropy tokens of good answers gain most)
    O−:  r̃_{j,t} = −α1 − α2 · h_t · H_{j,t}⁻¹ / Σ_{k∈O−_t} H_{k,t}⁻¹     (confident tokens of bad answers lose)
(H⁻¹ = 1/(H + ε); an all-zero entropy sum shares equally.) The token advantages are the r̃ standardised over the
group's tokens: `joint` (default) over both sets together, so every token of a good answer ranks above every token of
a bad one; `separate` over each set on its own (the paper's Eq. 6 as reconstructed, which gives about half of a good
answer's tokens a negative advantage)."""

from __future__ import annotations

import torch

from tokenrl.records.rules import number, one_of
from tokenrl.records.selection import Selection, SelectionBatch
from tokenrl.selectors.base import TokenSelector

NORMALIZATIONS = ("joint", "separate")


class GTPOSelector(TokenSelector):
    name = "gtpo"
    requires = frozenset({"entropy"})
    row_local = True
    config_rules = {
        **TokenSelector.config_rules,
        "alpha1": number(0),
        "alpha2": number(0),
        "normalize": one_of(*NORMALIZATIONS),
        "eps": number(0, low_open=True),
    }

    def __init__(
        self,
        alpha1: float = 1.0,
        alpha2: float = 0.1,
        normalize: str = "joint",
        eps: float = 1e-6,
        normalizer: str = "selected",
        stats_policy: str = "old",
    ) -> None:
        super().__init__(normalizer, stats_policy)
        self.alpha1, self.alpha2, self.normalize, self.eps = alpha1, alpha2, normalize, eps

    @property
    def reads_groups(self) -> bool:
        return True

    def mask(self, batch: SelectionBatch) -> torch.Tensor:
        return batch.response_mask.float()

    def token_advantages(self, batch: SelectionBatch) -> torch.Tensor:
        """(b, T) standardised shaped rewards Ã_{i,t} (0 outside the response and on rows with Â_i = 0)."""
        valid = batch.response_mask.bool()
        entropy = batch.stats.entropy.double()
        out = torch.zeros(valid.shape, dtype=torch.float64)
        for group in torch.unique(batch.group_ids):
            rows = (batch.group_ids == group).nonzero().squeeze(1)
            sign = torch.sign(batch.advantages[rows])
            shaped = torch.zeros(len(rows), valid.shape[1], dtype=torch.float64)
            for side, weight_of in ((1.0, lambda h: h), (-1.0, lambda h: 1.0 / (h + self.eps))):
                members = rows[sign == side]
                if not len(members):
                    continue
                active = valid[members]
                weight = torch.where(active, weight_of(entropy[members]), torch.zeros_like(entropy[members]))
                count = active.sum(0, keepdim=True).double()
                total = weight.sum(0, keepdim=True)
                share = torch.where(total > 0, weight / total.clamp_min(1e-300), active / count.clamp_min(1.0))
                shaped[sign == side] = side * (self.alpha1 + self.alpha2 * share * count) * active
            scored = valid[rows] & (sign != 0)[:, None]
            for part in (
                (scored,) if self.normalize == "joint" else (scored & (sign > 0)[:, None], scored & (sign < 0)[:, None])
            ):
                values = shaped[part]
                if values.numel() <= 1 or bool((values == values[0]).all()):
                    shaped[part] = 0.0  # nothing to standardise (a lone row of a `separate` set): exactly 0
                else:
                    shaped[part] = (values - values.mean()) / (values.std() + self.eps)
            out[rows] = shaped * scored
        return out.float()

    def select(self, batch: SelectionBatch) -> Selection:
        return Selection(batch.response_mask.float(), self.normalizer, advantages=self.token_advantages(batch))
