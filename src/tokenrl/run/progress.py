"""One progress line per rollout step through Python logging (`ProgressLog`: the console and `train.log`), so it shows
wherever the output goes (a progress bar shows nothing useful redirected: SLURM logs, `nohup`, CI), from the step's
logged metrics over all ranks; on a terminal `RolloutProgressBar` counts the same steps with an ETA."""

from __future__ import annotations

import logging
import math
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import TQDMProgressBar

log = logging.getLogger(__name__)

FIELDS = {"reward": "train/reward", "acc": "train/accuracy", "entropy": "train/entropy", "selected": "select/fraction"}


def rollout_steps_done(module: L.LightningModule, default: int) -> int:
    """The rollout steps a `GRPOModule` has completed (its `run_state`); `default` for another module."""
    state = getattr(module, "run_state", None)
    return default if state is None else state.rollout_step


class ProgressLog(L.Callback):
    """Logs `step k/N | reward … | acc … | entropy … | selected … | T s (phase t, …)` after every rollout step."""

    def __init__(self, total_steps: int) -> None:
        self.total_steps = total_steps

    def line(self, metrics: dict[str, Any], step: int) -> str:
        """The progress line of rollout step `step` (1-based: steps done) from that step's logged metrics."""
        values = {key: float(value) for key, value in metrics.items()}
        parts = [f"step {step}/{self.total_steps}"]
        parts += [f"{name} {values[key]:.3f}" for name, key in FIELDS.items() if key in values]
        phases = ", ".join(
            f"{key.removeprefix('time/')} {seconds:.1f}"
            for key, seconds in values.items()
            if key.startswith("time/") and key not in ("time/step", "time/validate")
        )
        total = values.get("time/step", math.nan)
        if phases or not math.isnan(total):
            parts.append(f"{total:.1f} s ({phases})" if phases else f"{total:.1f} s")
        return " | ".join(parts)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not trainer.is_global_zero:
            return
        metrics = trainer.callback_metrics
        step = int(metrics.get("train/rollout_step", rollout_steps_done(pl_module, batch_idx + 1)))
        log.info(self.line(metrics, step))


class RolloutProgressBar(TQDMProgressBar):
    """Lightning's progress bar counting the rollout steps of `total_steps` from where the run starts (not batches)."""

    def __init__(self, total_steps: int) -> None:
        super().__init__()
        self.total_steps = total_steps

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_start(trainer, pl_module)
        done = int(rollout_steps_done(pl_module, 0))
        self.train_progress_bar.reset(total=self.total_steps)
        self.train_progress_bar.initial = self.train_progress_bar.n = done
        self.train_progress_bar.set_description("rollout steps")

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        return {key: value for key, value in super().get_metrics(trainer, pl_module).items() if key != "v_num"}
