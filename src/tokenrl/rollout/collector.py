"""One step's scored rollouts: G samples per prompt from the engine, the verifier's scores (time-limited worker) and
DAPO's overlong shaping (docs/algorithms.md §1.3); with `algorithm.filter_groups`, dynamic sampling's rounds."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from tokenrl.algorithms.config import AlgorithmConfig
from tokenrl.algorithms.dapo import overlong_penalty
from tokenrl.records.prompt_batch import PromptBatch, rank_shard
from tokenrl.rewards.scorer import SafeScorer
from tokenrl.rollout.dynamic_sampling import ScoredRollouts, VariedGroups
from tokenrl.rollout.engine import RolloutEngine, SamplingParams
from tokenrl.rollout.fork_marks import ForkMarker
from tokenrl.utils import StepTimer, derived_seed

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Generation:
    """Who generates: the rollout step, the weights version the engine must serve, this rank and the rank count."""

    step: int
    weights_version: int
    rank: int
    world: int


@dataclass
class RolloutCollector:
    sampling: SamplingParams
    cfg: AlgorithmConfig
    scorer: SafeScorer
    seed: int
    pad_id: int
    refill: Callable[[], PromptBatch]  # dynamic sampling's next round of prompts (called on every rank)
    everyone_done: Callable[[bool], bool]  # True when every rank reports True
    fork_marker: ForkMarker | None = None  # the true forks of each response (tasks that name them: task=forks)

    def check_sizes(self, rank: int, world: int) -> None:
        """Dynamic sampling's sizes must be able to fill a step, shared evenly by the ranks (fails at start-up)."""
        rank_shard(self.cfg.batch.prompts_per_step, rank, world, "algorithm.prompts_per_step")
        if self.cfg.batch.gen_prompts_per_step * self.cfg.batch.max_gen_rounds < self.cfg.batch.prompts_per_step:
            raise ValueError(
                f"algorithm.gen_prompts_per_step={self.cfg.batch.gen_prompts_per_step} × max_gen_rounds="
                f"{self.cfg.batch.max_gen_rounds} cannot supply prompts_per_step={self.cfg.batch.prompts_per_step} "
                "groups; raise one of them"
            )

    def collect(
        self, engine: RolloutEngine, batch: PromptBatch, who: Generation, timer: StepTimer
    ) -> tuple[ScoredRollouts, dict[str, float]]:
        """This rank's scored rollouts of the step and dynamic sampling's metrics (empty when it is off)."""
        if batch.step != who.step:
            raise RuntimeError(f"prompt batch for step {batch.step} arrived at step {who.step}")

        def generate(prompts: PromptBatch, round_index: int) -> ScoredRollouts:
            return self.generate(engine, prompts, who, round_index, timer)

        metric = self.cfg.shaping.filter_groups
        if metric is None:
            return generate(batch, 0), {}
        rounds = VariedGroups(
            self.cfg.batch.prompts_per_step // who.world, metric, self.cfg.batch.max_gen_rounds, self.pad_id
        )
        scored, metrics = rounds.collect(batch, generate, self.refill, self.everyone_done)
        if metrics["filled_groups"]:
            log.warning(
                "dynamic sampling: %d of this rank's %d groups at step %d have the same %s for every response "
                "after algorithm.max_gen_rounds=%d rounds; they give no gradient. Raise max_gen_rounds or "
                "gen_prompts_per_step, or use data the policy solves sometimes",
                metrics["filled_groups"],
                rounds.quota,
                who.step,
                metric,
                rounds.max_rounds,
            )
        return scored, metrics

    def generate(
        self, engine: RolloutEngine, batch: PromptBatch, who: Generation, round_index: int, timer: StepTimer
    ) -> ScoredRollouts:
        """One round: G rollouts per prompt, seeded by (seed, step, rank, round), scored, with the overlong penalty
        added to the reward."""
        seed = derived_seed(self.seed, "rollout", who.step, who.rank, *((round_index,) if round_index else ()))
        with timer("generate"), engine.context():
            rollouts = engine.generate(batch.prompt_ids, self.sampling, seed=seed)
        if rollouts.weights_version != who.weights_version:
            raise RuntimeError(
                f"rollouts came from weights version {rollouts.weights_version}, "
                f"the policy is at {who.weights_version}: the engine missed a weight sync"
            )
        with timer("reward"):
            problems = [problem for problem in batch.problems for _ in range(self.sampling.n)]
            scores = torch.tensor(
                self.scorer.score([(p.verifier, text, p.answer) for p, text in zip(problems, rollouts.texts)])
            )
            penalty = overlong_penalty(
                rollouts.response_mask.sum(1),
                self.sampling.max_new_tokens,
                self.cfg.shaping.overlong_buffer,
                self.cfg.shaping.overlong_penalty_factor,
            )
            forks = (
                None
                if self.fork_marker is None
                else self.fork_marker(problems, rollouts.response_ids, rollouts.response_mask, rollouts.texts)
            )
        return ScoredRollouts(rollouts, scores, scores + penalty, forks)
