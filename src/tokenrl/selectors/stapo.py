"""`stapo`: silence spurious tokens (STAPO / S2T, arXiv 2602.15620; docs/algorithms.md §4, §7.13–14). Candidates:
Â_i > 0 ∧ π(o_t) < τ_p. τ_h = the q-quantile of entropy over the candidates (`candidates`, later revision, default) or
over all response tokens of the mini-batch (`all_tokens`, v1 reading); the candidates with H ≤ τ_h — the ⌈q·n⌉
lowest-entropy ones, ties at τ_h included — are dropped from the loss, which is renormalised over the kept tokens.
p and H are the current policy's (`stats_policy=current`: Algorithm 1 takes them at update time)."""

from __future__ import annotations

import math

import torch

from tokenrl.records.rules import number, one_of
from tokenrl.records.selection import SelectionBatch
from tokenrl.selectors.base import TokenSelector

QUANTILE_SCOPES = ("candidates", "all_tokens")


def kth_smallest(values: torch.Tensor, q: float) -> torch.Tensor:
    """The ⌈q·n⌉-th smallest value (at least the 1st), avoiding torch.quantile's size limit."""
    k = max(1, math.ceil(round(q * values.numel(), 9)))
    return values.kthvalue(min(k, values.numel())).values


class STAPOSelector(TokenSelector):
    name = "stapo"
    requires = frozenset({"logprobs", "entropy"})
    config_rules = {
        **TokenSelector.config_rules,
        "tau_p": number(0, 1, low_open=True),
        "q": number(0, 1, low_open=True),
        "quantile_scope": one_of(*QUANTILE_SCOPES),
    }

    def __init__(
        self,
        tau_p: float = 0.002,
        q: float = 0.75,
        quantile_scope: str = "candidates",
        normalizer: str = "selected",
        stats_policy: str = "current",
    ) -> None:
        super().__init__(normalizer, stats_policy)
        self.tau_p, self.q, self.quantile_scope = tau_p, q, quantile_scope

    def silenced(self, batch: SelectionBatch) -> torch.Tensor:
        valid = batch.response_mask.bool()
        probability = batch.stats.logprobs.exp()
        entropy = batch.stats.entropy
        candidates = (batch.advantages[:, None] > 0) & (probability < self.tau_p) & valid
        if not candidates.any():
            return candidates
        pool = entropy[candidates] if self.quantile_scope == "candidates" else entropy[valid]
        return candidates & (entropy <= kth_smallest(pool, self.q))

    def mask(self, batch: SelectionBatch) -> torch.Tensor:
        return (batch.response_mask.bool() & ~self.silenced(batch)).float()
