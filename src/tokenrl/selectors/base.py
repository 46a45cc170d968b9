"""The `TokenSelector` interface: statistics + advantages + response mask + step → per-token weights (a 0/1 mask is
the special case) and optionally per-token clip ranges, KL weights, advantages and a drift penalty (docs/algorithms.md
§11.1). A mask selector implements `mask`, one that shapes more overrides `select`; its YAML
(configs/selector/<name>.yaml) points `_target_` at it. A selector on π_old's statistics (`stats_policy=old`) runs once
per rollout step over the whole batch, one on the current policy's once per optimizer step on its mini-batch (§7.12)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch

from tokenrl.algorithms.grpo import NORMALIZERS
from tokenrl.records.rules import Configurable, Rule, one_of
from tokenrl.records.selection import Selection, SelectionBatch

STATS_POLICIES = ("old", "current")


class TokenSelector(Configurable, ABC):
    """Chooses the tokens that the policy-gradient loss is applied to.

    stats_policy: which policy's statistics a mini-batch is ranked by: `old` (the rollout step's pass under π_old)
    or `current` (π_θ just before that mini-batch's update, detached: recomputed for every mini-batch after the
    first, where the two coincide; docs/algorithms.md §3.1, §7.14).
    """

    name: ClassVar[str]
    config_node = "selector"
    config_rules: ClassVar[dict[str, Rule]] = {
        "normalizer": one_of(*NORMALIZERS),
        "stats_policy": one_of(*STATS_POLICIES),
    }
    requires: ClassVar[frozenset[str]] = frozenset()  # TokenStats fields the selector reads
    weighs_kl: ClassVar[bool] = False  # whether its selections set per-token KL weights (they weigh the KL's divisor)
    js_peers: str = "all"  # the rollouts π̄ averages for JS (token_stats.py); a JS-ranking selector may change it

    def __init__(self, normalizer: str = "selected", stats_policy: str = "old") -> None:
        if stats_policy == "current" and self.reads_groups:
            name = getattr(self, "name", type(self).__name__)
            raise ValueError(
                f"selector.stats_policy=current cannot be used with {name}: it compares each row with its "
                "whole group, which a mini-batch may split; use stats_policy=old (selected once per rollout "
                "step over whole groups)"
            )
        self.normalizer, self.stats_policy = normalizer, stats_policy

    @property
    def row_local(self) -> bool:
        """Whether a row's choice depends on that row and its group alone (not on the rest of the mini-batch): then
        micro-batches of whole groups choose as the mini-batch would (the fused statistics of step/update.py).
        Default: a selector with a `scope` (selectors/ranking.py) is row-local at `scope=sequence`; one without a
        scope is not, unless it declares `row_local = True` (a wrong True would change its choice on that path)."""
        return getattr(self, "scope", None) == "sequence"

    @property
    def reads_groups(self) -> bool:
        """Whether a row's choice compares it with the rest of its group (JS; GTPO's entropy shares), so micro-batches
        that select on their own must hold whole groups."""
        return "js" in self.requires

    @abstractmethod
    def mask(self, batch: SelectionBatch) -> torch.Tensor:
        """(b, T) {0, 1} mask of the response tokens the update reaches."""

    def select(self, batch: SelectionBatch) -> Selection:
        """The mask as 0/1 weights with the selector's normaliser; selectors that shape more override this."""
        chosen = self.mask(batch).float() * batch.response_mask.float()
        return Selection(chosen, self.normalizer)
