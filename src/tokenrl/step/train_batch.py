"""`TrainBatch`: one rollout step's data on this rank, the single record every later phase reads."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from tokenrl.algorithms.config import AlgorithmConfig
from tokenrl.algorithms.grpo import group_advantages
from tokenrl.records.marks import ForkMarks
from tokenrl.records.rollout_batch import RolloutBatch
from tokenrl.records.selection import SelectionBatch, single_process
from tokenrl.records.token_stats import TokenStats
from tokenrl.rollout.dynamic_sampling import ScoredRollouts
from tokenrl.step.distributed import all_reduce_sum, gather_variable
from tokenrl.step.passes import PolicyPasses


@dataclass
class TrainBatch:
    """Row-aligned (B = prompts × G rows, group-major) tensors of one rollout step on this rank: scores are the
    verifier's, rewards add the overlong shaping, advantages are group-normalised (docs/algorithms.md §1.2),
    ref_logprobs None without a KL term, row_offset the global index of this rank's first row (seeds row-wise
    choices), forks the `ForkMarks` where the task names them. π_old's statistics come with the update (UpdatePath)."""

    step: int
    rollouts: RolloutBatch
    scores: torch.Tensor
    rewards: torch.Tensor
    advantages: torch.Tensor
    ref_logprobs: torch.Tensor | None
    row_offset: int = 0
    forks: ForkMarks | None = None

    @classmethod
    def assemble(
        cls, step: int, scored: ScoredRollouts, cfg: AlgorithmConfig, passes: PolicyPasses, row_offset: int = 0
    ) -> TrainBatch:
        """The step's batch of this rank's `scored` rollouts: group advantages and, with a KL term, the reference's
        log-probs."""
        rollouts, rewards = scored.rollouts, scored.rewards
        advantages = group_advantages(
            rewards, rollouts.group_ids, eps=cfg.shaping.adv_eps, std_normalize=cfg.shaping.adv_std_normalize
        )
        reference = passes.reference_logprobs(rollouts) if cfg.uses_reference else None
        return cls(step, rollouts, scored.scores, rewards, advantages, reference, row_offset, scored.forks)

    def mean_entropy(self, stats: TokenStats, device: torch.device | str = "cpu") -> float:
        """The mean entropy of `stats` (π_old's) over the response tokens of every rank's batch (the adaptive α's
        input); `device`: where the collective runs."""
        valid = self.rollouts.response_mask.bool()
        local = torch.tensor([float(stats.entropy[valid].sum()), float(valid.sum())])
        entropy, tokens = all_reduce_sum(local, device)
        return float(entropy / tokens.clamp_min(1.0))

    def whole_view(self, stats: TokenStats, device: torch.device | str = "cpu", rank: int = 0) -> SelectionBatch:
        """What a selector sees of every row of the step with π_old's `stats`, gathering across ranks on `device` (the
        diagnostics' and the samples' view)."""
        return self.selection_view(torch.arange(self.size), stats, partial(gather_variable, device=device), rank)

    @property
    def size(self) -> int:
        return self.rollouts.response_ids.shape[0]

    def selection_view(
        self,
        rows: torch.Tensor,
        stats: TokenStats,
        gather: Callable[[torch.Tensor], list[torch.Tensor]] = single_process,
        rank: int = 0,
    ) -> SelectionBatch:
        """What a selector sees of `rows` (sorted): `stats` (of those rows: π_old's, or the current policy's),
        advantages, masks, groups, global row ids, the step, a cross-rank gather and the task's marks (`forks`) when
        it names them."""
        rows = rows.sort().values
        return SelectionBatch(
            stats=stats,
            advantages=self.advantages[rows],
            response_mask=self.rollouts.response_mask[rows],
            group_ids=self.rollouts.group_ids[rows],
            row_ids=rows + self.row_offset,
            step=self.step,
            gather=gather,
            rank=rank,
            forks=None if self.forks is None else self.forks.rows(rows),
        )
