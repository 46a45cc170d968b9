"""`entropy20`: the top ρ = 20% highest-entropy "forking" tokens ("Beyond the 80/20 Rule", arXiv 2506.01939;
docs/algorithms.md §3, §7.11–12). Exact top-⌈ρN⌉ over the response tokens of the PPO mini-batch of all ranks
(`scope=global`: results independent of the micro-batch size and world size, as TRL gathers) or of this rank's
(`batch`; the official code ranks per micro-batch per GPU). Normaliser `selected` is the official code's, `all` the
paper's formula. The entropy is the current policy's (`stats_policy=current`), as the official code's."""

from __future__ import annotations

import torch

from tokenrl.records.rules import one_of
from tokenrl.records.selection import SelectionBatch
from tokenrl.selectors.base import TokenSelector
from tokenrl.selectors.ranking import RATIO, SCOPES, scoped_top_fraction


class Entropy20Selector(TokenSelector):
    name = "entropy20"
    requires = frozenset({"entropy"})
    config_rules = {**TokenSelector.config_rules, "ratio": RATIO, "scope": one_of(*SCOPES)}

    def __init__(
        self, ratio: float = 0.2, scope: str = "global", normalizer: str = "selected", stats_policy: str = "current"
    ) -> None:
        super().__init__(normalizer, stats_policy)
        self.ratio, self.scope = ratio, scope

    def mask(self, batch: SelectionBatch) -> torch.Tensor:
        return scoped_top_fraction(batch.stats.entropy, batch, self.ratio, self.scope).float()
