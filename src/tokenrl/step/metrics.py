"""The metrics a rollout step logs (train/*, time/*, memory/*), computed from its `TrainBatch` and update."""

from __future__ import annotations

import numpy as np

from tokenrl.algorithms.config import AlgorithmConfig
from tokenrl.algorithms.grpo import kl_estimate
from tokenrl.step.train_batch import TrainBatch
from tokenrl.step.update import UpdateResult
from tokenrl.utils import StepTimer


def step_metrics(
    batch: TrainBatch, update: UpdateResult, cfg: AlgorithmConfig, lr: float, timer: StepTimer
) -> dict[str, float]:
    """Means over this rank's rows or response tokens; `lr` is the learning rate the update used.
    `train/rollout_step` counts the updates applied (1 after the first step)."""
    rollouts, stats = batch.rollouts, update.stats
    resp = rollouts.response_mask.float()
    tokens = resp.sum().clamp_min(1.0)
    gap = (rollouts.sampling_logprobs - stats.logprobs).abs() * resp
    metrics = {
        "train/reward": batch.rewards.mean().item(),  # what the advantages see (after overlong shaping)
        "train/score": batch.scores.mean().item(),  # the verifier's
        "train/accuracy": (batch.scores >= 1.0).float().mean().item(),
        "train/entropy": ((stats.entropy * resp).sum() / tokens).item(),
        "train/renyi2": ((stats.renyi2 * resp).sum() / tokens).item(),
        "train/response_len": resp.sum(1).mean().item(),
        "train/prompt_len": rollouts.prompt_mask.sum(1).float().mean().item(),
        "train/truncated_frac": float(np.mean([reason == "length" for reason in rollouts.finish_reasons])),
        **{f"train/{key}": value for key, value in update.metrics.items()},
        "train/logprob_gap_mean": (gap.sum() / tokens).item(),
        "train/logprob_gap_max": gap.max().item(),
        "train/lr": lr,
        "train/rollout_step": float(batch.step + 1),
        "train/fused_statistics": float(update.fused_statistics),
    }
    if cfg.shaping.overlong_buffer:
        metrics["train/overlong_penalty"] = (batch.rewards - batch.scores).mean().item()
    if batch.ref_logprobs is not None:
        kl = kl_estimate(stats.logprobs, batch.ref_logprobs, cfg.loss.kl_estimator)
        metrics["train/kl"] = ((kl * resp).sum() / tokens).item()
    metrics.update({f"time/{phase}": seconds for phase, seconds in timer.seconds.items()})
    metrics["time/step"] = sum(timer.seconds.values())
    metrics.update({f"memory/{phase}_peak_gib": gib for phase, gib in timer.peak_gib.items()})  # GPU only
    return metrics
