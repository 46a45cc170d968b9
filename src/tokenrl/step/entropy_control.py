"""The entropy bonus's coefficient α, fixed or steered toward a target entropy (docs/algorithms.md §11.5) by the
adaptive rule of Skywork-OR1 (arXiv 2505.22312; its `EntController`): after rollout step k, with e_k the mean entropy
of π_old over the step's response tokens,
    c_{k+1} = clip(c_k + Δ·(+1 if e_k < target else −1), 0, c_max),   on_{k+1} = [e_k < target],
and step k+1 applies α = c_{k+1}·on_{k+1} (on_0 = 1, c_0 = `algorithm.entropy_coef`). Skywork-OR1 measures e_k as the
sampled-token estimate −mean log π_old(o_t); tokenrl uses the full-vocabulary entropy its statistics already hold
(the same quantity in expectation, without the sampling noise)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenrl.algorithms.config import AlgorithmConfig


@dataclass
class EntropyControl:
    """`coef`: c_k; `on`: whether the bonus applies at the coming step; `target` None: α = `coef` at every step."""

    coef: float
    target: float | None = None
    delta: float = 0.0
    max_coef: float = 0.0
    on: bool = True

    @classmethod
    def of(cls, cfg: AlgorithmConfig) -> EntropyControl:
        """The controller of `algorithm.entropy_coef`, `entropy_target`, `entropy_coef_delta` and `entropy_coef_max`."""
        schedule = cfg.schedule
        return cls(
            cfg.loss.entropy_coef, schedule.entropy_target, schedule.entropy_coef_delta, schedule.entropy_coef_max
        )

    @property
    def alpha(self) -> float:
        """α of the coming rollout step."""
        return self.coef if self.target is None or self.on else 0.0

    def observe(self, entropy: float) -> None:
        """Move the coefficient after a rollout step whose π_old had mean entropy `entropy` (nats)."""
        if self.target is None:
            return
        below = entropy < self.target
        self.coef = min(max(self.coef + (self.delta if below else -self.delta), 0.0), self.max_coef)
        self.on = below

    def state_dict(self) -> dict[str, Any]:
        return {"coef": self.coef, "on": self.on}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.coef, self.on = float(state["coef"]), bool(state["on"])
