"""The update loop (step/update.py) under Lightning: its `Backend` (log-probs through the module's policy passes,
manual backward with DDP's all-reduce on the last micro-batch only, FSDP-aware clipping, loss normalisers and
selection thresholds counted over all ranks) and the module's update with its optimizer and lr schedule."""

from __future__ import annotations

from contextlib import nullcontext
from functools import partial
from typing import Any

import torch
from lightning.pytorch.strategies import ParallelStrategy

from tokenrl.models.sharding import is_sharded
from tokenrl.step.distributed import gather_variable, global_loss_normalizer
from tokenrl.step.train_batch import TrainBatch
from tokenrl.step.update import Backend, UpdateResult, ppo_update
from tokenrl.utils import derived_seed


def lightning_backend(module: Any, optimizer: Any) -> Backend:
    """The backend of `module` (a `GRPOModule` inside `training_step`) and its Lightning `optimizer`; the gradients are
    zeroed first."""
    optimizer.zero_grad()
    return Backend(
        forward=module.passes.update_forward,
        backward=partial(backward, module),
        scale_gradients=partial(scale_gradients, module),
        optimizer_step=partial(optimizer_step, module, optimizer),
        current_stats=partial(module.passes.statistics, with_js=False),
        reduce_normalizer=partial(global_loss_normalizer, device=module.device),
        gather=partial(gather_variable, device=module.device),
        rank=module.global_rank,
    )


def lightning_update(module: Any, train: TrainBatch) -> tuple[float, UpdateResult]:
    """The PPO update of `module`'s step `train` with this backend, the step's entropy-bonus α and a row shuffle seeded
    by (seed, step); the lr schedule steps once per rollout step, as verl's. Returns the lr it used and the result."""
    optimizer, scheduler = module.optimizers(), module.lr_schedulers()
    lr = optimizer.param_groups[0]["lr"]
    shuffle = torch.Generator().manual_seed(derived_seed(module.seed, "shuffle", module.rollout_step))
    result = ppo_update(
        train,
        module.selector,
        module.cfg,
        lightning_backend(module, optimizer),
        shuffle,
        by_length=module.fast_path.pack,
        entropy_coef=module.entropy_control.alpha,
        with_js=module.with_js,
    )
    module.optimizer_steps += result.optimizer_steps
    if scheduler is not None:
        scheduler.step()
    return lr, result


def backward(module: Any, loss: torch.Tensor, last: bool) -> None:
    """DDP averages gradients over ranks; the normaliser is already global, so the average is undone. DDP all-reduces
    on the last micro-batch of an optimizer step only (`no_sync` before it)."""
    strategy = module.trainer.strategy
    sync = nullcontext() if last or not isinstance(strategy, ParallelStrategy) else strategy.block_backward_sync()
    with sync:
        module.manual_backward(loss * module.trainer.world_size)


@torch.no_grad()
def scale_gradients(module: Any, factor: float) -> None:
    """Multiply every accumulated gradient of the policy (this rank's shards under FSDP) by `factor`."""
    for parameter in module.policy.parameters():
        if parameter.grad is not None:
            parameter.grad.mul_(factor)


def optimizer_step(module: Any, optimizer: Any) -> None:
    """Clip the global gradient norm to `algorithm.grad_clip` (FSDP: the root's `clip_grad_norm_` over every rank's
    shards — Lightning's FSDP precision plugin refuses 'norm' clipping), step, zero the gradients."""
    max_norm = module.cfg.schedule.grad_clip
    if max_norm is not None and is_sharded(module.policy):
        module.policy.clip_grad_norm_(max_norm)
    elif max_norm is not None:
        module.clip_gradients(optimizer, gradient_clip_val=max_norm, gradient_clip_algorithm="norm")
    optimizer.step()
    optimizer.zero_grad()
