"""`AlgorithmConfig`: the `algorithm` node as one frozen, validated record, built once at start-up.

Every check of the GRPO/DAPO settings lives here, and every error names the key as the command line writes it
(`algorithm.dual_clip=0.5 …`), so a bad run fails before a model is loaded; the hot path reads typed attributes.
The math each field controls: docs/algorithms.md §1.2–1.4 (GRPO, DAPO pieces, the masked loss), §1.6 and §11.13 (the
engine's importance weights: truncated or masked, per token or per sequence), §11 (loss variants — GSPO, CISPO, DPPO,
SAPO —, KL estimators, the entropy bonus and its adaptive coefficient).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

AGGREGATIONS = ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm")
KL_ESTIMATORS = ("k1", "k2", "k3", "low_var_kl")
POLICY_LOSSES = ("ppo", "gspo", "gspo_seq", "cispo", "dppo", "sapo")
TIS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
DPPO_DIVERGENCES = ("tv", "kl")
FILTER_METRICS = ("acc", "reward")
NOT_LOSS_SETTINGS = ("name", "optimizer")  # keys of the node that other code reads (the optimizer factory, a label)
DERIVED = ("response_budget",)  # fields set from other nodes, not from `algorithm`


@dataclass(frozen=True)
class AlgorithmConfig:
    """GRPO with the DAPO switches (configs/algorithm/grpo.yaml documents each field)."""

    group_size: int
    prompts_per_step: int
    micro_batch_size: int
    aggregation: str
    clip_low: float
    clip_high: float
    dual_clip: float | None
    kl_coef: float
    kl_estimator: str
    kl_masked: bool
    adv_std_normalize: bool
    adv_eps: float
    ppo_epochs: int
    mini_batches: int
    grad_clip: float | None
    overlong_buffer: int
    overlong_penalty_factor: float
    lr_warmup_steps: int
    filter_groups: str | None
    gen_prompts_per_step: int
    max_gen_rounds: int
    tis_cap: float | None
    policy_loss: str = "ppo"
    tis_mode: str = "token_truncate"
    tis_min: float | None = None
    dppo_divergence: str = "tv"
    dppo_low: float = 0.15
    dppo_high: float = 0.15
    sapo_tau_pos: float = 1.0
    sapo_tau_neg: float = 1.05
    entropy_coef: float = 0.0
    entropy_masked: bool = False
    entropy_target: float | None = None
    entropy_coef_delta: float = 1e-4
    entropy_coef_max: float = 5e-3
    response_budget: int = 0  # rollout.max_new_tokens: Dr. GRPO's constant normaliser (seq-mean-token-sum-norm)

    @classmethod
    def from_node(cls, node: Mapping[str, Any], max_new_tokens: int) -> AlgorithmConfig:
        """The record of a composed `algorithm` node; `max_new_tokens` (rollout.max_new_tokens) bounds the overlong
        buffer. Raises ValueError naming the key for an unknown, missing or invalid setting."""
        fields = {field.name: field for field in dataclasses.fields(cls) if field.name not in DERIVED}
        unknown = sorted(set(node) - set(fields) - set(NOT_LOSS_SETTINGS))
        if unknown:
            raise ValueError(f"algorithm.{unknown[0]} is not a setting of the algorithm (settings: {sorted(fields)})")
        missing = sorted(set(fields) - set(node))
        if missing:
            raise ValueError(f"algorithm.{missing[0]} is missing from the algorithm config")
        values = {name: _typed(name, node[name], field.type) for name, field in fields.items()}
        config = cls(**values, response_budget=max_new_tokens)
        config.validate(max_new_tokens)
        return config

    def validate(self, max_new_tokens: int) -> None:
        """Every rule the settings must satisfy, in one place."""
        _one_of("aggregation", self.aggregation, AGGREGATIONS)
        _one_of("kl_estimator", self.kl_estimator, KL_ESTIMATORS)
        _one_of("policy_loss", self.policy_loss, POLICY_LOSSES)
        _one_of("tis_mode", self.tis_mode, TIS_MODES)
        _one_of("dppo_divergence", self.dppo_divergence, DPPO_DIVERGENCES)
        if self.aggregation == "seq-mean-token-sum-norm" and self.response_budget < 1:
            raise ValueError(
                "algorithm.aggregation=seq-mean-token-sum-norm divides by rollout.max_new_tokens, which is "
                f"{self.response_budget}; build the config with the response budget"
            )
        if self.policy_loss == "cispo" and self.dual_clip is not None:
            raise ValueError(
                f"algorithm.dual_clip={self.dual_clip} does not apply to algorithm.policy_loss=cispo (its "
                "IS weight is already clipped and detached); set algorithm.dual_clip=null"
            )
        if self.policy_loss == "sapo" and self.dual_clip is not None:
            raise ValueError(
                f"algorithm.dual_clip={self.dual_clip} does not apply to algorithm.policy_loss=sapo (its "
                "soft gate is already bounded by 4/τ·|Â|); set algorithm.dual_clip=null"
            )
        if self.filter_groups is not None:
            _one_of("filter_groups", self.filter_groups, FILTER_METRICS, "(or null for off)")
        if self.group_size < 2:
            raise ValueError(
                f"algorithm.group_size={self.group_size} must be >= 2: GRPO's advantage compares each "
                "response with the others of its group, so a group of one gives every advantage 0"
            )
        for name in (
            "prompts_per_step",
            "micro_batch_size",
            "ppo_epochs",
            "mini_batches",
            "gen_prompts_per_step",
            "max_gen_rounds",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"algorithm.{name}={getattr(self, name)} must be >= 1")
        if self.dual_clip is not None and not self.dual_clip > 1.0:
            raise ValueError(
                f"algorithm.dual_clip={self.dual_clip} must be > 1 (verl's clip_ratio_c; 3 or 10 typical) "
                "or null for off"
            )
        if self.tis_cap is not None and not self.tis_cap > 0:
            raise ValueError(f"algorithm.tis_cap={self.tis_cap} must be > 0 (or null to turn the correction off)")
        for name, off in (("tis_mode", "token_truncate"), ("tis_min", None)):
            if self.tis_cap is None and getattr(self, name) != off:
                raise ValueError(
                    f"algorithm.{name}={getattr(self, name)} has no effect while algorithm.tis_cap=null "
                    "(the engine's importance weights are off): set algorithm.tis_cap, the upper bound "
                    "(2.0 for TIS; 5.0 with tis_min=0.5 for IcePop)"
                )
        if self.tis_min is not None and not 0 < self.tis_min < self.tis_cap:
            raise ValueError(
                f"algorithm.tis_min={self.tis_min} must lie in (0, algorithm.tis_cap={self.tis_cap}) "
                "(or null for no lower bound)"
            )
        if not 0 <= self.overlong_buffer <= max_new_tokens:
            raise ValueError(
                f"algorithm.overlong_buffer={self.overlong_buffer} must lie in [0, rollout.max_new_tokens="
                f"{max_new_tokens}] (0 turns the shaping off)"
            )
        if self.lr_warmup_steps < 0:
            raise ValueError(f"algorithm.lr_warmup_steps={self.lr_warmup_steps} must be >= 0 (0 = constant lr)")
        if self.entropy_target is not None and not self.entropy_target > 0:
            raise ValueError(
                f"algorithm.entropy_target={self.entropy_target} must be > 0 nats (or null for a fixed "
                "algorithm.entropy_coef)"
            )
        if self.entropy_target is not None and self.entropy_coef > self.entropy_coef_max:
            raise ValueError(
                f"algorithm.entropy_coef={self.entropy_coef} must be <= algorithm.entropy_coef_max="
                f"{self.entropy_coef_max} (the adaptive coefficient's start and cap)"
            )
        for name in (
            "clip_low",
            "clip_high",
            "kl_coef",
            "adv_eps",
            "overlong_penalty_factor",
            "entropy_coef",
            "entropy_coef_delta",
            "entropy_coef_max",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"algorithm.{name}={getattr(self, name)} must be >= 0")
        for name in ("dppo_low", "dppo_high", "sapo_tau_pos", "sapo_tau_neg"):
            if not getattr(self, name) > 0:
                raise ValueError(f"algorithm.{name}={getattr(self, name)} must be > 0")
        if self.grad_clip is not None and not self.grad_clip > 0:
            raise ValueError(f"algorithm.grad_clip={self.grad_clip} must be > 0 (or null for no clipping)")

    @property
    def uses_entropy_bonus(self) -> bool:
        """The update's forward must return the entropy with its gradient (a fixed or an adaptive bonus)."""
        return self.entropy_coef > 0 or self.entropy_target is not None

    @property
    def uses_reference(self) -> bool:
        """A KL term to the frozen initial policy is on."""
        return self.kl_coef > 0


def _one_of(name: str, value: Any, allowed: tuple[str, ...], suffix: str = "") -> None:
    if value not in allowed:
        raise ValueError(f"algorithm.{name}={value!r} is not one of {allowed}" + (f" {suffix}" if suffix else ""))


def _typed(name: str, value: Any, annotation: str) -> Any:
    """`value` as the field's type (YAML gives 1 for 1.0 and strings for numbers written in quotes)."""
    optional = annotation.endswith("| None")
    if value is None:
        if optional:
            return None
        raise ValueError(f"algorithm.{name}=null is not allowed (a value of type {annotation} is needed)")
    kind = annotation.removesuffix("| None").strip()
    try:
        if kind == "bool":
            if not isinstance(value, bool):
                raise TypeError
            return value
        if kind == "int" and isinstance(value, float) and not value.is_integer():
            raise TypeError
        return {"int": int, "float": float, "str": str}[kind](value)
    except (TypeError, ValueError):
        raise ValueError(f"algorithm.{name}={value!r} is not a valid {kind}") from None
