"""The PPO update of one rollout step: `ppo_epochs` × `mini_batches` optimizer steps over a `TrainBatch`.

Per mini-batch (docs/algorithms.md §1.2–1.4): the selector picks tokens on its view of the rows and names its loss
normaliser, which is counted over the whole mini-batch (on every rank, by `Backend.count_normalizer`), then each micro-batch's share of
the loss is back-propagated (`Backend.backward` is told which one is the last, so DDP all-reduces once), and one
optimizer step follows. A function of (batch, selector, config, backend): Lightning supplies the backend in
`GRPOModule`, a plain loop can supply another (tests/test_update.py runs it with no Trainer).

Fused statistics (docs/algorithms.md §12): a `TrainBatch` without statistics (`stats=None`, see `fused_blocker` for
when that is exact) takes π_old's statistics from the update's own forward — with one epoch and one mini-batch the
update's weights are π_old's. Each micro-batch selects on its own statistics, back-propagates its loss as a plain sum
and, once every micro-batch has selected, the gradients are divided by the mini-batch's normaliser (the loss is linear
in 1/N, so this equals dividing first).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from tokenrl.algorithms.config import AlgorithmConfig
from tokenrl.algorithms.grpo import LossNormalizer, LossOutput, policy_loss, truncated_is_weights
from tokenrl.algorithms.micro_batches import micro_batches
from tokenrl.algorithms.token_stats import TokenStats
from tokenrl.algorithms.train_batch import TrainBatch
from tokenrl.rollout.base import RolloutBatch
from tokenrl.selectors.base import TokenSelector, single_process

UNIT = LossNormalizer(1.0, 1.0)


@dataclass
class UpdateForward:
    """The update's forward of a micro-batch: log π_θ(o_t) with gradient, (b, T), and, when asked, the detached
    statistics of the same logits."""

    logprobs: torch.Tensor
    stats: TokenStats | None = None


@dataclass
class Backend:
    """What the loop needs from the process that owns the policy and the optimizer.

    forward: (sub-batch, with statistics?) → `UpdateForward`; backward: (loss share, last micro-batch of the
    optimizer step?); scale_gradients: multiply the accumulated gradients by a factor; optimizer_step: clip, step and
    zero the gradients; current_stats: detached statistics of π_θ for a sub-batch (selectors with
    `stats_policy=current`); count_normalizer: (response mask, token mask, the selection's normaliser) → the
    mini-batch's divisors over every rank; gather / rank: the selectors' cross-rank view.
    """

    forward: Callable[[RolloutBatch, bool], UpdateForward]
    backward: Callable[[torch.Tensor, bool], None]
    scale_gradients: Callable[[float], None]
    optimizer_step: Callable[[], None]
    current_stats: Callable[[RolloutBatch], TokenStats]
    count_normalizer: Callable[[torch.Tensor, torch.Tensor, str], LossNormalizer]
    gather: Callable[[torch.Tensor], list[torch.Tensor]] = field(default=single_process)
    rank: int = 0


@dataclass
class UpdateResult:
    """Metrics of the update (mean loss per optimizer step, clip fractions over selected tokens, TIS weights), the
    first epoch's token mask over the whole batch (diagnostics, samples), the optimizer steps taken and, after fused
    statistics, the statistics of the whole batch."""

    metrics: dict[str, float]
    first_epoch_mask: torch.Tensor
    optimizer_steps: int
    stats: TokenStats | None = None


def fused_blocker(cfg: AlgorithmConfig, selector: TokenSelector, with_js: bool, rows: int) -> str | None:
    """Why the statistics cannot come from the update's forward for a batch of `rows` rows on this rank (None: they
    can, exactly). The first optimizer step must be the only one (π_θ = π_old), and the selection of each micro-batch
    must be the mini-batch's: one micro-batch, or a selector that chooses row by row (`row_local`) on micro-batches of
    whole groups when it reads JS; the gradient can be divided afterwards only by one normaliser."""
    if cfg.ppo_epochs * cfg.mini_batches > 1:
        return (f"algorithm.ppo_epochs × mini_batches = {cfg.ppo_epochs * cfg.mini_batches} optimizer steps: every "
                "step after the first needs π_old's statistics")
    if rows > cfg.micro_batch_size:
        if not selector.row_local:
            return (f"selector {selector.name} ranks over the mini-batch ({rows} rows), which spans several "
                    f"micro-batches of algorithm.micro_batch_size={cfg.micro_batch_size}")
        if with_js and cfg.micro_batch_size < cfg.group_size:
            return (f"JS compares a group's {cfg.group_size} rows, more than algorithm.micro_batch_size="
                    f"{cfg.micro_batch_size}")
    divisors_differ = (cfg.uses_reference and cfg.aggregation == "token-mean"
                       and cfg.kl_masked != (selector.normalizer == "selected"))
    if divisors_differ:
        return ("the policy-gradient and KL terms are divided by different token counts (selector.normalizer="
                f"{selector.normalizer}, algorithm.kl_masked={cfg.kl_masked})")
    return None


def ppo_update(batch: TrainBatch, selector: TokenSelector, cfg: AlgorithmConfig, backend: Backend,
               shuffle: torch.Generator, by_length: bool = False) -> UpdateResult:
    """`cfg.ppo_epochs` passes over `batch` in `cfg.mini_batches` shuffled mini-batches (`shuffle` orders them); one
    pass with statistics from the update's forward when `batch.stats` is None. `by_length`: micro-batches of groups
    ordered by length (algorithms/micro_batches.py)."""
    if batch.stats is None:
        return fused_update(batch, selector, cfg, backend, by_length)
    rollouts = batch.rollouts
    is_weights = (None if cfg.tis_cap is None
                  else truncated_is_weights(batch.stats.logprobs, rollouts.sampling_logprobs, cfg.tis_cap))
    first_epoch_mask = torch.zeros(rollouts.response_ids.shape)
    terms: list[torch.Tensor] = []   # (loss, clipped, dual-clipped, selected) per micro-batch, read once at the end
    steps = 0
    for epoch in range(cfg.ppo_epochs):
        for minibatch in torch.randperm(batch.size, generator=shuffle).tensor_split(cfg.mini_batches):
            minibatch = minibatch.sort().values
            current = (backend.current_stats(rollouts.rows(minibatch))   # π_θ has moved since the first step
                       if selector.stats_policy == "current" and steps > 0 else None)
            selection = selector.select(batch.selection_view(minibatch, backend.gather, backend.rank, current))
            mask = selection.mask
            if epoch == 0:
                first_epoch_mask[minibatch] = mask
            normalizer = backend.count_normalizer(rollouts.response_mask[minibatch], mask, selection.normalizer)
            parts = batch_parts(batch, minibatch, cfg, False, by_length)
            for index, local in enumerate(parts):
                rows = minibatch[local]
                logp = backend.forward(rollouts.rows(rows), False).logprobs
                out = micro_batch_loss(batch, rows, logp, batch.stats.logprobs[rows], mask[local], normalizer,
                                       selection.normalizer, cfg, is_weights)
                backend.backward(out.loss, index == len(parts) - 1)
                terms.append(loss_terms(out))
            backend.optimizer_step()
            steps += 1
    return UpdateResult(update_metrics(terms, steps, cfg, batch, is_weights), first_epoch_mask, steps)


def fused_update(batch: TrainBatch, selector: TokenSelector, cfg: AlgorithmConfig, backend: Backend,
                 by_length: bool) -> UpdateResult:
    """One optimizer step whose micro-batches take π_old's statistics from their own forward (module docstring)."""
    rollouts = batch.rollouts
    shape = rollouts.response_ids.shape
    mask = torch.zeros(shape)
    is_weights = None if cfg.tis_cap is None else torch.ones(shape)
    parts = [rows.sort().values
             for rows in batch_parts(batch, torch.arange(batch.size), cfg, "js" in selector.requires, by_length)]
    terms: list[torch.Tensor] = []
    part_stats: list[TokenStats] = []
    normalizer_name = selector.normalizer
    for index, rows in enumerate(parts):
        part = rollouts.rows(rows)
        forward = backend.forward(part, True)
        part_stats.append(forward.stats)
        selection = selector.select(batch.selection_view(rows, backend.gather, backend.rank, forward.stats))
        mask[rows], normalizer_name = selection.mask, selection.normalizer
        if is_weights is not None:
            is_weights[rows] = truncated_is_weights(forward.stats.logprobs, part.sampling_logprobs, cfg.tis_cap)
        out = micro_batch_loss(batch, rows, forward.logprobs, forward.stats.logprobs, selection.mask, UNIT,
                               selection.normalizer, cfg, is_weights)
        backend.backward(out.loss, index == len(parts) - 1)
        terms.append(loss_terms(out))
    divisor = max(backend.count_normalizer(rollouts.response_mask, mask, normalizer_name).pg, 1.0)
    backend.scale_gradients(1.0 / divisor)
    backend.optimizer_step()
    if terms:
        terms = [torch.cat([term[:1] / divisor, term[1:]]) for term in terms]
    stats = TokenStats.scatter(shape, parts, part_stats)
    return UpdateResult(update_metrics(terms, 1, cfg, batch, is_weights), mask, 1, stats)


def batch_parts(batch: TrainBatch, rows: torch.Tensor, cfg: AlgorithmConfig, whole_groups: bool,
                by_length: bool) -> list[torch.Tensor]:
    """Positions into `rows` of each micro-batch (algorithms/micro_batches.py)."""
    rollouts = batch.rollouts
    return micro_batches(rows, rollouts.group_ids, rollouts.response_mask.sum(1), cfg.micro_batch_size, whole_groups,
                         by_length)


def micro_batch_loss(batch: TrainBatch, rows: torch.Tensor, logp: torch.Tensor, old_logp: torch.Tensor,
                     mask: torch.Tensor, normalizer: LossNormalizer, norm: str, cfg: AlgorithmConfig,
                     is_weights: torch.Tensor | None) -> LossOutput:
    """`policy_loss` of the micro-batch `rows` with the configured clip, KL and aggregation."""
    device = logp.device
    return policy_loss(
        logp, old_logp.to(device), batch.advantages[rows].to(device), batch.rollouts.response_mask[rows].to(device),
        mask.to(device), normalizer, aggregation=cfg.aggregation, norm=norm, clip_low=cfg.clip_low,
        clip_high=cfg.clip_high, kl_coef=cfg.kl_coef, kl_masked=cfg.kl_masked, dual_clip=cfg.dual_clip,
        kl_estimator=cfg.kl_estimator,
        ref_logp=None if batch.ref_logprobs is None else batch.ref_logprobs[rows].to(device),
        is_weights=None if is_weights is None else is_weights[rows].to(device))


def loss_terms(out: LossOutput) -> torch.Tensor:
    """(loss, clipped, dual-clipped, selected) of a micro-batch, kept on the device and read once at the end."""
    return torch.stack([term.detach().double() for term in (
        out.loss, out.clipped_tokens, out.dual_clipped_tokens, out.selected_tokens)])


def update_metrics(terms: list[torch.Tensor], steps: int, cfg: AlgorithmConfig, batch: TrainBatch,
                   is_weights: torch.Tensor | None) -> dict[str, float]:
    """Mean loss per optimizer step, clip fractions over the weighted tokens and the TIS weights' summary."""
    loss, clipped, dual_clipped, selected = torch.stack(terms).sum(0).tolist() if terms else (0.0, 0.0, 0.0, 0.0)
    metrics = {"loss": loss / max(steps, 1), "clip_frac": clipped / max(selected, 1.0)}
    if cfg.dual_clip is not None:
        metrics["dual_clip_frac"] = dual_clipped / max(selected, 1.0)
    if is_weights is not None:
        valid = batch.rollouts.response_mask.bool()
        metrics["tis_weight_mean"] = float(is_weights[valid].mean()) if valid.any() else 1.0
        metrics["tis_capped_frac"] = float((is_weights[valid] >= cfg.tis_cap).float().mean()) if valid.any() else 0.0
    return metrics
