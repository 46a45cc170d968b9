"""`RunState`: what a run's checkpoint holds beside the weights and the optimizer, so that a resumed run continues
exactly as the uninterrupted one would: the rollout and optimizer step counters, the reward history, the refill
position of dynamic sampling, the entropy bonus's controller and every RNG. A checkpoint taken in the middle of a
step (a preemption) holds the state after the last completed step (`mark_step_boundary`)."""

from __future__ import annotations

from typing import Any

from tokenrl.step.entropy_control import EntropyControl
from tokenrl.utils import restore_rng_state, rng_state


class RunState:
    """Mixin of `GRPOModule`: the counters and Lightning's checkpoint hooks that save and restore them."""

    entropy_control: EntropyControl

    def init_run_state(self) -> None:
        self.rollout_step = self.optimizer_steps = 0
        self.refill_position = 0  # prompts drawn so far from the data module's refill stream (dynamic sampling)
        self.reward_history: list[float] = []  # mean reward of every rollout step
        self.boundary: dict[str, Any] = {}  # refill position and RNG states after the last completed step

    def mark_step_boundary(self) -> None:
        """Record what a checkpoint taken before the next step completes must hold (a preemption mid-step)."""
        self.boundary = {"refill_position": self.refill_position, "rng": rng_state()}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """The state after the last completed step (also when a preemption saves in the middle of the next one)."""
        checkpoint["tokenrl"] = {
            "rollout_step": self.rollout_step,
            "optimizer_steps": self.optimizer_steps,
            "reward_history": self.reward_history,
            "refill_position": self.boundary.get("refill_position", self.refill_position),
            "entropy_control": self.entropy_control.state_dict(),
            "rng": self.boundary.get("rng") or rng_state(),
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint["tokenrl"]
        self.rollout_step, self.optimizer_steps = state["rollout_step"], state["optimizer_steps"]
        self.reward_history = list(state["reward_history"])
        self.refill_position = int(state.get("refill_position", 0))  # absent in checkpoints before dynamic sampling
        if "entropy_control" in state:  # absent in checkpoints before the entropy bonus
            self.entropy_control.load_state_dict(state["entropy_control"])
        restore_rng_state(state["rng"])
