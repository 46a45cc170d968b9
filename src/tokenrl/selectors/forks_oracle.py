"""Controls of `task=forks` that read the truth: `forks_oracle` updates exactly the true forks F of each response
(M = F; with `with_forced`, also its forced positions: on the graph and not a decision, records/marks.py — the start
letter, a one-option step, the stop at the goal); `forks_matched_random` updates, per response i, |F_i| tokens drawn
uniformly among its response tokens (seeded by seed, step and row, as selectors/random_control.py). The oracle
is one fork-only mask, never wrong about where the forks are, at one budget: not an upper bound on what a selector can
gain (other budgets, lrs or masks may do better). The matched control has its budget and no knowledge. Both need a
task that names its forks (the start-up check refuses them elsewhere: config/check.py)."""

from __future__ import annotations

import torch

from tokenrl.records.rules import integer, one_of
from tokenrl.records.selection import SelectionBatch
from tokenrl.selectors.base import TokenSelector
from tokenrl.utils import derived_seed


def true_forks(batch: SelectionBatch, name: str) -> torch.Tensor:
    """(b, T) bool: the true forks of the batch's response tokens."""
    if batch.forks is None:
        raise ValueError(f"selector={name} reads the task's true forks, and this task cannot name them: use task=forks")
    return batch.forks.forks.bool() & batch.response_mask.bool()


class ForksOracleSelector(TokenSelector):
    name = "forks_oracle"
    row_local = True
    requires = frozenset({"forks"})
    config_rules = {**TokenSelector.config_rules, "with_forced": one_of(True, False)}

    def __init__(self, with_forced: bool = False, normalizer: str = "selected") -> None:
        super().__init__(normalizer)
        self.with_forced = with_forced

    def mask(self, batch: SelectionBatch) -> torch.Tensor:
        chosen = true_forks(batch, self.name)
        if self.with_forced:
            assert batch.forks is not None  # true_forks refused a batch without them
            forced = batch.forks.on_graph.bool() & ~batch.forks.decisions.bool()
            chosen = chosen | (forced & batch.response_mask.bool())
        return chosen.float()


class ForksMatchedRandomSelector(TokenSelector):
    name = "forks_matched_random"
    row_local = True
    requires = frozenset({"forks"})
    config_rules = {**TokenSelector.config_rules, "seed": integer(0)}

    def __init__(self, seed: int = 0, normalizer: str = "selected") -> None:
        super().__init__(normalizer)
        self.seed = seed

    def mask(self, batch: SelectionBatch) -> torch.Tensor:
        valid = batch.response_mask.bool()
        counts = true_forks(batch, self.name).sum(dim=1).tolist()
        mask = torch.zeros_like(valid)
        for row, (row_id, count) in enumerate(zip(batch.row_ids.tolist(), counts)):
            positions = valid[row].nonzero().squeeze(1)
            generator = torch.Generator().manual_seed(derived_seed(self.seed, "forks-matched", batch.step, row_id))
            mask[row, positions[torch.randperm(len(positions), generator=generator)[:count]]] = True
        return mask.float()
