"""DAPO dynamic sampling (arXiv 2503.14476 §3.2, Eq. 11; verl's `filter_groups`; docs/algorithms.md §1.3): generate
rounds of prompts and keep the groups whose filter metric varies (the others have zero advantage) until `quota` groups
are kept. After `max_rounds` rounds a short batch is topped up with the earliest filtered groups and the caller warns
(verl raises instead; a long run should not die on one hard step). Every rank runs the same rounds (`everyone_done`)
and draws every round's prompts, even with its quota full, so the prompt stream's position stays shared by all ranks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from tokenrl.algorithms.dapo import varied_groups
from tokenrl.records.marks import ForkMarks
from tokenrl.records.prompt_batch import PromptBatch
from tokenrl.records.rollout_batch import RolloutBatch, concat_rollouts


@dataclass
class ScoredRollouts:
    """Rollouts with the verifier's score and the shaped reward (score + overlong penalty) of every row, and the true
    forks, decisions and failures of each response (`ForkMarks`, rollout/fork_marks.py; None where the task cannot
    name them)."""

    rollouts: RolloutBatch
    scores: torch.Tensor
    rewards: torch.Tensor
    forks: ForkMarks | None = None

    def rows(self, index: torch.Tensor) -> ScoredRollouts:
        return ScoredRollouts(
            self.rollouts.rows(index),
            self.scores[index],
            self.rewards[index],
            None if self.forks is None else self.forks.rows(index),
        )

    def groups(self) -> int:
        return int(self.rollouts.group_ids.unique().numel())

    def first_groups(self, count: int) -> ScoredRollouts:
        """The rows of the first `count` groups in order of appearance."""
        order = torch.tensor(list(dict.fromkeys(self.rollouts.group_ids.tolist()))[:count], dtype=torch.long)
        return self.rows(torch.isin(self.rollouts.group_ids, order).nonzero().squeeze(1))


def concat_scored(parts: list[ScoredRollouts], pad_id: int) -> ScoredRollouts:
    rollouts = concat_rollouts([p.rollouts for p in parts], pad_id)
    marks = [p.forks for p in parts if p.forks is not None]
    forks = ForkMarks.cat(marks, rollouts.response_ids.shape[1]) if len(marks) == len(parts) else None
    return ScoredRollouts(rollouts, torch.cat([p.scores for p in parts]), torch.cat([p.rewards for p in parts]), forks)


@dataclass(frozen=True)
class VariedGroups:
    """One rank's dynamic sampling: `quota` groups whose `metric` ('acc' | 'reward') varies, in at most `max_rounds`
    rounds; `pad_id` re-pads the kept rows."""

    quota: int
    metric: str
    max_rounds: int
    pad_id: int

    def collect(
        self,
        first: PromptBatch,
        generate: Callable[[PromptBatch, int], ScoredRollouts],
        refill: Callable[[], PromptBatch],
        everyone_done: Callable[[bool], bool],
    ) -> tuple[ScoredRollouts, dict[str, float]]:
        """`quota` groups for this rank's update and the round's metrics: `gen_rounds` (rounds this rank generated),
        `kept_group_frac` (varied groups / generated groups), `filled_groups` (filtered groups used to top up).

        generate(prompts, round) scores one round; refill() draws the next round's prompts (called on every rank);
        everyone_done(mine) is True when every rank reports True."""
        kept: list[ScoredRollouts] = []
        spare: list[ScoredRollouts] = []
        n_kept = n_spare = generated = rounds = 0
        prompts = first
        for round_index in range(self.max_rounds):
            if round_index:
                prompts = refill()
            if n_kept < self.quota:
                scored = generate(prompts, round_index)
                values = (scored.scores >= 1.0).float() if self.metric == "acc" else scored.rewards  # acc: correct
                varied = varied_groups(values, scored.rollouts.group_ids)
                good, bad = scored.rows(varied.nonzero().squeeze(1)), scored.rows((~varied).nonzero().squeeze(1))
                kept.append(good)
                spare.append(bad.first_groups(self.quota - n_spare))
                n_kept, n_spare = n_kept + good.groups(), n_spare + spare[-1].groups()
                generated += scored.groups()
                rounds += 1
            if everyone_done(n_kept >= self.quota):
                break
        parts = [part for part in kept + spare if part.rollouts.group_ids.numel()]
        batch = concat_scored(parts, self.pad_id).first_groups(self.quota)
        return batch, {
            "gen_rounds": float(rounds),
            "kept_group_frac": n_kept / max(generated, 1),
            "filled_groups": float(max(0, self.quota - n_kept)),
        }
