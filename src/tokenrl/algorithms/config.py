"""`AlgorithmConfig`: the `algorithm` node as one frozen, validated record, built once at start-up. The YAML stays
flat (`algorithm.clip_low`); the record groups its keys by who reads them (`batch`, `loss`, `engine_is`, `shaping`,
`schedule`), each group checks its own fields and every error names the key as the command line writes it, so a bad
run fails before a model is loaded. The math each field controls: docs/algorithms.md §1.2–1.4, §1.6, §11."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from tokenrl.algorithms.loss_settings import LossSettings, one_of
from tokenrl.algorithms.surrogates import REFUSES_DUAL_CLIP, get_surrogate

TIS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
FILTER_METRICS = ("acc", "reward")
NOT_LOSS_SETTINGS = ("name", "optimizer")  # keys of the node that other code reads (the optimizer factory, a label)
DERIVED = ("response_budget",)  # fields set from other nodes, not from `algorithm`


@dataclass(frozen=True)
class BatchSettings:
    """How one rollout step is cut: `prompts_per_step` prompts × `group_size` rollouts, `ppo_epochs` passes of
    `mini_batches` optimizer steps, forwards of `micro_batch_size` rows or, with `micro_batch_tokens`, of at most
    that many tokens (step/micro_batches.py); with dynamic sampling, rounds of `gen_prompts_per_step` prompts, at
    most `max_gen_rounds`."""

    group_size: int
    prompts_per_step: int
    micro_batch_size: int
    ppo_epochs: int
    mini_batches: int
    gen_prompts_per_step: int
    max_gen_rounds: int
    micro_batch_tokens: int | None = None

    @property
    def optimizer_steps(self) -> int:
        """Optimizer steps per rollout step."""
        return self.ppo_epochs * self.mini_batches

    def validate(self) -> None:
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
        if self.micro_batch_tokens is not None and self.micro_batch_tokens < 1:
            raise ValueError(
                f"algorithm.micro_batch_tokens={self.micro_batch_tokens} must be >= 1 (or null to cut micro-batches "
                "by algorithm.micro_batch_size rows)"
            )


@dataclass(frozen=True)
class EngineISSettings:
    """The engine's importance weights on the policy-gradient term (docs/algorithms.md §1.6, §11.13): upper bound
    `tis_cap` (None: off), `tis_mode`, lower bound `tis_min` (None: none)."""

    tis_cap: float | None = None
    tis_mode: str = "token_truncate"
    tis_min: float | None = None

    def validate(self) -> None:
        one_of("tis_mode", self.tis_mode, TIS_MODES)
        if self.tis_cap is not None and not self.tis_cap > 0:
            raise ValueError(f"algorithm.tis_cap={self.tis_cap} must be > 0 (or null to turn the correction off)")
        for name, off in (("tis_mode", "token_truncate"), ("tis_min", None)):
            if self.tis_cap is None and getattr(self, name) != off:
                raise ValueError(
                    f"algorithm.{name}={getattr(self, name)} has no effect while algorithm.tis_cap=null "
                    "(the engine's importance weights are off): set algorithm.tis_cap, the upper bound "
                    "(2.0 for TIS; 5.0 with tis_min=0.5 for IcePop)"
                )
        if self.tis_min is not None and self.tis_cap is not None and not 0 < self.tis_min < self.tis_cap:
            raise ValueError(
                f"algorithm.tis_min={self.tis_min} must lie in (0, algorithm.tis_cap={self.tis_cap}) "
                "(or null for no lower bound)"
            )


@dataclass(frozen=True)
class ShapingSettings:
    """Rewards and advantages before the loss (docs/algorithms.md §1.1, §1.3): the group std division and its ε, DAPO's
    overlong shaping (`overlong_buffer` tokens, 0 = off) and dynamic sampling's filter metric (None: off)."""

    adv_std_normalize: bool
    adv_eps: float
    overlong_buffer: int
    overlong_penalty_factor: float
    filter_groups: str | None

    def validate(self, max_new_tokens: int) -> None:
        if self.filter_groups is not None:
            one_of("filter_groups", self.filter_groups, FILTER_METRICS, "(or null for off)")
        if not 0 <= self.overlong_buffer <= max_new_tokens:
            raise ValueError(
                f"algorithm.overlong_buffer={self.overlong_buffer} must lie in [0, rollout.max_new_tokens="
                f"{max_new_tokens}] (0 turns the shaping off)"
            )
        for name in ("adv_eps", "overlong_penalty_factor"):
            if getattr(self, name) < 0:
                raise ValueError(f"algorithm.{name}={getattr(self, name)} must be >= 0")


@dataclass(frozen=True)
class ScheduleSettings:
    """What acts across steps or on the gradient: the lr warm-up (rollout steps, 0 = constant), the gradient-norm clip
    (None: none) and the adaptive entropy coefficient (`entropy_target` None: a fixed `loss.entropy_coef`;
    docs/algorithms.md §11.5)."""

    lr_warmup_steps: int
    grad_clip: float | None
    entropy_target: float | None = None
    entropy_coef_delta: float = 1e-4
    entropy_coef_max: float = 5e-3

    def validate(self) -> None:
        if self.lr_warmup_steps < 0:
            raise ValueError(f"algorithm.lr_warmup_steps={self.lr_warmup_steps} must be >= 0 (0 = constant lr)")
        if self.entropy_target is not None and not self.entropy_target > 0:
            raise ValueError(
                f"algorithm.entropy_target={self.entropy_target} must be > 0 nats (or null for a fixed "
                "algorithm.entropy_coef)"
            )
        for name in ("entropy_coef_delta", "entropy_coef_max"):
            if getattr(self, name) < 0:
                raise ValueError(f"algorithm.{name}={getattr(self, name)} must be >= 0")
        if self.grad_clip is not None and not self.grad_clip > 0:
            raise ValueError(f"algorithm.grad_clip={self.grad_clip} must be > 0 (or null for no clipping)")


@dataclass(frozen=True)
class AlgorithmConfig:
    """GRPO with the DAPO switches (configs/algorithm/grpo.yaml documents each key), grouped by reader."""

    batch: BatchSettings
    loss: LossSettings
    engine_is: EngineISSettings
    shaping: ShapingSettings
    schedule: ScheduleSettings

    GROUPS: ClassVar[dict[str, type]] = {
        "batch": BatchSettings,
        "loss": LossSettings,
        "engine_is": EngineISSettings,
        "shaping": ShapingSettings,
        "schedule": ScheduleSettings,
    }

    @classmethod
    def fields(cls) -> dict[str, dataclasses.Field]:
        """Every flat key of the record (`algorithm.<key>`, the derived `response_budget` included) → its field."""
        return {field.name: field for group in cls.GROUPS.values() for field in dataclasses.fields(group)}

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """The keys of the `algorithm` node that the record reads (every field but the derived ones)."""
        return tuple(name for name in cls.fields() if name not in DERIVED)

    @classmethod
    def of(cls, **values: Any) -> AlgorithmConfig:
        """The record of flat keyword values (unchecked: `from_node` checks them); a group's key left out takes its
        default where it has one."""
        fields = cls.fields()
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise ValueError(f"algorithm.{unknown[0]} is not a setting of the algorithm (settings: {sorted(fields)})")
        return cls(
            **{
                name: group(**{f.name: values[f.name] for f in dataclasses.fields(group) if f.name in values})
                for name, group in cls.GROUPS.items()
            }
        )

    def replace(self, **values: Any) -> AlgorithmConfig:
        """A copy with flat keys changed (`cfg.replace(kl_coef=0.0)`), unchecked."""
        groups = [getattr(self, name) for name in self.GROUPS]
        current = {field.name: getattr(group, field.name) for group in groups for field in dataclasses.fields(group)}
        return self.of(**{**current, **values})

    @classmethod
    def from_node(cls, node: Mapping[str, Any], max_new_tokens: int) -> AlgorithmConfig:
        """The record of a composed `algorithm` node; `max_new_tokens` (rollout.max_new_tokens) bounds the overlong
        buffer. Raises ValueError naming the key for an unknown, missing or invalid setting."""
        fields = {name: field for name, field in cls.fields().items() if name not in DERIVED}
        unknown = sorted(set(node) - set(fields) - set(NOT_LOSS_SETTINGS))
        if unknown:
            raise ValueError(f"algorithm.{unknown[0]} is not a setting of the algorithm (settings: {sorted(fields)})")
        missing = sorted(set(fields) - set(node))
        if missing:
            raise ValueError(f"algorithm.{missing[0]} is missing from the algorithm config")
        values = {name: _typed(name, node[name], str(field.type)) for name, field in fields.items()}
        config = cls.of(**values, response_budget=max_new_tokens)
        config.validate(max_new_tokens)
        return config

    def validate(self, max_new_tokens: int) -> None:
        """Every group's rules, then the rules across groups: the surrogate `loss.policy_loss` names is registered (or
        imports) and takes `loss.dual_clip` if one is set."""
        self.loss.validate()
        reason = REFUSES_DUAL_CLIP.get(get_surrogate(self.loss.policy_loss))  # ValueError for a bad name or path
        if reason is not None and self.loss.dual_clip is not None:
            raise ValueError(
                f"algorithm.dual_clip={self.loss.dual_clip} does not apply to algorithm.policy_loss="
                f"{self.loss.policy_loss} ({reason}); set algorithm.dual_clip=null"
            )
        self.engine_is.validate()
        self.shaping.validate(max_new_tokens)
        self.batch.validate()
        self.schedule.validate()
        if self.schedule.entropy_target is not None and self.loss.entropy_coef > self.schedule.entropy_coef_max:
            raise ValueError(
                f"algorithm.entropy_coef={self.loss.entropy_coef} must be <= algorithm.entropy_coef_max="
                f"{self.schedule.entropy_coef_max} (the adaptive coefficient's start and cap)"
            )

    @property
    def uses_entropy_bonus(self) -> bool:
        """The update's forward must return the entropy with its gradient (a fixed or an adaptive bonus)."""
        return self.loss.entropy_coef > 0 or self.schedule.entropy_target is not None

    @property
    def uses_reference(self) -> bool:
        """A KL term to the frozen initial policy is on."""
        return self.loss.kl_coef > 0


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
