"""Learning-rate schedule: constant after a linear warm-up counted in rollout steps,
    lr(s) = lr · s / W for s < W, lr afterwards   (s = rollout steps done, W = `algorithm.lr_warmup_steps`),
as verl's `get_constant_schedule_with_warmup`, which the DAPO-based recipes of 20-Entropy (W = 10) and STAPO (W = 10)
use; DAPO §4.1 warms up over 20 rollout steps (docs/algorithms.md §1.3, §3.2, §4.5). W = 0 is a constant lr. The
first step (s = 0) updates with lr 0, as verl does."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from lightning.pytorch.utilities.types import OptimizerLRScheduler


def constant_after_linear_warmup(step: int, warmup_steps: int) -> float:
    """The lr multiplier after `step` rollout steps."""
    return step / warmup_steps if step < warmup_steps else 1.0


def with_linear_warmup(optimizer: torch.optim.Optimizer, warmup_steps: int) -> OptimizerLRScheduler:
    """What `configure_optimizers` returns: the optimizer alone (W = 0) or with the warm-up schedule, which the module
    steps once per rollout step."""
    if not warmup_steps:
        return optimizer
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, partial(constant_after_linear_warmup, warmup_steps=warmup_steps)
    )
    return {"optimizer": optimizer, "lr_scheduler": schedule}
