"""`LossSettings`: the loss's part of the `algorithm` node (`AlgorithmConfig.loss`), what `policy_loss` and every
surrogate read. Below both the registry of surrogates (algorithms/surrogates.py) and `AlgorithmConfig`
(algorithms/config.py), which checks the surrogate `policy_loss` names against the registry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

AGGREGATIONS = ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm")
KL_ESTIMATORS = ("k1", "k2", "k3", "low_var_kl")
DPPO_DIVERGENCES = ("tv", "kl")


@dataclass(frozen=True)
class LossSettings:
    """What `policy_loss` reads (docs/algorithms.md §1.2, §1.4, §11): the surrogate (`policy_loss`, a name of
    `algorithms/surrogates.py::SURROGATES` or a `package.module:function`) with its ε, dual clip, DPPO trust region and
    SAPO temperatures, the KL term, the entropy bonus and the aggregation. The defaults after `clip_high` turn every
    extra term off."""

    aggregation: str
    clip_low: float
    clip_high: float
    policy_loss: str = "ppo"
    dual_clip: float | None = None
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    kl_masked: bool = True
    entropy_coef: float = 0.0
    entropy_masked: bool = False
    dppo_divergence: str = "tv"
    dppo_low: float = 0.15
    dppo_high: float = 0.15
    sapo_tau_pos: float = 1.0
    sapo_tau_neg: float = 1.05
    response_budget: int = 0  # rollout.max_new_tokens: Dr. GRPO's constant normaliser (seq-mean-token-sum-norm)

    def validate(self) -> None:
        """Every rule but the surrogate's own (`AlgorithmConfig.validate`: registered, and whether it takes the dual
        clip)."""
        one_of("aggregation", self.aggregation, AGGREGATIONS)
        one_of("kl_estimator", self.kl_estimator, KL_ESTIMATORS)
        one_of("dppo_divergence", self.dppo_divergence, DPPO_DIVERGENCES)
        if self.aggregation == "seq-mean-token-sum-norm" and self.response_budget < 1:
            raise ValueError(
                "algorithm.aggregation=seq-mean-token-sum-norm divides by rollout.max_new_tokens, which is "
                f"{self.response_budget}; build the config with the response budget"
            )
        if self.dual_clip is not None and not self.dual_clip > 1.0:
            raise ValueError(
                f"algorithm.dual_clip={self.dual_clip} must be > 1 (verl's clip_ratio_c; 3 or 10 typical) "
                "or null for off"
            )
        for name in ("clip_low", "clip_high", "kl_coef", "entropy_coef"):
            if getattr(self, name) < 0:
                raise ValueError(f"algorithm.{name}={getattr(self, name)} must be >= 0")
        for name in ("dppo_low", "dppo_high", "sapo_tau_pos", "sapo_tau_neg"):
            if not getattr(self, name) > 0:
                raise ValueError(f"algorithm.{name}={getattr(self, name)} must be > 0")


def one_of(name: str, value: Any, allowed: tuple[str, ...], suffix: str = "") -> None:
    """ValueError `algorithm.<name>=<value> is not one of <allowed>` unless `value` is allowed."""
    if value not in allowed:
        raise ValueError(f"algorithm.{name}={value!r} is not one of {allowed}" + (f" {suffix}" if suffix else ""))
