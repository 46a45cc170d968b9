"""`random`: the control for ICT — per response the same number of tokens ICT keeps, ⌈ratio · T_i⌉ after the
same warm-up, chosen uniformly at random (seeded by seed, step and row), so it tells whether the JS choice matters."""

from __future__ import annotations

import torch

from tokenrl.records.rules import integer
from tokenrl.records.selection import SelectionBatch
from tokenrl.selectors.base import TokenSelector
from tokenrl.selectors.ranking import RATIO, top_count
from tokenrl.utils import derived_seed


class RandomSelector(TokenSelector):
    name = "random"
    row_local = True
    config_rules = {**TokenSelector.config_rules, "ratio": RATIO, "warmup_steps": integer(0), "seed": integer(0)}

    def __init__(
        self, ratio: float = 0.10, warmup_steps: int = 20, seed: int = 0, normalizer: str = "selected"
    ) -> None:
        super().__init__(normalizer)
        self.ratio, self.warmup_steps, self.seed = ratio, warmup_steps, seed

    def mask(self, batch: SelectionBatch) -> torch.Tensor:
        valid = batch.response_mask.bool()
        if batch.step < self.warmup_steps:
            return valid.float()
        mask = torch.zeros_like(valid)
        for row, row_id in enumerate(batch.row_ids.tolist()):
            positions = valid[row].nonzero().squeeze(1)
            generator = torch.Generator().manual_seed(derived_seed(self.seed, "random-select", batch.step, row_id))
            keep = torch.randperm(len(positions), generator=generator)[: top_count(self.ratio, len(positions))]
            mask[row, positions[keep]] = True
        return mask.float()
