"""`ict`: Independent Combinatorial Tokens ("Beyond Entropy", arXiv 2606.19771; docs/algorithms.md §2).
u_{i,t} = JS(π_{i,t} ‖ π̄_t) against the mean distribution of the group's active rollouts at position t (itself
included, `js_peers=all`, docs/algorithms.md §7.4; or the others only, `others`); after Θ warm-up steps with every
token, each response keeps its top ⌈ratio · T_i⌉ positions by u (`scope=sequence`, the paper's reading) and the
Sparse-GRPO loss averages over the selected tokens. `ict_complement` keeps the other (1 − ratio) "frequent" tokens:
the paper's 90%-frequent ablation."""

from __future__ import annotations

import torch

from tokenrl.algorithms.logit_statistics import JS_PEERS
from tokenrl.records.rules import integer, one_of
from tokenrl.records.selection import SelectionBatch
from tokenrl.selectors.base import TokenSelector
from tokenrl.selectors.ranking import RATIO, SCOPES, scoped_top_fraction


class ICTSelector(TokenSelector):
    name = "ict"
    requires = frozenset({"js"})
    config_rules = {
        **TokenSelector.config_rules,
        "ratio": RATIO,
        "scope": one_of(*SCOPES),
        "warmup_steps": integer(0),
        "js_peers": one_of(*JS_PEERS),
    }

    def __init__(
        self,
        ratio: float = 0.10,
        scope: str = "sequence",
        warmup_steps: int = 20,
        normalizer: str = "selected",
        js_peers: str = "all",
    ) -> None:
        super().__init__(normalizer)
        self.ratio, self.scope, self.warmup_steps, self.js_peers = ratio, scope, warmup_steps, js_peers

    def unique_tokens(self, batch: SelectionBatch) -> torch.Tensor:
        assert batch.stats.js is not None  # `requires` asks for it
        return scoped_top_fraction(batch.stats.js, batch, self.ratio, self.scope)

    def mask(self, batch: SelectionBatch) -> torch.Tensor:
        if batch.step < self.warmup_steps:
            return batch.response_mask.float()
        return self.unique_tokens(batch).float()


class ICTComplementSelector(ICTSelector):
    name = "ict_complement"

    def mask(self, batch: SelectionBatch) -> torch.Tensor:
        if batch.step < self.warmup_steps:
            return batch.response_mask.float()
        return (batch.response_mask.bool() & ~self.unique_tokens(batch)).float()
