"""Validation during training: held-out pass@k before rollout steps 0, N, 2N, … and after the last one."""

from __future__ import annotations

import logging
import time
from typing import Any

import lightning as L
import torch

from tokenrl.evaluation.runner import Validator

log = logging.getLogger(__name__)


class PeriodicValidation(L.Callback):
    """Runs `validator` on the module's engine every `every_n_steps` rollout steps (before the step) and after step
    `total_steps`. The metrics (mean over ranks) are written to the loggers as one row of their own and kept in
    `module.last_validation` for the run summary. Not `self.log`: Lightning repeats a value logged from a hook on
    every later step row of the epoch, so one validation would read as many."""

    def __init__(self, validator: Validator, every_n_steps: int, total_steps: int) -> None:
        self.validator, self.every, self.total_steps = validator, every_n_steps, total_steps

    def on_train_batch_start(self, trainer: L.Trainer, module: Any, batch: Any, batch_idx: int) -> None:
        if module.run_state.rollout_step % self.every == 0:
            self.validate(trainer, module)

    def on_train_batch_end(self, trainer: L.Trainer, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if module.run_state.rollout_step == self.total_steps:
            self.validate(trainer, module)  # after the last update

    @staticmethod
    def line(metrics: dict[str, float]) -> str:
        """`validation at step 10 | pass@1 0.945 | pass@4 0.969 | 12.3 s` (every set's pass@k, held out)."""
        scores = " | ".join(
            f"{key.removeprefix('val/')} {value:.3f}" for key, value in metrics.items() if "pass@" in key
        )
        return f"validation at step {int(metrics['val/at_step'])} | {scores} | {metrics['time/validate']:.1f} s"

    def validate(self, trainer: L.Trainer, module: Any) -> None:
        start = time.perf_counter()
        with module.engine.context():
            results = self.validator(module.engine, module.collector.scorer)
        metrics = {f"val/{key}": value for key, value in results.items()}
        module.check_preempted()  # a signal cut its generation short: its numbers are not a validation
        if trainer.world_size > 1:
            metrics = {
                key: float(module.all_gather(torch.tensor(value, device=module.device)).mean())
                for key, value in metrics.items()
            }
        metrics["val/at_step"] = float(module.run_state.rollout_step)
        metrics["time/validate"] = time.perf_counter() - start
        module.last_validation = metrics
        if trainer.is_global_zero:
            log.info(self.line(metrics))
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
