"""GRPO math in one place (docs/algorithms.md §1.4, §11): group advantages, the per-token policy loss (a surrogate of
algorithms/surrogates.py with its KL, entropy and drift terms), loss aggregation and the engine's importance weights.
Sources: DeepSeekMath (arXiv 2402.03300) §4.1 for GRPO; DAPO (arXiv 2503.14476) for clip-higher and token-mean."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import reduce

import torch

from tokenrl.algorithms.config import TIS_MODES, EngineISSettings
from tokenrl.algorithms.loss_settings import AGGREGATIONS, KL_ESTIMATORS, LossSettings
from tokenrl.algorithms.surrogates import get_surrogate
from tokenrl.records.loss_inputs import LossInputs
from tokenrl.records.selection import Selection

NORMALIZERS = ("selected", "all")


def group_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-6, std_normalize: bool = True
) -> torch.Tensor:
    """Â_i = (R_i − mean_g R) / (std_g R + ε) over the rollouts of the same prompt (unbiased std).

    A group of one has mean 0 and std 1 (verl's rule); a group with equal rewards gets Â = 0, never NaN.
    """
    rewards = rewards.double()
    adv = torch.zeros_like(rewards)
    for group in group_ids.unique():
        rows = group_ids == group
        values = rewards[rows]
        if values.numel() > 1 and bool((values == values[0]).all()):
            continue  # exactly 0: the mean of equal non-dyadic rewards (0.1) is not exactly each of them
        if values.numel() == 1:
            mean, std = torch.zeros((), dtype=values.dtype), torch.ones((), dtype=values.dtype)
        else:
            mean, std = values.mean(), values.std()
        centred = values - mean
        adv[rows] = centred / (std + eps) if std_normalize else centred
    return adv.float()


def denominator_mask(response_mask: torch.Tensor, token_mask: torch.Tensor, norm: str) -> torch.Tensor:
    """D of docs/algorithms.md §1.4: the selected tokens — those of non-zero weight — (`selected`) or every response
    token (`all`)."""
    if norm not in NORMALIZERS:
        raise ValueError(f"loss normaliser {norm!r} is not one of {NORMALIZERS}")
    return (response_mask * (token_mask != 0)).float() if norm == "selected" else response_mask.float()


@dataclass
class LossNormalizer:
    """Divisors of one optimizer step's loss, counted over its whole mini-batch (and all ranks).

    token-mean: pg = Σ tokens of D, kl = Σ_t W_kl (KL-weighted), entropy = Σ tokens of W_H; seq-mean-token-mean: all
    three = kept sequences (those with Σ_t D > 0); seq-mean-token-sum-norm (Dr. GRPO): all three = sequences × the
    response budget, a constant whatever the selection (docs/algorithms.md §11.3).
    """

    pg: float
    kl: float
    entropy: float = 1.0

    def __add__(self, other: LossNormalizer) -> LossNormalizer:
        """The divisors of two disjoint sets of rows together (each count is a sum over rows)."""
        return LossNormalizer(self.pg + other.pg, self.kl + other.kl, self.entropy + other.entropy)

    @staticmethod
    def count(response_mask: torch.Tensor, selection: Selection, settings: LossSettings) -> LossNormalizer:
        """The divisors of the rows given for `selection` (its KL weights weigh the KL count) under `settings`."""
        denominator = denominator_mask(response_mask, selection.weights, selection.normalizer)
        selected = response_mask * selection.mask
        if settings.aggregation == "token-mean":
            kl_weights = 1.0 if selection.kl_weights is None else selection.kl_weights
            w_kl = (selected if settings.kl_masked else response_mask) * kl_weights
            w_entropy = selected if settings.entropy_masked else response_mask
            return LossNormalizer(float(denominator.sum()), float(w_kl.sum()), float(w_entropy.sum()))
        if settings.aggregation == "seq-mean-token-mean":
            kept = float((denominator.sum(1) > 0).sum())
            return LossNormalizer(kept, kept, kept)
        if settings.aggregation == "seq-mean-token-sum-norm":
            constant = float(response_mask.shape[0] * settings.response_budget)
            return LossNormalizer(constant, constant, constant)
        raise ValueError(f"algorithm.aggregation={settings.aggregation!r} is not one of {AGGREGATIONS}")


@dataclass
class LossOutput:
    """The loss share and, summed over the micro-batch's selected (non-zero weight) tokens, how many were clipped,
    dual-clipped and selected (for the clip fractions) and the surrogate's own metrics (`SurrogateTerms.metrics`)."""

    loss: torch.Tensor
    clipped_tokens: torch.Tensor
    selected_tokens: torch.Tensor
    dual_clipped_tokens: torch.Tensor
    metrics: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)


def policy_loss(inputs: LossInputs, normalizer: LossNormalizer, settings: LossSettings) -> LossOutput:
    """This micro-batch's share of the mini-batch loss (to minimise); summing shares gives the full loss.

    Per token (docs/algorithms.md §1.2, §1.4, §11.1): pg_t is the surrogate `settings.policy_loss` names
    (algorithms/surrogates.py: ppo, gspo, gspo_seq, cispo, dppo, sapo or one registered by user code, with its dual
    clip), then pg_t += β_t·|log π_θ − log π_old| (`inputs.drift_coef`, KL-Cov), pg_t ·= w_t (`inputs.is_weights`, the
    engine's importance weights, detached) and the token's weight (`inputs.weights`: 0/1 for a mask); kl_t =
    `kl_estimate` × `inputs.kl_weights`, times `settings.kl_coef`; the entropy bonus −α·H_t (`inputs.entropy`, with
    gradient; α = `settings.entropy_coef`). Each term is aggregated as `settings.aggregation` over `normalizer`'s
    divisors. A selection's ε (`inputs.clip_low` / `clip_high`) replaces `settings`' where it is set.
    """
    surrogate = get_surrogate(settings.policy_loss)
    if inputs.clip_low is None or inputs.clip_high is None:
        inputs = dataclasses.replace(
            inputs,
            clip_low=settings.clip_low if inputs.clip_low is None else inputs.clip_low,
            clip_high=settings.clip_high if inputs.clip_high is None else inputs.clip_high,
        )
    logp, weights, resp = inputs.logp, inputs.weights, inputs.response_mask.float()
    selected = inputs.selected
    w_pg = resp * weights.to(logp.dtype)
    kl_weights = inputs.kl_weights
    w_kl = (selected if settings.kl_masked else resp) * (1.0 if kl_weights is None else kl_weights.to(logp.dtype))
    w_entropy = selected if settings.entropy_masked else resp
    denominator = denominator_mask(inputs.response_mask, weights, inputs.normalizer)
    terms = surrogate(inputs, settings)
    pg = terms.pg
    if inputs.drift_coef is not None:
        pg = pg + inputs.drift_coef.to(pg.dtype) * (logp - inputs.old_logp).abs()
    if inputs.is_weights is not None:
        pg = pg * inputs.is_weights.to(pg.dtype).detach()
    parts = [(pg, w_pg, denominator, normalizer.pg)]
    if inputs.ref_logp is not None and settings.kl_coef > 0:
        kl = settings.kl_coef * kl_estimate(logp, inputs.ref_logp, settings.kl_estimator)
        parts.append((kl, w_kl, w_kl, normalizer.kl))
    if inputs.entropy is not None and settings.entropy_coef > 0:
        parts.append((-settings.entropy_coef * inputs.entropy, w_entropy, w_entropy, normalizer.entropy))
    loss = aggregate(parts, denominator, settings.aggregation)
    return LossOutput(
        loss,
        (terms.clipped * selected).sum().detach(),
        selected.sum().detach(),
        (terms.dual_clipped * selected).sum().detach(),
        {name: (value * selected).sum().detach() for name, value in terms.metrics.items()},
    )


def aggregate(
    terms: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]], denominator: torch.Tensor, aggregation: str
) -> torch.Tensor:
    """Σ over (per-token value, weight, per-row divisor mask, normaliser) terms of docs/algorithms.md §1.4: token-mean
    and seq-mean-token-sum-norm divide Σ_t value·weight by the normaliser; seq-mean-token-mean averages each row over
    its divisor mask first and sums the rows that have selected tokens."""
    if aggregation in ("token-mean", "seq-mean-token-sum-norm"):
        shares = [(value * weight).sum() / (norm if norm > 0 else 1.0) for value, weight, _, norm in terms]
        return reduce(torch.add, shares)
    if aggregation == "seq-mean-token-mean":  # a row whose divisor is 0 has nothing to divide
        per_seq = reduce(torch.add, [(v * w).sum(1) / torch.where(r.sum(1) > 0, r.sum(1), 1.0) for v, w, r, _ in terms])
        keep = denominator.sum(1) > 0
        return per_seq[keep].sum() / max(terms[0][3], 1.0)
    raise ValueError(f"algorithm.aggregation={aggregation!r} is not one of {AGGREGATIONS}")


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(π_θ ‖ π_ref) at the sampled token, d = ref − logp (Schulman 2020, "Approximating KL
    divergence"; verl's `kl_penalty`): `k1` = −d; `k2` = d²/2; `k3` = exp(d) − d − 1; `low_var_kl` = k3 with d clamped
    to ±20 and the result to [−10, 10] (verl)."""
    d = ref_logp - logp
    if estimator == "k1":
        return -d
    if estimator == "k2":
        return 0.5 * d * d
    if estimator == "k3":
        return torch.exp(d) - d - 1.0
    if estimator == "low_var_kl":
        d = d.clamp(-20.0, 20.0)
        return (torch.exp(d) - d - 1.0).clamp(-10.0, 10.0)
    raise ValueError(f"algorithm.kl_estimator={estimator!r} is not one of {KL_ESTIMATORS}")


def engine_is_weights(
    trainer_logp: torch.Tensor, engine_logp: torch.Tensor, response_mask: torch.Tensor, settings: EngineISSettings
) -> tuple[torch.Tensor, torch.Tensor]:
    """The engine→trainer importance weights of docs/algorithms.md §1.6/§11.13 and, per token, whether its ratio lies
    outside [floor, cap] (`settings`: tis_min, tis_cap, tis_mode). `token_*`: r_t = π_trainer(o_t)/π_engine(o_t);
    `sequence_*`: r_i = Π_t r_t = exp(Σ_t log r_t) over the row's response tokens, on every token of the row (TRL's
    `vllm_importance_sampling_mode`). `*_truncate`: w = clamp(r, floor, cap) (TIS: Yao et al. 2025, "Your Efficient
    RL Framework Secretly Brings You Off-Policy RL Training"; no floor when None); `*_mask`: w = r·[floor ≤ r ≤ cap]
    (IcePop / masked IS: TRL's `token_mask` / `sequence_mask`, OpenRLHF's `icepop`). Log-ratios (of a token, or of a
    row's sum) are clamped to ±20."""
    mode, cap, floor = settings.tis_mode, settings.tis_cap, settings.tis_min
    assert cap is not None  # the weights are on
    if mode not in TIS_MODES:
        raise ValueError(f"algorithm.tis_mode={mode!r} is not one of {TIS_MODES}")
    log_ratio = torch.where(response_mask.bool(), trainer_logp - engine_logp, 0.0)
    if mode.startswith("sequence"):
        log_ratio = log_ratio.sum(1, keepdim=True).expand_as(log_ratio)
    ratio = torch.exp(torch.clamp(log_ratio, -20.0, 20.0))
    outside = (ratio > cap) | (ratio < (0.0 if floor is None else floor))
    if mode.endswith("truncate"):
        return ratio.clamp(min=floor, max=cap), outside
    return torch.where(outside, 0.0, ratio), outside
