"""`RunState`: what a checkpoint holds beside the weights and the optimizer so that a resumed run continues exactly as
the uninterrupted one would (step counters, reward history, dynamic sampling's refill position, the entropy bonus's
controller, every RNG); taken mid-step (a preemption), the state after the last completed step."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tokenrl.step.entropy_control import EntropyControl
from tokenrl.utils import restore_rng_state, rng_state


@dataclass
class RunState:
    """The counters of a run, owned by `GRPOModule`, and their checkpoint form (`checkpoint["tokenrl"]`)."""

    rollout_step: int = 0
    optimizer_steps: int = 0
    refill_position: int = 0  # prompts drawn so far from the data module's refill stream (dynamic sampling)
    reward_history: list[float] = field(default_factory=list)  # mean reward of every rollout step
    boundary: dict[str, Any] = field(default_factory=dict)  # refill position and RNG states after the last step

    def mark_step_boundary(self) -> None:
        """Record what a checkpoint taken before the next step completes must hold (a preemption mid-step)."""
        self.boundary = {"refill_position": self.refill_position, "rng": rng_state()}

    def state_dict(self, entropy_control: EntropyControl) -> dict[str, Any]:
        """The state after the last completed step (also when a preemption saves in the middle of the next one)."""
        return {
            "rollout_step": self.rollout_step,
            "optimizer_steps": self.optimizer_steps,
            "reward_history": self.reward_history,
            "refill_position": self.boundary.get("refill_position", self.refill_position),
            "entropy_control": entropy_control.state_dict(),
            "rng": self.boundary.get("rng") or rng_state(),
        }

    def load_state_dict(self, state: dict[str, Any], entropy_control: EntropyControl) -> None:
        """Restore the counters, the entropy controller and every RNG from a checkpoint's `tokenrl` entry."""
        self.rollout_step, self.optimizer_steps = state["rollout_step"], state["optimizer_steps"]
        self.reward_history = list(state["reward_history"])
        self.refill_position = int(state.get("refill_position", 0))  # absent in checkpoints before dynamic sampling
        if "entropy_control" in state:  # absent in checkpoints before the entropy bonus
            entropy_control.load_state_dict(state["entropy_control"])
        restore_rng_state(state["rng"])
