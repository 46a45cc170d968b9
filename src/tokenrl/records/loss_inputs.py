"""What the loss of one micro-batch reads (`LossInputs`): the update hands it to `algorithms/grpo.py::policy_loss`,
which hands it to the configured surrogate of `algorithms/surrogates.py` (docs/algorithms.md §1.4, §11.1)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LossInputs:
    """One micro-batch of b rows and T response positions; every tensor is (b, T) unless said otherwise.

    logp: log π_θ(o_t), with its gradient; old_logp: log π_old(o_t) (the ratio's denominator, detached);
    advantages: Â_t per token — the row's Â_i broadcast, or a selection's per-token advantages (a (b,) tensor is
    broadcast to (b, T) and every tensor here is read in logp's dtype); response_mask: 1 on response tokens;
    weights: the selection's token weights (0/1 for a mask); normalizer: the selection's loss normaliser, `selected`
    or `all`; clip_low / clip_high: ε of the ratio clip, a float or a per-token tensor (None: the settings' ε);
    kl_weights: per-token KL multipliers (None: 1); drift_coef: β_t of the drift penalty β_t·|log π_θ − log π_old|
    (None: none); ref_logp: log π_ref(o_t) (None: no reference); is_weights: the engine's importance weights, detached
    (None: off); entropy: H_t of the update's forward, with its gradient (None: no entropy bonus).
    """

    logp: torch.Tensor
    old_logp: torch.Tensor
    advantages: torch.Tensor
    response_mask: torch.Tensor
    weights: torch.Tensor
    normalizer: str = "selected"
    clip_low: float | torch.Tensor | None = None
    clip_high: float | torch.Tensor | None = None
    kl_weights: torch.Tensor | None = None
    drift_coef: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None
    is_weights: torch.Tensor | None = None
    entropy: torch.Tensor | None = None

    def __post_init__(self) -> None:
        advantages = self.advantages
        if advantages.dim() == 1:
            advantages = advantages[:, None].expand_as(self.logp)
        object.__setattr__(self, "advantages", advantages.to(self.logp.dtype))

    @property
    def selected(self) -> torch.Tensor:
        """(b, T) float {0, 1}: the response tokens of non-zero weight."""
        return self.response_mask.float() * (self.weights != 0)

    @property
    def log_ratio(self) -> torch.Tensor:
        """log r_t = log π_θ − log π_old, clamped to ±20 (every ratio of the loss is)."""
        return torch.clamp(self.logp - self.old_logp, -20.0, 20.0)
