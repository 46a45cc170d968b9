"""The update loop (step/update.py) under Lightning: `LightningUpdate` runs a step's PPO update with its `Backend`
(manual backward with DDP's all-reduce on the last micro-batch only, FSDP-aware clipping, normalisers and selection
thresholds counted over all ranks), the optimizer and the lr schedule."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
from lightning.pytorch.strategies import ParallelStrategy

from tokenrl.models.sharding import is_sharded
from tokenrl.step.distributed import all_reduce_sum, gather_variable, global_loss_normalizer
from tokenrl.step.entropy_control import EntropyControl
from tokenrl.step.train_batch import TrainBatch
from tokenrl.step.update import Backend, UpdatePath, UpdateResult
from tokenrl.utils import StepTimer, derived_seed


@dataclass
class LightningUpdate:
    """One rollout step's PPO update along the run's `path`, under the hooks of the module `lightning` that owns it."""

    lightning: L.LightningModule
    path: UpdatePath
    entropy_control: EntropyControl
    seed: int

    def __call__(self, train: TrainBatch, timer: StepTimer) -> tuple[float, UpdateResult]:
        """The update of step `train` with the step's entropy-bonus α and a row shuffle seeded by (seed, step); the lr
        schedule steps once per rollout step, as verl's. Returns the lr it used and the result."""
        optimizer: Any = self.lightning.optimizers()  # the run's one optimizer (Lightning types a list too)
        scheduler: Any = self.lightning.lr_schedulers()
        lr = optimizer.param_groups[0]["lr"]
        shuffle = torch.Generator().manual_seed(derived_seed(self.seed, "shuffle", train.step))
        result = self.path.update(train, self.backend(optimizer), shuffle, self.entropy_control.alpha, timer)
        if scheduler is not None:
            scheduler.step()
        return lr, result

    def backend(self, optimizer: Any) -> Backend:
        """The update loop's backend under Lightning, with `optimizer`; the gradients are zeroed first."""
        optimizer.zero_grad()
        device, passes = self.lightning.device, self.path.passes
        return Backend(
            forward=passes.update_forward,
            micro_batches=passes.plan.cut(with_grad=True),
            backward=self.backward,
            scale_gradients=self.scale_gradients,
            optimizer_step=lambda: self.optimizer_step(optimizer),
            current_stats=lambda rollouts: passes.statistics(rollouts, with_js=False),
            reduce_normalizer=lambda local: global_loss_normalizer(local, device=device),
            gather=lambda tensor: gather_variable(tensor, device=device),
            rank=self.lightning.global_rank,
            everyone=lambda mine: bool(all_reduce_sum(torch.tensor([float(not mine)]), device)[0] == 0),
        )

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        """DDP averages gradients over ranks; the normaliser is already global, so the average is undone. DDP
        all-reduces on the last micro-batch of an optimizer step only (`no_sync` before it)."""
        trainer = self.lightning.trainer
        strategy = trainer.strategy
        sync = nullcontext() if last or not isinstance(strategy, ParallelStrategy) else strategy.block_backward_sync()
        with sync:
            self.lightning.manual_backward(loss * trainer.world_size)

    @torch.no_grad()
    def scale_gradients(self, factor: float) -> None:
        """Multiply every accumulated gradient of the policy (this rank's shards under FSDP) by `factor`."""
        for parameter in self.path.passes.policy.parameters():
            if parameter.grad is not None:
                parameter.grad.mul_(factor)

    def optimizer_step(self, optimizer: Any) -> None:
        """Clip the global gradient norm to `algorithm.grad_clip` (FSDP: the root's `clip_grad_norm_` over every rank's
        shards — Lightning's FSDP precision plugin refuses 'norm' clipping), step, zero the gradients."""
        max_norm = self.path.cfg.schedule.grad_clip
        if max_norm is not None and is_sharded(self.path.passes.policy):
            self.path.passes.policy.clip_grad_norm_(max_norm)
        elif max_norm is not None:
            self.lightning.clip_gradients(optimizer, gradient_clip_val=max_norm, gradient_clip_algorithm="norm")
        optimizer.step()
        optimizer.zero_grad()
