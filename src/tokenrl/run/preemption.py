"""Preemption (docs/running.md#resume-and-preemption): on SIGTERM, SIGUSR1 or SIGUSR2 the run stops at its next safe
point, writes `last.ckpt` with the state after the last completed step and exits with 128 + the signal's number (what a
shell reports for a process killed by it); a signal's previous handler (submitit's requeue) runs after the checkpoint
is written, so a requeued job finds it."""

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
        """Raise `Preempted` after a signal here or, with several ranks, on `anyone`: all stop at one safe point."""
        if self.requested if anyone is None else anyone:
            raise Preempted(self.signum or signal.SIGTERM)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.previous = {signum: signal.getsignal(signum) for signum in self.signals}  # before Lightning's

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Installed after Lightning's own handlers, which would end the fit with exit status 0 and no checkpoint."""
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
        step, checkpoint = rollout_steps_done(pl_module, 0), trainer.checkpoint_callback
        if checkpoint is not None and hasattr(checkpoint, "save_last_now"):
            self.saved = str(checkpoint.save_last_now(trainer))
            if self.requested:  # the rank the signal reached (others stopped with it)
                log.warning(
                    "preempted: wrote %s (the state after step %d) %.1f s after the signal",
                    self.saved,
                    step,
                    time.monotonic() - self.received_at,
                )
        elif self.requested:
            log.warning("preempted at step %d; checkpointing is off, nothing was saved", step)
        previous = self.previous.get(exception.signum)
        self.restore()
        if callable(previous):  # the handler from before the fit (submitit's requeue), now that the checkpoint exists
            previous(exception.signum, None)
