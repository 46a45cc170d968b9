"""The policy-gradient surrogates, one registry, one signature (docs/algorithms.md §1.2, §11.2, §11.10–§11.12), in
the manner of verl's `register_policy_loss` and prime-rl's `LossInputs` / `LossOutputs`. A surrogate turns one
micro-batch's `LossInputs` and `LossSettings` into per-token `SurrogateTerms` before any weight (`policy_loss` adds the
rest):

    @register_surrogate("reinforce", refuses_dual_clip="…")
    def reinforce(inputs: LossInputs, settings: LossSettings) -> SurrogateTerms: ...

makes `algorithm.policy_loss=reinforce` valid; user code is reached as `algorithm.policy_loss=package.module:function`
(each process that reads the setting imports it). Dual clip (arXiv 1912.09729; verl's `clip_ratio_c`): a surrogate
either caps its own pg with `dual_clip` or names why it refuses the setting, and the start-up check refuses it then."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from tokenrl.algorithms.loss_settings import DPPO_DIVERGENCES, LossSettings
from tokenrl.records.loss_inputs import LossInputs


@dataclass
class SurrogateTerms:
    """Per-token (b, T) terms of a surrogate: pg (to minimise, with its gradient), clipped and dual_clipped (float
    0/1, detached or not: only summed over the selected tokens); metrics: the surrogate's own, each per token or a
    scalar, the same names on every call, logged as their mean over the step's selected tokens."""

    pg: torch.Tensor
    clipped: torch.Tensor
    dual_clipped: torch.Tensor
    metrics: dict[str, torch.Tensor | float] = field(default_factory=dict)


Surrogate = Callable[[LossInputs, LossSettings], SurrogateTerms]
SURROGATES: dict[str, Surrogate] = {}
REFUSES_DUAL_CLIP: dict[Surrogate, str] = {}  # surrogate → why `algorithm.dual_clip` does not apply to it


def register_surrogate(name: str, *, refuses_dual_clip: str | None = None) -> Callable[[Surrogate], Surrogate]:
    """Decorator: register `fn` as `algorithm.policy_loss=name`. `refuses_dual_clip`: why the dual clip does not apply
    (the start-up check refuses `algorithm.dual_clip` with this reason); None: the surrogate applies it itself."""

    def register(fn: Surrogate) -> Surrogate:
        if name in SURROGATES:
            raise ValueError(f"a surrogate named {name!r} is already registered (algorithm.policy_loss={name})")
        SURROGATES[name] = fn
        if refuses_dual_clip is not None:
            REFUSES_DUAL_CLIP[fn] = refuses_dual_clip
        return fn

    return register


def get_surrogate(name: str) -> Surrogate:
    """The surrogate of `algorithm.policy_loss=name`: a registered name or a `package.module:function`; ValueError
    naming the key, the value and what it may be."""
    if name in SURROGATES:
        return SURROGATES[name]
    module, colon, attribute = name.partition(":")
    problem = f"is not one of {tuple(SURROGATES)} (or a 'package.module:function')"
    if colon:
        try:
            surrogate = getattr(importlib.import_module(module), attribute)
            if callable(surrogate):
                return surrogate
            problem = "is not a function"
        except (ImportError, AttributeError, ValueError) as err:  # ValueError: an empty module name
            problem = f"cannot be imported ({err})"
        problem += f": name a function of a module on PYTHONPATH, or one of {tuple(SURROGATES)}"
    raise ValueError(f"algorithm.policy_loss={name!r} {problem}")


def clip_ratio(ratio: torch.Tensor, inputs: LossInputs, settings: LossSettings) -> torch.Tensor:
    """clip(r, 1 − ε_low, 1 + ε_high) with the inputs' ε where set (a float or a per-token tensor), else the settings'
    (ε_high = inf: no upper bound)."""
    clip_low = settings.clip_low if inputs.clip_low is None else inputs.clip_low
    clip_high = settings.clip_high if inputs.clip_high is None else inputs.clip_high
    if not isinstance(clip_low, torch.Tensor) and not isinstance(clip_high, torch.Tensor):
        return torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    low, high = (
        1.0 + sign * torch.as_tensor(eps, dtype=ratio.dtype, device=ratio.device)
        for sign, eps in ((-1.0, clip_low), (1.0, clip_high))
    )
    return torch.minimum(torch.maximum(ratio, low), high)


def dual_clip(pg: torch.Tensor, adv: torch.Tensor, c: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(pg capped at −c·Â where Â < 0, which tokens the cap changed); c = None: unchanged (arXiv 1912.09729, verl's
    `clip_ratio_c`)."""
    if c is None:
        return pg, torch.zeros_like(pg)
    bound = -adv * c
    capped = ((adv < 0) & (pg > bound)).to(pg.dtype)
    return torch.where(adv < 0, torch.minimum(pg, bound), pg), capped


def clipped_surrogate(inputs: LossInputs, ratio: torch.Tensor, settings: LossSettings) -> SurrogateTerms:
    """−min(r·Â, clip(r, 1 − ε_low, 1 + ε_high)·Â), dual-clipped; `clipped`: the clipped branch is the active
    minimum."""
    adv = inputs.advantages
    unclipped, clipped = ratio * adv, clip_ratio(ratio, inputs, settings) * adv
    pg = -torch.minimum(unclipped, clipped)
    pg, dual_clipped = dual_clip(pg, adv, settings.dual_clip)
    return SurrogateTerms(pg, (clipped < unclipped).to(pg.dtype), dual_clipped)


def sequence_log_ratio(inputs: LossInputs) -> torch.Tensor:
    """(b,) log s_i: the mean clamped log-ratio over the row's selected tokens (GSPO, arXiv 2507.18071)."""
    selected = inputs.selected
    return (inputs.log_ratio * selected).sum(1) / selected.sum(1).clamp_min(1.0)


def dppo_dropped(inputs: LossInputs, settings: LossSettings) -> torch.Tensor:
    """DPPO's "drop rather than clip" (Qi et al., arXiv 2602.04879; prime-rl's default loss, verl's `dppo_tv` /
    `dppo_kl`): with p = π_θ(o_t), p_old = π_old(o_t) and D the binary TV |p − p_old| (`tv`) or the binary KL
    p_old·log(p_old/p) + (1 − p_old)·log((1 − p_old + 1e-8)/(1 − p + 1e-8)) (`kl`, verl's and TRL's form), a token
    is dropped where it left the trust region the way its advantage pushes it: Â > 0, p > p_old and D > δ_high, or
    Â < 0, p < p_old and D > δ_low (`settings`: dppo_divergence, dppo_low, dppo_high). Detached (a 0/1 gate)."""
    logp, old_logp, adv = inputs.logp, inputs.old_logp, inputs.advantages
    divergence, low, high = settings.dppo_divergence, settings.dppo_low, settings.dppo_high
    with torch.no_grad():
        p, p_old = torch.exp(logp), torch.exp(old_logp)
        if divergence == "tv":
            distance = (p - p_old).abs()
        elif divergence == "kl":
            eps = 1e-8
            distance = p_old * (old_logp - logp) + (1.0 - p_old) * torch.log((1.0 - p_old + eps) / (1.0 - p + eps))
        else:
            raise ValueError(f"algorithm.dppo_divergence={divergence!r} is not one of {DPPO_DIVERGENCES}")
        return ((adv > 0) & (p > p_old) & (distance > high)) | ((adv < 0) & (p < p_old) & (distance > low))


@register_surrogate("ppo")
def ppo(inputs: LossInputs, settings: LossSettings) -> SurrogateTerms:
    """PPO's clipped surrogate, GRPO's per-token loss (DeepSeekMath, arXiv 2402.03300, Eq. 3; docs/algorithms.md
    §1.2): pg_t = −min(r_t Â_t, clip(r_t, 1 − ε_low,t, 1 + ε_high,t) Â_t), r_t = exp(log π_θ − log π_old) with the
    log-ratio clamped to ±20; ε_high > ε_low is DAPO's clip-higher (arXiv 2503.14476)."""
    return clipped_surrogate(inputs, torch.exp(inputs.log_ratio), settings)


@register_surrogate("gspo")
def gspo(inputs: LossInputs, settings: LossSettings) -> SurrogateTerms:
    """GSPO-token (arXiv 2507.18071; verl's `compute_policy_loss_gspo`; docs/algorithms.md §11.2): the clipped
    surrogate with r_t = exp(log π_θ − sg(log π_θ) + sg(log s_i)), log s_i the mean log-ratio of the row's selected
    tokens: value s_i, gradient through the token's own log-probability."""
    logp = inputs.logp
    log_ratio = logp - logp.detach() + sequence_log_ratio(inputs).detach()[:, None]
    return clipped_surrogate(inputs, torch.exp(log_ratio), settings)


@register_surrogate("gspo_seq")
def gspo_seq(inputs: LossInputs, settings: LossSettings) -> SurrogateTerms:
    """GSPO's sequence form (arXiv 2507.18071, its main objective; docs/algorithms.md §11.10): the clipped surrogate
    with r_t = s_i on every token of row i, s_i = exp(mean log-ratio of the row's selected tokens) with its
    gradient."""
    log_ratio = sequence_log_ratio(inputs)[:, None].expand_as(inputs.logp)
    return clipped_surrogate(inputs, torch.exp(log_ratio), settings)


@register_surrogate("cispo", refuses_dual_clip="its IS weight is already clipped and detached")
def cispo(inputs: LossInputs, settings: LossSettings) -> SurrogateTerms:
    """CISPO (MiniMax-M1, arXiv 2506.13585; docs/algorithms.md §11.2): pg_t = −sg(clip(r_t, 1 − ε_low, 1 + ε_high))
    Â_t log π_θ(o_t): every token keeps a gradient, the IS weight is clipped and detached; `clipped`: the bound
    changed r_t."""
    ratio = torch.exp(inputs.log_ratio)
    bounded = clip_ratio(ratio, inputs, settings)
    pg = -bounded.detach() * inputs.advantages * inputs.logp
    return SurrogateTerms(pg, (bounded != ratio).to(pg.dtype), torch.zeros_like(pg))


@register_surrogate("dppo")
def dppo(inputs: LossInputs, settings: LossSettings) -> SurrogateTerms:
    """DPPO (Qi et al., arXiv 2602.04879; prime-rl's `default_loss_fn`; docs/algorithms.md §11.11): pg_t = −r_t Â_t,
    0 where the token left the probability-space trust region the way its advantage pushes it (`dppo_dropped`, with
    `algorithm.dppo_divergence`, `dppo_low`, `dppo_high`), dual-clipped; `clipped`: the token was dropped. No ε."""
    adv = inputs.advantages
    dropped = dppo_dropped(inputs, settings)
    pg = torch.where(dropped, 0.0, -torch.exp(inputs.log_ratio) * adv)
    pg, dual_clipped = dual_clip(pg, adv, settings.dual_clip)
    return SurrogateTerms(pg, dropped.to(inputs.logp.dtype), dual_clipped)


@register_surrogate("sapo", refuses_dual_clip="its soft gate is already bounded by 4/τ·|Â|")
def sapo(inputs: LossInputs, settings: LossSettings) -> SurrogateTerms:
    """SAPO (Gao et al., arXiv 2511.20347; TRL's `loss_type="sapo"`, verl's `compute_policy_loss_sapo`;
    docs/algorithms.md §11.12): pg_t = −σ(τ_t(r_t − 1))·4/τ_t·Â_t, τ_t = `algorithm.sapo_tau_pos` where Â_t > 0 else
    `sapo_tau_neg`; no ε, never `clipped`."""
    adv = inputs.advantages
    tau = torch.full_like(adv, settings.sapo_tau_neg).masked_fill(adv > 0, settings.sapo_tau_pos)
    pg = -torch.sigmoid(tau * (torch.exp(inputs.log_ratio) - 1.0)) * (4.0 / tau) * adv
    none = torch.zeros_like(inputs.logp)
    return SurrogateTerms(pg, none, none)


BUILT_IN_SURROGATES = tuple(SURROGATES)  # the surrogates tokenrl ships, in the order of docs/algorithms.md §11.2
