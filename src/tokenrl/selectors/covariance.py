"""Clip-Cov and KL-Cov ("The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models", Cui et al.,
arXiv 2505.22617; verl's `compute_policy_loss_clip_cov` / `_kl_cov`; docs/algorithms.md §11.6). Both score each
response token of this rank's mini-batch (as verl scores its micro-batch) by Cov_t = (Â_t − mean Â)·(log π(o_t) − mean
log π), means over the scored tokens: `clip_cov` gives weight 0 to ⌊r·N⌋ (at least 1) tokens drawn at random among
those with lb < Cov_t < ub (they stay in the divisor: `normalizer=all`, as verl); `kl_cov` puts the penalty
β·|log π_θ − log π_old| on the top ⌊k·N⌋ (at least 1) by Cov_t and, with `unclipped`, clips no ratio (as verl)."""

from __future__ import annotations

import torch

from tokenrl.records.rules import BOOLEAN, integer, number
from tokenrl.records.selection import Selection, SelectionBatch
from tokenrl.selectors.base import TokenSelector
from tokenrl.utils import derived_seed


def centred_covariance(batch: SelectionBatch) -> torch.Tensor:
    """(b, T) Cov_t = (Â_t − mean Â)(log π(o_t) − mean log π) over the response tokens (0 elsewhere)."""
    valid = batch.response_mask.bool()
    adv = batch.advantages.double()[:, None].expand(valid.shape)
    logp = batch.stats.logprobs.double()
    cov = (adv - adv[valid].mean()) * (logp - logp[valid].mean()) if valid.any() else torch.zeros(valid.shape)
    return torch.where(valid, cov, torch.zeros_like(cov))


def count_of(fraction: float, n: int) -> int:
    """⌊fraction·n⌋, at least 1 (verl's `max(int(fraction * n), 1)`), rounded first so 2e-3 · 5000 is 10."""
    return max(int(round(fraction * n, 9)), 1)


class ClipCovSelector(TokenSelector):
    name = "clip_cov"
    requires = frozenset({"logprobs"})
    config_rules = {
        **TokenSelector.config_rules,
        "ratio": number(0, 1, low_open=True),
        "cov_low": number(),
        "cov_high": number(),
        "seed": integer(0),
    }

    def __init__(
        self,
        ratio: float = 2e-4,
        cov_low: float = 1.0,
        cov_high: float = 5.0,
        seed: int = 0,
        normalizer: str = "all",
        stats_policy: str = "current",
    ) -> None:
        super().__init__(normalizer, stats_policy)
        if not cov_low < cov_high:
            raise ValueError(f"selector.cov_low={cov_low} must be below selector.cov_high={cov_high}")
        self.ratio, self.cov_low, self.cov_high, self.seed = ratio, cov_low, cov_high, seed

    def mask(self, batch: SelectionBatch) -> torch.Tensor:
        valid = batch.response_mask.bool()
        cov = centred_covariance(batch)
        candidates = (valid & (cov > self.cov_low) & (cov < self.cov_high)).flatten().nonzero().squeeze(1)
        first_row = int(batch.row_ids[0]) if batch.row_ids.numel() else 0
        generator = torch.Generator().manual_seed(derived_seed(self.seed, "clip-cov", batch.step, first_row))
        chosen = candidates[
            torch.randperm(len(candidates), generator=generator)[: count_of(self.ratio, int(valid.sum()))]
        ]
        keep = valid.clone().flatten()
        keep[chosen] = False
        return keep.reshape(valid.shape).float()


class KLCovSelector(TokenSelector):
    name = "kl_cov"
    requires = frozenset({"logprobs"})
    config_rules = {
        **TokenSelector.config_rules,
        "ratio": number(0, 1, low_open=True),
        "coef": number(0),
        "unclipped": BOOLEAN,
    }

    def __init__(
        self,
        ratio: float = 2e-3,
        coef: float = 1.0,
        unclipped: bool = True,
        normalizer: str = "all",
        stats_policy: str = "current",
    ) -> None:
        super().__init__(normalizer, stats_policy)
        self.ratio, self.coef, self.unclipped = ratio, coef, unclipped

    def mask(self, batch: SelectionBatch) -> torch.Tensor:
        return batch.response_mask.float()

    def penalised(self, batch: SelectionBatch) -> torch.Tensor:
        """(b, T) bool: the top ⌊k·N⌋ response tokens by Cov_t."""
        valid = batch.response_mask.bool()
        chosen = torch.zeros(valid.numel(), dtype=torch.bool)
        positions = valid.flatten().nonzero().squeeze(1)
        if len(positions):
            order = torch.sort(centred_covariance(batch).flatten()[positions], descending=True, stable=True).indices
            chosen[positions[order[: count_of(self.ratio, len(positions))]]] = True
        return chosen.reshape(valid.shape)

    def select(self, batch: SelectionBatch) -> Selection:
        weights = batch.response_mask.float()
        unbounded = torch.full_like(weights, float("inf")) if self.unclipped else None
        return Selection(
            weights,
            self.normalizer,
            clip_low=None if unbounded is None else torch.ones_like(weights),
            clip_high=unbounded,
            drift_coef=self.coef * self.penalised(batch).float(),
        )
