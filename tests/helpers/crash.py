"""A run stopped by an error right after a given rollout step, as a node failure would stop it (its checkpoint of
that step written): the resume tests continue from there."""

from __future__ import annotations

import lightning as L


class Crash(RuntimeError):
    pass


class CrashAfter(L.Callback):
    """Raises `Crash` right after rollout step `steps`."""

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if module.run_state.rollout_step >= self.steps:
            raise Crash(f"stopped after step {self.steps}")
