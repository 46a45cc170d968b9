"""The `TokenSelector` interface: statistics + advantages + response mask + step -> token mask M.

Every strategy of docs/algorithms.md is (how M is computed) + (which loss normaliser it wants). A subclass
names itself with `name = "..."`; its YAML (configs/selector/<name>.yaml) points `_target_` at it, and Hydra's
config group is the list of selectors.
Selectors run once per optimizer step on that step's mini-batch (docs/algorithms.md §7.12).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable, ClassVar

import torch

from tokenrl.algorithms.grpo import NORMALIZERS
from tokenrl.algorithms.token_stats import TokenStats

STATS_POLICIES = ("old", "current")


def single_process(tensor: torch.Tensor) -> list[torch.Tensor]:
    return [tensor]


@dataclass
class SelectionBatch:
    """What a selector sees: one mini-batch of b rows (sorted by row id) on this rank.

    row_ids: index of each row in the global rollout batch (seeds row-wise random choices);
    gather: 1-D tensor -> every rank's tensor in rank order (for `global` scopes); rank: this rank's index.
    """

    stats: TokenStats
    advantages: torch.Tensor
    response_mask: torch.Tensor
    group_ids: torch.Tensor
    row_ids: torch.Tensor
    step: int
    gather: Callable[[torch.Tensor], list[torch.Tensor]] = field(default=single_process)
    rank: int = 0


@dataclass
class Selection:
    """mask: (B, T) float {0, 1}, zero outside the response; normalizer: `selected` or `all`, the loss divisor the
    update counts for this selection (docs/algorithms.md §1.4)."""

    mask: torch.Tensor
    normalizer: str


class TokenSelector(ABC):
    """Chooses the tokens that the policy-gradient loss is applied to.

    stats_policy: which policy's statistics a mini-batch is ranked by: `old` (the rollout step's pass under π_old)
    or `current` (π_θ just before that mini-batch's update, detached: recomputed for every mini-batch after the
    first, where the two coincide; docs/algorithms.md §3.1, §7.14).
    """

    name: ClassVar[str]
    requires: ClassVar[frozenset[str]] = frozenset()   # TokenStats fields the selector reads
    js_peers: str = "all"   # the rollouts π̄ averages for JS (token_stats.py); a JS-ranking selector may change it

    def __init__(self, normalizer: str = "selected", stats_policy: str = "old") -> None:
        if normalizer not in NORMALIZERS:
            raise ValueError(f"selector.normalizer={normalizer!r} is not one of {NORMALIZERS}")
        if stats_policy not in STATS_POLICIES:
            raise ValueError(f"selector.stats_policy={stats_policy!r} is not one of {STATS_POLICIES}")
        if stats_policy == "current" and "js" in self.requires:
            raise ValueError("selector.stats_policy=current cannot rank by JS: JS compares whole groups, which a "
                             "mini-batch may split; use stats_policy=old")
        self.normalizer, self.stats_policy = normalizer, stats_policy

    @property
    def row_local(self) -> bool:
        """Whether a row's choice depends on that row and its group alone (not on the rest of the mini-batch): then
        micro-batches of whole groups choose as the mini-batch would (the fused statistics of algorithms/update.py)."""
        return False

    @abstractmethod
    def mask(self, batch: SelectionBatch) -> torch.Tensor:
        """(b, T) {0, 1} mask of selected response tokens."""

    def select(self, batch: SelectionBatch) -> Selection:
        chosen = self.mask(batch).float() * batch.response_mask.float()
        return Selection(chosen, self.normalizer)
