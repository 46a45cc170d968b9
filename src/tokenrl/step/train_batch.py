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
from tokenrl.step.distributed import all_reduce_sum, gather_variable
from tokenrl.step.passes import PolicyPasses


@dataclass
class TrainBatch:
    """Row-aligned (B = prompts × G rows, group-major) tensors of one rollout step on this rank.

    rollouts: prompts, responses and the engine's sampling log-probs; scores: the verifier's; rewards: scores plus
    the overlong shaping; advantages: group-normalised rewards (docs/algorithms.md §1.2); stats: statistics of π_old,
    the policy that generated (its log-probs are the PPO ratio's denominator); ref_logprobs: the frozen reference's
    log-probs (None without a KL term); row_offset: global index of this rank's first row (seeds row-wise choices);
    forks: the true forks, decisions and failures of each response (`ForkMarks`: rollout/fork_marks.py) where the
    task names them (task=forks), else None.
    """

    step: int
    rollouts: RolloutBatch
    scores: torch.Tensor
    rewards: torch.Tensor
    advantages: torch.Tensor
    stats: TokenStats
    ref_logprobs: torch.Tensor | None
    row_offset: int = 0
    forks: ForkMarks | None = None

    @classmethod
    def assemble(
        cls,
        step: int,
        rollouts: RolloutBatch,
        scores: torch.Tensor,
        rewards: torch.Tensor,
        cfg: AlgorithmConfig,
        passes: PolicyPasses,
        fused: bool,
        row_offset: int = 0,
        forks: ForkMarks | None = None,
    ) -> TrainBatch:
        """The step's batch: group advantages, π_old's statistics (None where the update's forward gives them:
        `fused`) and the reference's log-probs (with a KL term)."""
        advantages = group_advantages(
            rewards, rollouts.group_ids, eps=cfg.shaping.adv_eps, std_normalize=cfg.shaping.adv_std_normalize
        )
        return cls(
            step,
            rollouts,
            scores,
            rewards,
            advantages,
            None if fused else passes.statistics(rollouts),
            passes.reference_logprobs(rollouts) if cfg.uses_reference else None,
            row_offset,
            forks,
        )

    def mean_entropy(self, device: torch.device | str = "cpu") -> float:
        """π_old's mean entropy over the response tokens of every rank's batch (the adaptive α's input); `device`:
        where the collective runs."""
        valid = self.rollouts.response_mask.bool()
        local = torch.tensor([float(self.stats.entropy[valid].sum()), float(valid.sum())])
        entropy, tokens = all_reduce_sum(local, device)
        return float(entropy / tokens.clamp_min(1.0))

    def whole_view(self, device: torch.device | str = "cpu", rank: int = 0) -> SelectionBatch:
        """What a selector sees of every row of the step, gathering across ranks on `device` (the diagnostics' and
        the samples' view)."""
        return self.selection_view(torch.arange(self.size), partial(gather_variable, device=device), rank)

    @property
    def size(self) -> int:
        return self.rollouts.response_ids.shape[0]

    def selection_view(
        self,
        rows: torch.Tensor,
        gather: Callable[[torch.Tensor], list[torch.Tensor]] = single_process,
        rank: int = 0,
        stats: TokenStats | None = None,
    ) -> SelectionBatch:
        """What a selector sees of `rows` (sorted): their statistics (`stats` of those rows instead, when given, e.g.
        the current policy's), advantages, masks, groups, global row ids, the step, a cross-rank gather and the
        task's marks (`forks`) when it names them."""
        rows = rows.sort().values
        return SelectionBatch(
            stats=self.stats.rows(rows) if stats is None else stats,
            advantages=self.advantages[rows],
            response_mask=self.rollouts.response_mask[rows],
            group_ids=self.rollouts.group_ids[rows],
            row_ids=rows + self.row_offset,
            step=self.step,
            gather=gather,
            rank=rank,
            forks=None if self.forks is None else self.forks.rows(rows),
        )
