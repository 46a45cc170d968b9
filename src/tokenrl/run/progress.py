"""One progress line per rollout step, through Python logging, so it shows wherever the run's output goes.

A progress bar redraws one terminal line: redirected (SLURM logs, `nohup`, CI, `python train.py > out.txt`) it
shows nothing useful until the end. `ProgressLog` logs one INFO record per rollout step on the logger
`tokenrl.run.progress`; under `python train.py` Hydra's job logging sends it to the console and to the run's
`<task_name>.log` (`train.log`) as it happens:

    step 3/20 | reward 0.562 | acc 0.500 | entropy 2.314 | selected 1.000 | 41.2 s (generate 30.1, reward 0.4, ...)

`k/N`: rollout steps done / `total_steps`. The numbers are the step's logged metrics (`train/reward`,
`train/accuracy`, `train/entropy`, `select/fraction`, `time/<phase>`, read from `trainer.callback_metrics`: over all
ranks under DDP); only rank 0 writes. On a terminal, `RolloutProgressBar` counts the same rollout steps with an ETA.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import TQDMProgressBar

log = logging.getLogger(__name__)

FIELDS = (
    ("reward", "train/reward"),
    ("acc", "train/accuracy"),
    ("entropy", "train/entropy"),
    ("selected", "select/fraction"),
)


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
        parts += [f"{name} {values[key]:.3f}" for name, key in FIELDS if key in values]
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
        step = (
            int(metrics["train/rollout_step"])
            if "train/rollout_step" in metrics
            else rollout_steps_done(pl_module, batch_idx + 1)
        )
        log.info(self.line(metrics, step))


class RolloutProgressBar(TQDMProgressBar):
    """Lightning's progress bar counting rollout steps of `total_steps` (tqdm's rate and ETA follow), from the step a
    resumed run starts at, instead of an epoch's batches (the run is one pass over `total_steps` prompt batches)."""

    def __init__(self, total_steps: int) -> None:
        super().__init__()
        self.total_steps = total_steps

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_start(trainer, pl_module)
        done = int(rollout_steps_done(pl_module, 0))
        self.train_progress_bar.reset(total=self.total_steps)
        self.train_progress_bar.initial = done
        self.train_progress_bar.n = done
        self.train_progress_bar.set_description("rollout steps")

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        return {key: value for key, value in super().get_metrics(trainer, pl_module).items() if key != "v_num"}
