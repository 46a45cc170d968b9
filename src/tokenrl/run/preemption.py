"""Preemption: on SIGTERM (SLURM and cloud preemption, `scancel`, `kill`) or SIGUSR1 / SIGUSR2 (SLURM's warning before
the time limit, `#SBATCH --signal`), the run abandons the current rollout step at its next safe point, writes
`last.ckpt` atomically with the state after the last completed step, and exits with 128 + the signal's number (what
a shell reports for a process killed by it; schedulers read it as "terminated by the signal").

Safe points: before a step, between generation, statistics and update, after a validation, and inside HF `generate`
after every token (a `StoppingCriteria`); an update that has begun runs to its end (its optimizer steps cannot be
half-undone), then the run stops before the next step. With several ranks every rank stops at the same safe point
(`GRPOModule.check_preempted` asks all of them), though the signal may reach only one. A signal's previous handler
(submitit's requeue on a SLURM job) runs after the checkpoint is written, so a requeued job finds it (`ckpt_path=auto`).
"""

from __future__ import annotations

import logging
import signal
import time
from types import FrameType
from typing import Any

import lightning as L

from tokenrl.run.progress import rollout_steps_done

log = logging.getLogger(__name__)
SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)


class Preempted(Exception):
    """Raised at a safe point after a preemption signal; `signum` is the signal."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"received {signal.Signals(signum).name}")


class PreemptionWatch(L.Callback):
    """Installs the handlers for the fit, turns a received signal into `Preempted` at the module's safe points
    (`check`), and writes `last.ckpt` when `Preempted` ends the fit (`on_exception`)."""

    def __init__(self, signals: tuple[int, ...] = SIGNALS) -> None:
        self.signals = signals
        self.signum: int | None = None
        self.received_at = 0.0
        self.saved: str | None = None
        self.previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is None:
            self.signum, self.received_at = signum, time.monotonic()
            log.warning(
                "received %s: stopping at the next safe point and writing last.ckpt", signal.Signals(signum).name
            )

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def check(self, anyone: bool | None = None) -> None:
        """Raise `Preempted` if a signal arrived here, or, with several ranks, `anyone` (whether any rank got one, so
        every rank stops at the same point). Call only where the state equals the last completed step's."""
        if self.requested if anyone is None else anyone:
            raise Preempted(self.signum or signal.SIGTERM)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.previous = {signum: signal.getsignal(signum) for signum in self.signals}  # before Lightning's

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Installed after Lightning's own handlers (registered just before training starts), which would end the
        fit with exit status 0 and no checkpoint at the end of the step."""
        for signum in self.signals:
            signal.signal(signum, self._handle)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.restore()

    def restore(self) -> None:
        """The handlers from before the fit (Lightning restores its own originals at teardown too)."""
        for signum, handler in self.previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self.previous = {}

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if not isinstance(exception, Preempted):
            self.restore()  # a crash: the handlers from before the fit, nothing to save here
            return
        checkpoint = trainer.checkpoint_callback
        if checkpoint is not None and hasattr(checkpoint, "save_last_now"):
            self.saved = str(checkpoint.save_last_now(trainer))
            if self.requested:  # the rank the signal reached (others stopped with it)
                log.warning(
                    "preempted: wrote %s (the state after step %d) %.1f s after the signal",
                    self.saved,
                    rollout_steps_done(pl_module, 0),
                    time.monotonic() - self.received_at,
                )
        elif self.requested:
            log.warning(
                "preempted at step %d; checkpointing is off, nothing was saved", rollout_steps_done(pl_module, 0)
            )
        previous = self.previous.get(exception.signum)
        self.restore()
        if callable(previous):
            previous(exception.signum, None)  # the handler from before the fit (submitit's requeue), now that the
            # checkpoint exists
