"""run/preemption.py: a signal becomes `Preempted` at the step's safe points, last.ckpt then holds the last completed
step (also when the signal lands in the middle of a step's generation), and a resume from it reproduces the
uninterrupted run; HF generation stops within a token."""

from __future__ import annotations

import os
import signal
from types import SimpleNamespace

import lightning as L
import pytest
import torch

from tests.run.test_training import fingerprint, fit
from tokenrl.run.preemption import Preempted, PreemptionWatch

RUN = [
    "total_steps=4",
    "checkpoint.enabled=true",
    "checkpoint.every_n_steps=10",
    "algorithm.filter_groups=acc",
    "algorithm.gen_prompts_per_step=2",
    "task.verifier=tests.helpers.rewards:odd_answers_unsolvable",
]


class SignalDuringGeneration(L.Callback):
    """Sends SIGTERM to this process from inside step `step`'s generation, after the engine returned."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_start(self, trainer, module) -> None:
        generate = module.engine.generate

        def spy(*args, **kwargs):
            batch = generate(*args, **kwargs)
            if module.run_state.rollout_step == self.step:
                os.kill(os.getpid(), signal.SIGTERM)
            return batch

        module.engine.generate = spy


def test_a_signal_mid_step_saves_the_last_completed_step_and_the_resume_reproduces_the_run(tiny_cfg, tmp_path):
    straight, _ = fit(tiny_cfg(*RUN, f"paths.output_dir={tmp_path / 'straight'}"))
    with pytest.raises(Preempted):
        fit(tiny_cfg(*RUN, f"paths.output_dir={tmp_path / 'stopped'}"), SignalDuringGeneration(step=2))
    last = tmp_path / "stopped" / "checkpoints" / "last.ckpt"
    state = torch.load(last, weights_only=True)["tokenrl"]
    assert state["rollout_step"] == 2 and len(state["reward_history"]) == 2
    resumed, _ = fit(tiny_cfg(*RUN, f"paths.output_dir={tmp_path / 'resumed'}"), ckpt_path=str(last))
    assert resumed.run_state.reward_history == straight.run_state.reward_history
    assert resumed.run_state.refill_position == straight.run_state.refill_position
    assert fingerprint(resumed.policy) == fingerprint(straight.policy)


def test_check_raises_only_after_a_signal_and_the_previous_handler_runs_after_the_save():
    calls = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: calls.append(("outer", signum)))
    try:
        watch = PreemptionWatch(signals=(signal.SIGUSR1,))
        watch.on_fit_start(None, None)
        watch.on_train_start(None, None)
        watch.check()  # nothing yet
        os.kill(os.getpid(), signal.SIGUSR1)
        assert watch.requested and calls == []  # the outer handler waits for the checkpoint
        with pytest.raises(Preempted) as caught:
            watch.check()
        checkpoint = SimpleNamespace(save_last_now=lambda trainer: calls.append("saved") or "/run/last.ckpt")
        watch.on_exception(
            SimpleNamespace(checkpoint_callback=checkpoint),
            SimpleNamespace(run_state=SimpleNamespace(rollout_step=3)),
            caught.value,
        )
        assert calls == ["saved", ("outer", signal.SIGUSR1)] and watch.saved == "/run/last.ckpt"
        assert signal.getsignal(signal.SIGUSR1) is not watch._handle  # restored
    finally:
        signal.signal(signal.SIGUSR1, previous)
